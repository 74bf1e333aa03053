"""A run folder's ``run.json``: read, its format version checked, its facts decoded.

Shared by :class:`~pytest_spikecheck.records.run.Run` (which loads the whole folder) and the
log readers (which attach a run folder's facts to its metrics.jsonl, and must not import Run:
Run reads its metrics through them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records import integrity
from pytest_spikecheck.records.facts import FORMAT_VERSION, RunFacts, facts_from_format_1
from pytest_spikecheck.scenario import Scenario


def check_version(src: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`~pytest_spikecheck.errors.ConfigError` unless the run.json ``meta`` of the run
    folder ``src`` is a format this version reads (1, or :data:`FORMAT_VERSION`; no
    ``format_version``: 1). Checked first: a future format's manifest may not be one this code can check."""
    version = meta.get("format_version", 1)
    if version not in (1, FORMAT_VERSION):
        raise ConfigError(
            f"{src / 'run.json'}: format_version {version!r} is not one this pytest-spikecheck reads "
            f"(1 or {FORMAT_VERSION}); upgrade pytest-spikecheck to read it"
        )


def scenario_and_facts(src: Path, meta: dict[str, Any]) -> tuple[Scenario | None, RunFacts]:
    """The scenario that retrains the run saved in ``src`` (None for a recorded or hand-written run)
    and how it was trained, from its run.json ``meta`` (whose ``format_version`` and ``facts`` it pops)."""
    version = meta.pop("format_version", 1)
    raw_facts = meta.pop("facts", None)
    # an engine run's config.yaml retrains it; a recorded or hand-written run has none
    scenario = Scenario.from_yaml(src / "config.yaml") if (src / "config.yaml").is_file() and not meta.get("recorded") else None
    if version == 1:  # upgraded in memory, judged the same
        return scenario, facts_from_format_1(meta, scenario)
    return scenario, RunFacts.from_json(raw_facts, where=f"{src / 'run.json'} facts")


def read_run_facts(directory: str | Path) -> RunFacts:
    """How the run saved in ``directory`` was trained (its run.json ``facts``), without reading its
    metrics: what a log reader attaches when it reads the folder's metrics.jsonl."""
    src = Path(directory)
    meta = read_meta(src / "run.json")
    check_version(src, meta)
    if meta.get("format_version", 1) != 1:
        # format 2 states its facts: the config.yaml beside them is not read (one written by another
        # version of this package must not refuse a folder whose metrics and facts are readable)
        return RunFacts.from_json(meta.get("facts"), where=f"{src / 'run.json'} facts")
    return scenario_and_facts(src, meta)[1]


def read_meta(path: Path) -> dict[str, Any]:
    """The JSON object in the run.json at ``path`` ({} when there is none); a file that is not
    valid JSON, or holds no object, is refused as a damaged run folder (:func:`.integrity.refuse`)."""
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise integrity.refuse(path.parent, f"run.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise integrity.refuse(path.parent, f"run.json holds a JSON {type(meta).__name__}, not an object")
    return meta
