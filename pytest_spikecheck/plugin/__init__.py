"""The pytest plugin: options, marker, hooks and the ``spikecheck`` fixture. What it hands to CI
(JUnit properties, the job summary, the report page, progress) is in :mod:`.outputs`.

Loading it imports neither torch, cupy, matplotlib nor hypothesis: a repo that installs
pytest-spikecheck pays nothing until a test actually trains a scenario under ``--spikecheck``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_spikecheck.plugin.outputs import TerminalStream, append_job_summary, junit_properties, write_index
from pytest_spikecheck.plugin.session import Settings, SpikecheckSession

BACKEND_CHOICES = ("auto", "torch", "cupy", "emulator")
SKIP_REASON = "needs --spikecheck"
_SESSION = pytest.StashKey[SpikecheckSession]()
_RECORDER = pytest.StashKey["_Recorder"]()
_SCENARIOS_PROPERTY = "spikecheck_scenarios"


def parse_backend(text: str) -> str:
    if text not in BACKEND_CHOICES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(BACKEND_CHOICES)}, was {text!r}")
    return text


def parse_seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, was {text!r}") from None


def parse_device(text: str) -> str:
    if text not in ("cpu", "auto") and not text.startswith("cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda[:N] or auto, was {text!r}")
    return text


def parse_threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, was {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("spikecheck", "gradient-spike scenarios (pytest-spikecheck)")
    group.addoption("--spikecheck", action="store_true", default=None,
                    help="train the spikecheck scenarios and run their tests (otherwise they are skipped). "
                         "Default: ini spikecheck or False")
    group.addoption("--spikecheck-backend", metavar="NAME", type=parse_backend, default=None,
                    help="clipping backend: auto (cupy for CUDA tensors when usable, else torch), torch, cupy, "
                         "emulator. Default: ini spikecheck_backend or 'auto'")
    group.addoption("--spikecheck-device", metavar="DEVICE", type=parse_device, default=None,
                    help="torch device to train on: cpu, cuda[:N], auto. Default: ini spikecheck_device or 'cpu' "
                         "(thresholds are calibrated on CPU)")
    group.addoption("--spikecheck-report", metavar="DIR", default=None,
                    help="write panels, diagnoses and an index per scenario into DIR (runs are also cached there). "
                         "Default: ini spikecheck_report or none")
    group.addoption("--spikecheck-seed", metavar="N", type=parse_seed, default=None,
                    help="override every scenario's seed. Default: ini spikecheck_seed or the scenarios' own")
    group.addoption("--spikecheck-threads", metavar="N", type=parse_threads, default=None,
                    help="torch threads per training run (pinned for bit-identical reruns). Default: ini "
                         "spikecheck_threads or 1")
    parser.addini("spikecheck", type="bool", default=False, help="run spikecheck scenarios (as --spikecheck)")
    parser.addini("spikecheck_backend", default="auto", help="clipping backend (as --spikecheck-backend)")
    parser.addini("spikecheck_device", default="cpu", help="torch device (as --spikecheck-device)")
    parser.addini("spikecheck_report", default="", help="report directory (as --spikecheck-report)")
    parser.addini("spikecheck_seed", default="", help="seed override (as --spikecheck-seed)")
    parser.addini("spikecheck_threads", default="1", help="torch threads per run (as --spikecheck-threads)")


def _setting(config: pytest.Config, option: str, ini: str, parse: Any) -> Any:
    value = config.getoption(option)
    if value is not None:
        return value
    raw = config.getini(ini)
    if raw in ("", None):
        return None
    try:
        return parse(raw) if isinstance(raw, str) else raw
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"ini option {ini}: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spikecheck: trains spikecheck scenarios; skipped unless --spikecheck")
    report = _setting(config, "spikecheck_report", "spikecheck_report", str)
    settings = Settings(
        enabled=bool(_setting(config, "spikecheck", "spikecheck", bool)),
        backend=_setting(config, "spikecheck_backend", "spikecheck_backend", parse_backend) or "auto",
        device=_setting(config, "spikecheck_device", "spikecheck_device", parse_device) or "cpu",
        report_dir=Path(report).resolve() if report else None,
        seed=_setting(config, "spikecheck_seed", "spikecheck_seed", parse_seed),
        threads=_setting(config, "spikecheck_threads", "spikecheck_threads", parse_threads) or 1,
    )
    if settings.enabled:
        _refuse_unusable_settings(settings)
    config.stash[_SESSION] = SpikecheckSession(settings, **_worker_identity(config))
    recorder = _Recorder(config)
    config.stash[_RECORDER] = recorder
    config.pluginmanager.register(recorder, "spikecheck-recorder")


def _worker_identity(config: pytest.Config) -> dict[str, Any]:
    """On an xdist worker: the run's id (the same on every worker of one run) and the worker's."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return {}
    return {"session_id": workerinput["testrunuid"], "worker": workerinput["workerid"]}


