"""The pytest plugin: options, marker, hooks and the ``spikecheck`` fixture. What it hands to CI
(JUnit properties, the job summary, the report page, progress) is in :mod:`.outputs`.

Loading it imports neither torch, cupy, matplotlib nor hypothesis: a repo that installs
pytest-spikecheck pays nothing until a test actually trains a scenario under ``--spikecheck``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_spikecheck.plugin.outputs import SCENARIOS_PROPERTY, SessionRecorder, TerminalStream
from pytest_spikecheck.plugin.session import Settings, SpikecheckSession

BACKEND_CHOICES = ("auto", "torch", "cupy", "emulator")
SKIP_REASON = "needs --spikecheck"
_SESSION = pytest.StashKey[SpikecheckSession]()
_RECORDER = pytest.StashKey[SessionRecorder]()


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
    group.addoption(
        "--spikecheck",
        action="store_true",
        default=None,
        help="train the spikecheck scenarios and run their tests (otherwise they are skipped). Default: ini spikecheck or False",
    )
    group.addoption(
        "--spikecheck-backend",
        metavar="NAME",
        type=parse_backend,
        default=None,
        help="clipping backend: auto (cupy for CUDA tensors when usable, else torch), torch, cupy, "
        "emulator. Default: ini spikecheck_backend or 'auto'",
    )
    group.addoption(
        "--spikecheck-device",
        metavar="DEVICE",
        type=parse_device,
        default=None,
        help="torch device to train on: cpu, cuda[:N], auto. Default: ini spikecheck_device or 'cpu' "
        "(thresholds are calibrated on CPU)",
    )
    group.addoption(
        "--spikecheck-report",
        metavar="DIR",
        default=None,
        help="write panels, diagnoses and an index per scenario into DIR (runs are also cached there). "
        "Default: ini spikecheck_report or none",
    )
    group.addoption(
        "--spikecheck-seed",
        metavar="N",
        type=parse_seed,
        default=None,
        help="override every scenario's seed. Default: ini spikecheck_seed or the scenarios' own",
    )
    group.addoption(
        "--spikecheck-threads",
        metavar="N",
        type=parse_threads,
        default=None,
        help="torch threads per training run (pinned for bit-identical reruns). Default: ini spikecheck_threads or 1",
    )
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
    recorder = SessionRecorder(config, config.stash[_SESSION])
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
    """``torch.cuda.is_available()``, without importing torch where the answer is known: on Linux,
    no CUDA runtime finds a device without the driver's ``libcuda.so.1``. The header is printed
    by processes that train nothing (an xdist session's controller), where importing torch would
    cost its 2 CPU-s start-up for this one line (docs/testing.md, Suite time)."""
    if "torch" not in sys.modules and sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return False
    import torch

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
    lines = [
        f"spikecheck: backend {backend} (asked: {settings.backend}), device {settings.device}, "
        f"torch threads {settings.threads}, seeds {seeds}"
    ]
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
        scenarios = [
            run_name(n, None if SCENARIO_FIXTURES[n] is None else SCENARIO_FIXTURES[n][callspec.indices[n]])
            for n in names
            if n in SCENARIO_FIXTURES
        ]
        if scenarios:
            # Travels with the test's reports (also from xdist workers to the controller,
            # where collection does not run) and shows in junitxml as a property.
            item.user_properties.append((SCENARIOS_PROPERTY, ",".join(scenarios)))
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
