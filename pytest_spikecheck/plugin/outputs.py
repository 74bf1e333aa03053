"""What the plugin hands to CI and the terminal: the session's bookkeeping (:class:`SessionRecorder`:
which test used which scenario, each test's assertion verdicts and outcome, the summary rows,
merged from xdist workers), the terminal summary, JUnit XML properties per test (the scenarios'
measures and one property per assertion), the GitHub Actions job summary, the report folder's
index (``index.md``, ``index.html``), and training progress on the terminal while pytest
captures output. Imports nothing heavy at load."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pytest

if TYPE_CHECKING:
    from pytest_spikecheck.plugin.session import SpikecheckSession

#: The user property naming the scenarios a test used (comma-separated).
SCENARIOS_PROPERTY = "spikecheck_scenarios"

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
        values = {
            "content_hash": row.get("content_hash", ""),
            "spike_step": "" if row.get("spike_step") is None else str(row["spike_step"]),
            "spike_ratio": "" if not isinstance(ratio, (int, float)) or ratio != ratio else f"{ratio:.4g}",
            "clip_containment": row.get("containment", ""),
            "recovery_steps": "" if row.get("recovery_steps") is None else str(row["recovery_steps"]),
        }
        props += [(f"spikecheck_{key}", values[key]) for key in JUNIT_FIELDS if key != "verdict"]
    props.append(("spikecheck_verdict", verdict))
    return props


def verdict_properties(verdicts: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """One JUnit property per assertion the test made: ``spikecheck_assert_clip_contains`` =
    ``pass: <reason> [grad_norm_post 0.998 (limit 1) at step 30]``."""
    from pytest_spikecheck.judge.verdict import Verdict

    props = []
    for data in verdicts:
        v = Verdict.from_json(data)
        figures = v.figures()
        props.append((f"spikecheck_{v.assertion}", f"{v.outcome}: {v.reason}" + (f" [{figures}]" if figures else "")))
    return props


def reproduce_line(nodeid: str, settings: Any) -> str:
    """``pytest 'tests/test_x.py::test_y' --spikecheck``, with the session's backend and seed
    when they are not the defaults."""
    quoted = "'" + nodeid.replace("'", "'\"'\"'") + "'"
    return (
        f"pytest {quoted} --spikecheck"
        + (f" --spikecheck-backend {settings.backend}" if settings.backend != "auto" else "")
        + (f" --spikecheck-seed {settings.seed}" if settings.seed is not None else "")
    )


def headline(test: Mapping[str, Any]) -> str:
    """What a test's result says in one line: its failed assertion's reason, else its error's
    first line, else its last assertion's reason (or its outcome)."""
    failed = [v for v in test.get("verdicts", ()) if not v["passed"]]
    if failed:
        return f"{failed[0]['assertion']}: {failed[0]['reason']}"
    if test.get("failure"):
        return test["failure"]
    verdicts = test.get("verdicts") or []
    return "; ".join(f"{v['assertion']}: {v['reason']}" for v in verdicts) if verdicts else test.get("outcome", "")


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


def write_index(
    report_dir: Path,
    rows: Mapping[str, Mapping[str, Any]],
    verdicts: Mapping[str, str],
    sentences: list[str],
    tests: list[Mapping[str, Any]] = (),
) -> Path:
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
    return write_scenario_page(report_dir, rows, verdicts, sentences, tests)


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