def _progress(config: pytest.Config) -> Any:
    """Training progress: a bar per scenario on a terminal, a line per trained scenario in logs
    and on xdist workers, nothing with ``-q``."""
    from pytest_spikecheck.progress import Progress

    stream = TerminalStream(config)
    worker = getattr(config, "workerinput", {}).get("workerid")
    mode = "quiet" if config.get_verbosity() < 0 else ("lines" if worker else "auto")
    return Progress(stream, mode=mode, prefix=f"spikecheck [{worker}]: " if worker else "spikecheck: ")


def _refuse_unusable_settings(settings: Settings) -> None:
    """One usage error before any test runs, instead of the same error at every test's setup
    (a CUDA device on a CPU machine) or after training (a report path that is a file)."""
    if settings.report_dir is not None and settings.report_dir.exists() and not settings.report_dir.is_dir():
        raise pytest.UsageError(f"--spikecheck-report {settings.report_dir} is an existing file; it must be a folder")
    if settings.device != "cpu" or settings.backend not in ("auto", "torch"):
        from pytest_spikecheck.errors import ConfigError
        from pytest_spikecheck.training.launch import check_device_and_backend

        try:
            check_device_and_backend(settings.device, settings.backend)
        except ConfigError as exc:
            raise pytest.UsageError(f"spikecheck: {exc}") from None


