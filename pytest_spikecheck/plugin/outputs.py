"""What the plugin hands to CI beside the terminal: JUnit XML properties per test, the GitHub
Actions job summary, the report folder's index (``index.md``, ``index.html``), and training
progress on the terminal while pytest captures output. Imports nothing heavy at load."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

import pytest

#: Each scenario a test used, as JUnit properties in this order (repeated per scenario).
JUNIT_FIELDS = ("content_hash", "spike_step", "spike_ratio", "clip_containment", "recovery_steps", "verdict")


def junit_properties(name: str, row: Mapping[str, Any] | None, verdict: str) -> list[tuple[str, str]]:
    """The JUnit properties of one scenario a test used: ``spikecheck_scenario`` (its name), then
    ``spikecheck_content_hash``, ``spikecheck_spike_step``, ``spikecheck_spike_ratio``,
    ``spikecheck_clip_containment``, ``spikecheck_recovery_steps`` (empty where there was no spike
    or no recovery) and ``spikecheck_verdict`` (this test's: pass, FAIL, skipped). A scenario
    whose training failed has only its name and verdict."""
    props = [("spikecheck_scenario", name)]
    if row is not None:
        ratio = row.get("spike_ratio")
        values = {"content_hash": row.get("content_hash", ""),
                  "spike_step": "" if row.get("spike_step") is None else str(row["spike_step"]),
                  "spike_ratio": "" if not isinstance(ratio, (int, float)) or ratio != ratio else f"{ratio:.4g}",
                  "clip_containment": row.get("containment", ""),
                  "recovery_steps": "" if row.get("recovery_steps") is None else str(row["recovery_steps"])}
        props += [(f"spikecheck_{key}", values[key]) for key in JUNIT_FIELDS if key != "verdict"]
    props.append(("spikecheck_verdict", verdict))
    return props


def append_job_summary(markdown: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append ``markdown`` to the file ``$GITHUB_STEP_SUMMARY`` names (GitHub Actions' job
    summary); nothing when it is unset or empty."""
    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return path


def write_index(report_dir: Path, rows: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str],
                sentences: list[str]) -> Path:
    """Record each scenario's verdict in its ``summary.json`` (known only now, after every test
    that used it), then write ``index.md`` and ``index.html``; return the page's path."""
    from pytest_spikecheck.report.page import write_scenario_page
    from pytest_spikecheck.report.summary import folder_name, index_markdown

    for name in rows:
        summary = report_dir / folder_name(name) / "summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            data["verdict"] = verdicts.get(name, "not run")
            summary.write_text(json.dumps(data, indent=2))
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "index.md").write_text(index_markdown(rows, verdicts))
    return write_scenario_page(report_dir, rows, verdicts, sentences)


class TerminalStream:
    """A text stream onto the terminal that works during a test, while pytest captures output:
    each write suspends capturing (as live logging does) and goes through the terminal reporter,
    starting a fresh line. On an xdist worker it is the worker's stderr, which the controller's
    terminal shows, in the middle of its line of dots: each line starts on a line of its own.
    Never a terminal there (two workers' bars would overwrite each other)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = hasattr(config, "workerinput")
        self.encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"  # tqdm draws unicode bars when it can

    def _reporter(self) -> Any:
        return None if self.worker else self.config.pluginmanager.get_plugin("terminalreporter")

    def isatty(self) -> bool:
        # TerminalReporter.isatty is a method since pytest 8.4.1, a bool before it
        isatty = getattr(self._reporter(), "isatty", False)
        return bool(isatty() if callable(isatty) else isatty)

    def write(self, text: str) -> int:
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter = self._reporter()
            if reporter is None:
                sys.stderr.write("\n" + text if self.worker else text)
                sys.stderr.flush()
            else:
                reporter.ensure_newline()
                reporter.write(text, flush=True)
        return len(text)

    def flush(self) -> None:
        pass