class SessionRecorder:
    """Session-long bookkeeping, registered as a plugin object in pytest_configure so that
    its hooks see the config: which tests used which scenario, each test's assertion verdicts
    and outcome, the summary rows and counts (merged from xdist workers on the controller), and
    the outputs at the end (terminal, JUnit, job summary, report page)."""

    def __init__(self, config: pytest.Config, session: SpikecheckSession) -> None:
        self.config = config
        self.session = session
        self.outcomes: dict[str, list[str]] = {}
        #: nodeid -> {"nodeid", "scenarios", "outcome", "verdicts", "reproduce", "failure"}, in run order
        self.tests: dict[str, dict[str, Any]] = {}
        self.worker_rows: dict[str, dict[str, Any]] = {}
        self.worker_counts: dict[str, int] = {}
        self.workers = False
        self._verdicts: dict[str, list[Any]] = {}

    def rows(self) -> dict[str, dict[str, Any]]:
        rows = {name: row.to_json() for name, row in self.session.rows.items()}
        for name, row in self.worker_rows.items():
            rows.setdefault(name, row)
        return rows

    def counts(self) -> dict[str, int]:
        counts = dict(self.session.counts)
        for source, n in self.worker_counts.items():
            counts[source] = counts.get(source, 0) + n
        return counts

    def verdicts(self) -> dict[str, str]:
        from pytest_spikecheck.report.summary import verdict_of

        return {name: verdict_of(self.outcomes.get(name, [])) for name in self.rows()}

    def sentences(self, terminal: bool = True) -> list[str]:
        from pytest_spikecheck.report.summary import counts_sentences

        return counts_sentences(self.rows(), self.counts(), self.verdicts(), workers=self.workers, terminal=terminal)

    def test_results(self) -> list[dict[str, Any]]:
        """The tests that used a scenario or made an assertion, in the order they ran."""
        return sorted((t for t in self.tests.values() if t["scenarios"] or t["verdicts"]), key=lambda t: t["nodeid"])

    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        self.session.used_by_current_test.clear()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """Collect the verdicts of the assertions the test makes (failures reproduce the test)."""
        if not self.session.settings.enabled:
            return (yield)
        from pytest_spikecheck.judge.verdict import collecting

        with collecting(reproduce=reproduce_line(item.nodeid, self.session.settings)) as verdicts:
            self._verdicts[item.nodeid] = verdicts
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        # Link the test to the scenarios it trained through spikecheck.run(...) too, not only to
        # the @spikecheck_scenario fixtures it names (those are known from collection).
        used = self.session.used_by_current_test
        if used:
            props = dict(item.user_properties)
            names = set(filter(None, props.get(SCENARIOS_PROPERTY, "").split(","))) | used
            item.user_properties[:] = [(k, v) for k, v in item.user_properties if k != SCENARIOS_PROPERTY]
            item.user_properties.append((SCENARIOS_PROPERTY, ",".join(sorted(names))))
        report = yield
        if self.session.settings.enabled and (call.when == "call" or (call.when == "setup" and not report.passed)):
            verdicts = [v.to_json() for v in self._verdicts.pop(item.nodeid, [])]
            # Travels with the report (also from an xdist worker to the controller).
            report.spikecheck_verdicts = verdicts
            report.spikecheck_reproduce = reproduce_line(item.nodeid, self.session.settings)
            # JUnit XML takes a test's properties from its teardown report, which copies these.
            item.user_properties += verdict_properties(verdicts)
            verdict = "FAIL" if report.failed else ("skipped" if report.skipped else "pass")
            names = dict(item.user_properties).get(SCENARIOS_PROPERTY, "")
            for name in filter(None, names.split(",")):
                row = self.session.rows.get(name)
                item.user_properties += junit_properties(name, None if row is None else row.to_json(), verdict)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
            return
        scenarios = [n for n in (dict(report.user_properties).get(SCENARIOS_PROPERTY) or "").split(",") if n]
        outcome = "failed" if report.failed else ("skipped" if report.skipped else "passed")
        for name in scenarios:  # (an xfail counts as skipped for its scenario, as pytest counts it)
            self.outcomes.setdefault(name, []).append(outcome)
        verdicts = getattr(report, "spikecheck_verdicts", None)
        if verdicts is None and not scenarios:
            return
        crash = getattr(report.longrepr, "reprcrash", None) if report.failed else None
        failure = (
            (str(crash.message).splitlines() or [""])[0]
            if crash is not None
            else (str(report.longrepr).splitlines()[-1] if report.failed and report.longrepr else None)
        )
        if report.skipped and isinstance(report.longrepr, tuple):
            failure = str(report.longrepr[2])
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        self.tests[report.nodeid] = {
            "nodeid": report.nodeid,
            "scenarios": scenarios,
            "outcome": outcome,
            "verdicts": list(verdicts or []),
            "reproduce": getattr(report, "spikecheck_reproduce", None) or reproduce_line(report.nodeid, self.session.settings),
            "failure": failure,
        }

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: this session runs on workers (the summary counts their loads)."""
        self.workers = True

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: gather the summary rows and counts of each worker."""
        output = getattr(node, "workeroutput", {})
        for name, row in json.loads(output.get("spikecheck_rows", "{}")).items():
            # Prefer the row of the worker that trained it (the cells are the same either way).
            if name not in self.worker_rows or row.get("source") == "trained":
                self.worker_rows[name] = row
        for source, n in json.loads(output.get("spikecheck_counts", "{}")).items():
            self.worker_counts[source] = self.worker_counts.get(source, 0) + n

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            self.config.workeroutput["spikecheck_rows"] = json.dumps(
                {name: row.to_json() for name, row in self.session.rows.items()}
            )
            self.config.workeroutput["spikecheck_counts"] = json.dumps(dict(self.session.counts))
            return
        settings = self.session.settings
        rows, tests = self.rows(), self.test_results()
        if not settings.enabled or not (rows or tests):
            return
        verdicts, sentences = self.verdicts(), self.sentences(terminal=False) if rows else []
        if settings.report_dir is not None and rows:
            write_index(settings.report_dir, rows, verdicts, sentences, tests)
        from pytest_spikecheck.report.summary import job_summary_markdown

        append_job_summary(job_summary_markdown(rows, verdicts, sentences, tests))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput") or not self.session.settings.enabled:
            return
        rows, tests = self.rows(), self.test_results()
        if not rows and not tests:
            return
        from pytest_spikecheck.judge.escape import terminal_text
        from pytest_spikecheck.report.summary import summary_table, tests_lines

        tr = terminalreporter
        tr.section("spikecheck")
        if rows:  # the scenarios this session trained (tests may judge runs of their own: tests only)
            for line in self.sentences():
                tr.write_line(line)
            for name, r in sorted(rows.items()):
                if r.get("not_cached_because"):
                    tr.write_line(terminal_text(f"{name}: {r['not_cached_because']}."))
            tr.write_line(summary_table(rows, self.verdicts()))
        if tests:
            if rows:
                tr.write_line("")
            for line in tests_lines(tests, verbose=self.config.get_verbosity() > 0):
                tr.write_line(line)
        if self.session.settings.report_dir:
            tr.write_line(f"report: {self.session.settings.report_dir / 'index.html'}")