def _cuda_device_present() -> bool:
    import torch  # the header is printed under --spikecheck only, where the runs import torch anyway

    return bool(torch.cuda.is_available())


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    session = config.stash[_SESSION]
    settings = session.settings
    if not settings.enabled:
        return None
    from pytest_spikecheck.clipping import unavailable_reason

    backend = session.backend  # resolves "auto" once: the header names what the runs will use
    cupy_note = unavailable_reason("cupy")
    seeds = f"all overridden to {settings.seed}" if settings.seed is not None else "the scenarios' own"
    lines = [f"spikecheck: backend {backend} (asked: {settings.backend}), device {settings.device}, "
             f"torch threads {settings.threads}, seeds {seeds}"]
    if cupy_note and (settings.backend == "cupy" or settings.device != "cpu" or _cuda_device_present()):
        # Why a CUDA machine is not using its kernels; on a CPU machine that is no news.
        lines.append(f"spikecheck: cupy backend unavailable: {cupy_note}")
    if settings.report_dir:
        lines.append(f"spikecheck: report and run cache in {settings.report_dir}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from pytest_spikecheck.plugin.fixtures import SCENARIO_FIXTURES, run_name

    enabled = config.stash[_SESSION].settings.enabled
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        names = getattr(item, "fixturenames", ())
        uses = "spikecheck" in names or item.get_closest_marker("spikecheck") is not None
        if not uses:
            continue
        if item.get_closest_marker("spikecheck") is None:
            item.add_marker(pytest.mark.spikecheck)
        callspec = getattr(item, "callspec", None)
        scenarios = [run_name(n, None if SCENARIO_FIXTURES[n] is None else SCENARIO_FIXTURES[n][callspec.indices[n]])
                     for n in names if n in SCENARIO_FIXTURES]
        if scenarios:
            # Travels with the test's reports (also from xdist workers to the controller,
            # where collection does not run) and shows in junitxml as a property.
            item.user_properties.append((_SCENARIOS_PROPERTY, ",".join(scenarios)))
        if not enabled:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spikecheck(request: pytest.FixtureRequest) -> SpikecheckSession:
    """The session's scenario runner: ``spikecheck.run(scenario)`` trains a
    :class:`~pytest_spikecheck.Scenario` (once per session; cached on disk under
    ``--spikecheck-report``) and returns its :class:`~pytest_spikecheck.Run`.

    Example::

        def test_my_model_survives_a_burst(spikecheck):
            run = spikecheck.run(Scenario.preset("phase-19").with_breaks(RareTokenBurst()))
            assert_clip_contains(run, max_norm=1.0)

    Tests that use it are skipped unless pytest runs with ``--spikecheck``.
    """
    session = request.config.stash[_SESSION]
    if not session.settings.enabled:
        pytest.skip(SKIP_REASON)
    if session.progress is None:  # now, not at configure time: the terminal reporter is up
        session.progress = _progress(request.config)
    if session.worker is not None and session.shared_dir is None:
        # xdist gives each worker basetemp/popen-gwN: the parent is this run's, shared by all workers
        session.shared_dir = request.getfixturevalue("tmp_path_factory").getbasetemp().parent
    return session


class _Recorder:
    """Session-long bookkeeping, registered as a plugin object in pytest_configure so that
    its hooks see the config: which tests used which scenario, their outcomes, the summary
    rows and counts (merged from xdist workers on the controller), and the outputs at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.outcomes: dict[str, list[str]] = {}
        self.worker_rows: dict[str, dict[str, Any]] = {}
        self.worker_counts: dict[str, int] = {}
        self.workers = False

    @property
    def session(self) -> SpikecheckSession:
        return self.config.stash[_SESSION]

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

    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        self.session.used_by_current_test.clear()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        # Link the test to the scenarios it trained through spikecheck.run(...) too, not only to
        # the @spikecheck_scenario fixtures it names (those are known from collection).
        used = self.session.used_by_current_test
        if used:
            props = dict(item.user_properties)
            names = set(filter(None, props.get(_SCENARIOS_PROPERTY, "").split(","))) | used
            item.user_properties[:] = [(k, v) for k, v in item.user_properties if k != _SCENARIOS_PROPERTY]
            item.user_properties.append((_SCENARIOS_PROPERTY, ",".join(sorted(names))))
        report = yield
        if self.session.settings.enabled and (call.when == "call" or (call.when == "setup" and not report.passed)):
            # JUnit XML takes a test's properties from its teardown report, which copies these.
            verdict = "FAIL" if report.failed else ("skipped" if report.skipped else "pass")
            names = dict(item.user_properties).get(_SCENARIOS_PROPERTY, "")
            for name in filter(None, names.split(",")):
                row = self.session.rows.get(name)
                item.user_properties += junit_properties(name, None if row is None else row.to_json(), verdict)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        scenarios = dict(report.user_properties).get(_SCENARIOS_PROPERTY)
        if not scenarios:
            return
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            outcome = "failed" if report.failed else ("skipped" if report.skipped else "passed")
            for name in scenarios.split(","):
                self.outcomes.setdefault(name, []).append(outcome)

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
        if _is_worker(self.config):
            self.config.workeroutput["spikecheck_rows"] = json.dumps(
                {name: row.to_json() for name, row in self.session.rows.items()})
            self.config.workeroutput["spikecheck_counts"] = json.dumps(dict(self.session.counts))
            return
        settings = self.session.settings
        rows = self.rows()
        if not settings.enabled or not rows:
            return
        verdicts, sentences = self.verdicts(), self.sentences(terminal=False)
        if settings.report_dir is not None:
            write_index(settings.report_dir, rows, verdicts, sentences)
        from pytest_spikecheck.report.summary import job_summary_markdown

        append_job_summary(job_summary_markdown(rows, verdicts, sentences))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if _is_worker(self.config) or not self.session.settings.enabled:
            return
        rows = self.rows()
        if not rows:
            return
        from pytest_spikecheck.judge.escape import terminal_text
        from pytest_spikecheck.judge.text import table
        from pytest_spikecheck.report.summary import HEADERS, cells

        tr = terminalreporter
        tr.section("spikecheck")
        for line in self.sentences():
            tr.write_line(line)
        for name, r in sorted(rows.items()):
            if r.get("not_cached_because"):
                tr.write_line(terminal_text(f"{name}: {r['not_cached_because']}."))
        verdicts = self.verdicts()
        tr.write_line(table(HEADERS, [cells(rows[name], verdicts[name]) for name in sorted(rows)]))
        if self.session.settings.report_dir:
            tr.write_line(f"report: {self.session.settings.report_dir / 'index.html'}")
