"""Validate a run folder against the published JSON Schema (docs/run-schema.json); a plain
module the tests that write run folders import (engine runs, recorded runs, folders by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "run-schema.json"


def validate_run_folder(folder: Path) -> None:
    """run.json, every line of metrics.jsonl and events.json (where the folder has one) against
    their parts of the schema (jsonschema raises)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    parts = schema["properties"]
    jsonschema.Draft202012Validator(parts["run.json"]).validate(json.loads((folder / "run.json").read_text()))
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    jsonschema.Draft202012Validator(parts["metrics.jsonl"]).validate(rows)
    if (folder / "events.json").is_file():
        jsonschema.Draft202012Validator(parts["events.json"]).validate(json.loads((folder / "events.json").read_text()))
