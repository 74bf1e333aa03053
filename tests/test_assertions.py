import json
import math
import subprocess
import sys


import numpy as np
import pytest

from pytest_spikecheck.records.facts import ModelFacts, RunFacts
from pytest_spikecheck import (
    SpikeCheckError,
    assert_clip_contains,
    assert_diverges,
    assert_finite,
    assert_no_lockin,
    assert_no_spike,
    assert_recovers,
    assert_spike,
)

from pytest_spikecheck.records import Record, Run
from pytest_spikecheck.judge.analysis import column, largest_spike, recovery_steps, spike_ratio, value_at
from pytest_spikecheck.records import as_record
from pytest_spikecheck.records.series import MetricColumns, columns_from_mapping
from short_runs import SHORT_BURST


@pytest.fixture(autouse=True)
def _outside_a_plugin_test(monkeypatch):
    """The failure texts here are the library's, outside a plugin-collected test: under
    ``pytest --spikecheck`` the plugin's reproduce line (this test's own id) would replace the
    run's (tests/plugin/test_results.py checks that one)."""
    monkeypatch.setattr("pytest_spikecheck.judge.evidence.current_reproduce", lambda: None)


def _flat(n=200, level=1.0):
    return list(level + 0.01 * np.sin(np.arange(n)))


def test_spike_on_plain_arrays_without_torch():
    code = (
        "import sys\nfrom pytest_spikecheck import assert_spike\n"
        "assert_spike({'grad_norm_pre': [1.0] * 60 + [30.0]}, min_ratio=10)\n"
        "import pytest_spikecheck.integrations\n"
        "print(sorted(m for m in ('torch', 'cupy', 'matplotlib', 'hypothesis', 'transformers', 'lightning') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_assert_spike_messages_carry_step_ratio_and_evidence():
    g = _flat()
    g[150] = 3.0
    with pytest.raises(SpikeCheckError) as info:
        assert_spike({"grad_norm_pre": g, "loss": _flat(level=2.0)}, at=151, min_ratio=10)
    text = str(info.value)
    assert "≥ 10× at step 151" in text and "3.0" in text  # requested ratio, step, measured ratio
    assert "→ 151" in text and "grad_norm_pre:" in text  # table row marker and sparkline
    assert "diagnosis at step 151" in text


def test_assert_spike_anywhere_and_missing_step():
    g = _flat()
    g[120] = 25.0
    assert assert_spike({"grad_norm_pre": g}) == pytest.approx(25.0, rel=0.02)
    with pytest.raises(SpikeCheckError, match="no step 999"):
        assert_spike({"grad_norm_pre": g}, at=999)
    with pytest.raises(SpikeCheckError, match="has no 'grad_norm_pre' series"):
        assert_spike({"loss": g})


def test_logs_that_call_it_grad_norm_work():
    g = _flat()
    g[100] = 50.0
    assert assert_spike({"grad_norm": g}, at=101) > 10


def test_assert_no_spike_with_named_detectors():
    assert_no_spike({"grad_norm_pre": _flat()})
    g = _flat()
    g[100] = 9.0
    with pytest.raises(SpikeCheckError, match=r"zclip\(.*\) flagged a grad_norm_pre spike at step 101"):
        assert_no_spike({"grad_norm_pre": g}, detector="zclip")
    assert_no_spike({"grad_norm_pre": g}, detector="ratio", threshold=20)


def test_clip_containment_on_runs(short_runs):
    control, broken = short_runs
    assert_clip_contains(control, 1.0)
    with pytest.raises(SpikeCheckError) as info:
        assert_clip_contains(broken, 1.0)
    assert f"at step {SHORT_BURST}" in str(info.value) or "worst" in str(info.value)


@pytest.mark.parametrize(
    "record",
    [
        {"grad_norm_post": [math.nan, math.nan]},
        {"grad_norm_pre": [math.nan, math.inf], "grad_norm_post": [math.nan, math.nan]},
        {"grad_norm_post": [None, None]},
    ],
)
def test_a_record_with_no_finite_norm_shows_nothing_and_fails(record):
    """Nothing finite before or after the clip: no value shows the clip held, so the check cannot pass."""
    message = _headline(assert_clip_contains, record, 1.0)
    assert message.startswith("no finite grad_norm_post in the record (2 steps), and no finite grad_norm_pre either")


def test_no_finite_norm_in_a_one_step_record_says_one_step():
    assert _headline(assert_clip_contains, {"grad_norm_post": [math.nan]}, 1.0).startswith(
        "no finite grad_norm_post in the record (1 step), and no finite grad_norm_pre either"
    )


def test_the_float32_hint_reaches_exactly_the_drift_and_the_table_points_at_the_worst_step():
    at_the_drift = {"grad_norm_post": [0.5, 1.0 + 1e-3, 1.0, 0.9]}  # exactly max_norm * (1 + FLOAT32_NORM_DRIFT)
    assert "is float32 rounding" in _headline(assert_clip_contains, at_the_drift, 1.0)
    with pytest.raises(SpikeCheckError) as info:
        assert_clip_contains({"grad_norm_post": [0.5, 1.5, 0.8, 3.0, 0.9]}, 1.0)
    assert "is float32 rounding" not in str(info.value)
    assert [line.split()[1] for line in str(info.value).splitlines() if line.lstrip().startswith("→")] == ["4"]


def test_a_non_finite_step_after_finite_ones_is_not_blamed_on_the_clip():
    assert_clip_contains({"grad_norm_pre": [2.0, math.nan], "grad_norm_post": [1.0, math.nan]}, 1.0)


def test_clip_containment_catches_nan_post_clip():
    with pytest.raises(SpikeCheckError, match="did not contain"):
        assert_clip_contains({"grad_norm_pre": [2.0, 2.0], "grad_norm_post": [1.0, math.nan]}, 1.0)


def test_recovery_from_a_run_and_against_a_reference(short_runs):
    control, broken = short_runs
    took = assert_recovers(broken, within=30)
    assert took > 0
    assert assert_recovers(control, within=30) == 0
    with pytest.raises(SpikeCheckError, match="did not recover within 1 steps"):
        assert_recovers(broken, within=1)
    assert assert_recovers(broken, within=30, reference=control, factor=1.2) <= 30


def test_divergence_and_finiteness():
    loss = [2.0] * 50 + [math.nan]
    assert assert_diverges({"loss": loss}) == 51
    with pytest.raises(SpikeCheckError, match="non-finite loss at step 51"):
        assert_finite({"loss": loss})
    with pytest.raises(SpikeCheckError, match="expected the run to diverge"):
        assert_diverges({"loss": [2.0] * 10})
    assert_finite({"loss": [2.0] * 10})


def test_metrics_jsonl_with_missing_and_non_finite_values(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 2.0, "eval_loss": (1.5 if s % 10 == 0 else None)} for s in range(1, 40)]
    rows.append({"step": 40, "loss": float("nan")})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(SpikeCheckError, match="non-finite loss at step 40"):
        assert_finite(path)  # the missing eval rows are not counted as NaN
    rows[-1]["loss"] = 2.0
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert_finite(path)


def test_run_folders_are_accepted(short_runs, tmp_path):
    short_runs[1].save(tmp_path / "broken")
    assert assert_spike(tmp_path / "broken", at=SHORT_BURST, min_ratio=5) > 5


# -- plain arrays: numbering and shape -------------------------------------------------------


def _spike_at_index(index: int, n: int = 100) -> np.ndarray:
    g = np.ones(n)
    g[index] = 20.0
    return g


def test_arrays_without_a_step_column_are_numbered_from_1_and_a_miss_by_one_says_so():
    data = {"grad_norm_pre": _spike_at_index(60)}
    assert assert_spike(data, at=61) == 20.0
    with pytest.raises(SpikeCheckError, match=r"the spike is at step 61; arrays without a step column are numbered from 1"):
        assert_spike(data, at=60)


def test_steps_can_be_given_explicitly():
    from pytest_spikecheck.records import as_record

    record = as_record({"grad_norm_pre": _spike_at_index(60)}, steps=np.arange(100))
    assert assert_spike(record, at=60) == 20.0
    with pytest.raises(SpikeCheckError, match=r"the spike is at step 60\b") as info:
        assert_spike(record, at=59)
    assert "numbered from 1" not in str(info.value).splitlines()[0]
    with pytest.raises(ValueError, match="steps given twice"):
        as_record({"step": np.arange(100), "grad_norm_pre": _spike_at_index(60)}, steps=np.arange(100))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"grad_norm_pre": np.ones((10, 2))}, r"'grad_norm_pre' is a 2-D array of shape \(10, 2\)"),
        ({"grad_norm_pre": [1.0, 2.0, 3.0], "step": [1, 1, 2]}, "holds step 1 more than once"),
        ({"grad_norm_pre": [1.0, 2.0, 3.0], "step": [1, 1.5, 2]}, "must hold integers, has 1.5"),
    ],
)
def test_malformed_arrays_are_one_line_errors(data, message):
    with pytest.raises(ValueError, match=message) as info:
        assert_spike(data)
    assert "\n" not in str(info.value)


def test_a_length_1_record_says_why_no_ratio_exists():
    with pytest.raises(SpikeCheckError, match="no value has a baseline: 1 logged"):
        assert_spike({"grad_norm_pre": [1.0]})
    with pytest.raises(SpikeCheckError, match="step 1 has 0 earlier points, and a baseline needs 10"):
        assert_spike({"grad_norm_pre": [1.0]}, at=1)


def test_missing_is_not_nan_in_plain_arrays():
    # None in a list means "not logged": no failure, and shown as — ; a real NaN fails and shows nan.
    assert_finite({"loss": [2.0, None, 2.0]})
    with pytest.raises(SpikeCheckError, match=r"non-finite loss at step 2 \(nan\)") as info:
        assert_finite({"loss": [2.0, math.nan, 2.0], "eval_loss": [None, None, 1.5]})
    table_row = next(line for line in str(info.value).splitlines() if line.startswith("→ 2"))
    assert table_row.split() == ["→", "2", "nan", "—"]
    with pytest.raises(SpikeCheckError, match=r"non-finite loss at step 3 \(inf\)"):
        assert_finite({"loss": [2.0, None, math.inf]})
    assert assert_diverges({"loss": [2.0, None, math.inf]}) == 3
    with pytest.raises(SpikeCheckError, match="every value is finite"):
        assert_diverges({"loss": [2.0, None, 2.0]})


def test_run_metrics_mark_what_was_not_evaluated(short_runs, tmp_path):
    control = short_runs[0]
    assert np.isnan(control.metrics["eval_loss"]).any()  # evaluated every few steps only
    assert_finite(control.metrics)  # the engine's own dict, as assert_finite(control) judges it
    assert_finite(control)
    reloaded = Run.load(control.save(tmp_path / "control"))
    assert_finite(reloaded.metrics)
    np.testing.assert_array_equal(reloaded.metrics.missing["eval_loss"], control.metrics.missing["eval_loss"])
    # a real NaN in a metric the engine logs at every step still fails
    loss = np.where(control.metrics["step"] == 5, np.nan, control.metrics["loss"])
    broken = MetricColumns({**control.metrics, "loss": loss}, control.metrics.missing)
    with pytest.raises(SpikeCheckError, match="non-finite loss at step 5"):
        assert_finite(broken)


def test_assert_spike_default_is_ten_times_the_baseline():
    # A surviving mutant (10 -> 11) showed no test pinned the default threshold.
    assert assert_spike({"grad_norm_pre": [1.0] * 60 + [10.5]}) == pytest.approx(10.5)
    with pytest.raises(SpikeCheckError, match="≥ 10×"):
        assert_spike({"grad_norm_pre": [1.0] * 60 + [9.5]})


# -- what a failure says, word for word (each check below was a surviving mutant) --------------


def _headline(call, *args, **kwargs) -> str:
    with pytest.raises(SpikeCheckError) as info:
        call(*args, **kwargs)
    return str(info.value).split("\n\n")[0]


def _failure(call, *args, **kwargs) -> str:
    with pytest.raises(SpikeCheckError) as info:
        call(*args, **kwargs)
    return str(info.value)


def _spiked(n=100, at=61, size=40.0, level=1.0):
    g = np.full(n, level)
    g[at - 1] = size
    return g


def test_assert_diverges_reads_every_norm_column_and_frames_the_evidence_on_the_event():
    # a NaN in the pre-clip norm (or HF's grad_norm) is a divergence, even with a finite loss
    assert assert_diverges({"loss": [2.0] * 31, "grad_norm_pre": [1.0] * 30 + [math.inf]}) == 31
    assert assert_diverges({"grad_norm": [1.0] * 5 + [math.nan]}) == 6
    # all finite: the table is centred on the event (the largest spike, or at=), the sparkline is the loss's
    text = _failure(assert_diverges, {"grad_norm_pre": _spiked(), "loss": np.full(100, 2.0)})
    assert text.splitlines()[0] == ("expected the run to diverge (a NaN or inf loss or gradient norm), but every value is finite")
    assert "→ 61" in text and any(line.startswith("loss: ▁") for line in text.splitlines())
    assert "→ 40" in _failure(assert_diverges, {"grad_norm_pre": _spiked(), "loss": np.full(100, 2.0)}, at=40)
    # without a loss column, the first metric stands in for it
    text = _failure(assert_diverges, {"clip_factor": np.ones(100), "grad_norm_pre": _spiked()})
    assert any(line.startswith("clip_factor: ") for line in text.splitlines()) and "→ 61" in text
    assert "→" not in _failure(assert_diverges, {"loss": np.full(100, 2.0)})  # no norm: no event to centre on
    # within: counted from the event (the spike at 61); the NaN at 70 is 9 steps after it
    diverged = {"grad_norm_pre": np.concatenate([_spiked()[:69], [math.nan] * 31]), "loss": np.full(100, 2.0)}
    assert assert_diverges(diverged, within=9) == 70
    text = _failure(assert_diverges, diverged, within=8)
    assert text.splitlines()[0] == "the run diverged at step 70, more than 8 steps after the event at step 61"
    assert "diagnosis at step" not in text and "→ 70" in text
    assert assert_diverges(diverged, within=5, at=66) == 70


ASSERTIONS_THAT_FAIL = [
    (assert_spike, ({"grad_norm_pre": np.ones(60)},), {"at": 55}),
    (assert_no_spike, ({"grad_norm_pre": _spiked()},), {}),
    (assert_clip_contains, ({"grad_norm_post": [0.5, 2.0]}, 1.0), {}),
    (assert_recovers, ({"grad_norm_pre": _spiked(), "loss": np.where(np.arange(100) >= 60, 9.0, 2.0)},), {}),
    (assert_diverges, ({"loss": [2.0] * 10},), {}),
    (assert_finite, ({"loss": [2.0, math.nan]},), {}),
]


@pytest.mark.parametrize(("call", "args", "kwargs"), ASSERTIONS_THAT_FAIL, ids=lambda v: getattr(v, "__name__", ""))
def test_a_failure_points_at_the_callers_line_not_the_librarys(call, args, kwargs):
    # pytest hides frames that set __tracebackhide__: the user sees the line that called the assertion.
    with pytest.raises(SpikeCheckError) as info:
        call(*args, **kwargs)
    shown = [str(entry.statement) for entry in info.traceback.filter(info)]
    assert not [s for s in shown if "_fail(" in s or "raise SpikeCheckError" in s], shown


def test_assert_spike_headlines():
    flat = np.ones(100)
    assert _headline(assert_spike, {"grad_norm_pre": flat}, at=70, min_ratio=2.5) == (
        "expected a grad_norm_pre spike of ≥ 2.5× at step 70, got 1.00× the median of the 50 steps before"
    )
    assert _headline(assert_spike, {"grad_norm_pre": flat}, min_ratio=2.5, window=20) == (
        "expected a grad_norm_pre spike of ≥ 2.5× anywhere (largest: step 11), got 1.00× the median of the 20 steps before"
    )
    assert (
        _headline(assert_spike, {"grad_norm_pre": flat}, at=500)
        == "no spike at step 500: the record has no step 500 (it covers 1–100)"
    )
    assert _headline(assert_spike, {"loss": [2.0] * 9}, metric="loss") == (
        "expected a loss spike of ≥ 10×, but no value has a baseline: 9 logged, fewer than the 10 earlier points a baseline needs"
    )
    # exactly min_ratio passes; the window is the caller's: 20 steps into a plateau at 40, the
    # 50 steps before still have median 1, the 12 steps before are the plateau itself
    assert assert_spike({"grad_norm_pre": _spiked(size=4.0)}, at=61, min_ratio=4.0) == 4.0
    plateau = np.ones(100)
    plateau[70:90] = 40.0
    assert assert_spike({"grad_norm_pre": plateau}, at=90) == 40.0
    with pytest.raises(SpikeCheckError, match="≥ 10× at step 90, got 1.00× the median of the 12 steps before"):
        assert_spike({"grad_norm_pre": plateau}, at=90, window=12)


@pytest.mark.parametrize(
    ("data", "at", "hint"),
    [
        ({"grad_norm_pre": np.ones(5)}, 5, "; step 5 has 4 earlier points, and a baseline needs 10"),
        ({"grad_norm_pre": np.ones(5)}, 2, "; step 2 has 1 earlier point, and a baseline needs 10"),
        ({"grad_norm_pre": np.ones(11)}, 10, "; step 10 has 9 earlier points, and a baseline needs 10"),
        ({"grad_norm_pre": np.ones(12)}, 11, ""),  # 10 earlier points: a baseline, no hint
        ({"grad_norm_pre": _spiked(at=61)}, 60, "; the spike is at step 61; arrays without a step column are numbered from 1"),
        ({"grad_norm_pre": _spiked(at=61)}, 62, "; the spike is at step 61; arrays without a step column are numbered from 1"),
        ({"grad_norm_pre": _spiked(at=61)}, 63, ""),  # two steps off: no guess
        (
            {"grad_norm_pre": _spiked(at=61, size=10.0)},
            60,
            "; the spike is at step 61; arrays without a step column are numbered from 1",
        ),
        ({"grad_norm_pre": _spiked(at=61, size=9.9)}, 60, ""),
        ({"step": np.arange(100), "grad_norm_pre": _spiked(at=61)}, 61, "; the spike is at step 60"),
    ],
)
def test_a_near_miss_says_where_the_spike_is(data, at, hint):
    headline = _headline(assert_spike, data, at=at)
    assert headline.endswith(f"the median of the 50 steps before{hint}"), headline


def test_assert_no_spike_headlines():
    g = _spiked()
    g[[70, 72, 74, 76, 78, 80, 82]] = 50.0
    assert _headline(assert_no_spike, {"grad_norm_pre": g}) == (
        "ratio(threshold=5.0, window=50, min_history=10) flagged a grad_norm_pre spike at step 61: 40 vs baseline 1 "
        "(score 40.00×) (and 7 more: steps 71, 73, 75, 77, 79…)"
    )
    assert _headline(assert_no_spike, {"grad_norm_pre": _spiked(size=6.5)}) == (
        "ratio(threshold=5.0, window=50, min_history=10) flagged a grad_norm_pre spike at step 61: 6.5 vs baseline 1 "
        "(score 6.50×)"
    )
    two = _spiked()
    two[70] = 30.0
    assert _headline(assert_no_spike, {"loss": two}, detector="ratio", threshold=20) == (
        "ratio(threshold=20, window=50, min_history=10) flagged a loss spike at step 61: 40 vs baseline 1 "
        "(score 40.00×) (and 1 more: steps 71)"
    )


@pytest.mark.parametrize(
    ("post", "kwargs", "headline"),
    [
        (
            {"grad_norm_post": [0.5, 2.0, 1.5, 3.0, 1.0]},
            {},
            "post-clip norm 2 > max_norm 1 at step 2 (3 steps over; worst 3 at step 4)",
        ),
        ({"grad_norm_post": [0.5, 1.0 + 1e-5, 1.0]}, {}, None),  # inside the default rtol
        (
            {"grad_norm_post": [0.5, 1.0 + 1.1e-5, 1.0]},
            {},
            "post-clip norm 1 > max_norm 1 at step 2 (1 step over; worst 1 at step 2)"
            "; an overshoot of at most 0.001 is float32 rounding in the clip's own norm (torch's CPU norm of one tensor of "
            "millions of elements drifts that much): pass rtol=0.001 if that is what you see",
        ),
        (
            {"grad_norm_post": [0.5, 1.0011, 1.0]},
            {},
            "post-clip norm 1.001 > max_norm 1 at step 2 (1 step over; worst 1.001 at step 2)",
        ),
        ({"grad_norm_post": [0.5, 1.5, 1.0]}, {"rtol": 0.5}, None),
        (
            {"grad_norm_pre": [2.0, 2.0, math.nan], "grad_norm_post": [1.0, math.nan, math.nan]},
            {},
            "post-clip norm nan > max_norm 1 at step 2 (1 step over; worst nan at step 2)",
        ),  # NaN after a finite pre: broken
        (
            {"grad_norm_post": [1.0, math.nan, math.inf]},
            {},
            "post-clip norm inf > max_norm 1 at step 3 (1 step over; worst inf at step 3)",
        ),
        (
            {"step": [5, 6, 7], "grad_norm_post": [2.0, 1.0, math.inf]},
            {},
            "post-clip norm 2 > max_norm 1 at step 5 (2 steps over; worst inf at step 7)",
        ),
    ],
)
def test_assert_clip_contains_headlines(post, kwargs, headline):
    if headline is None:
        assert_clip_contains(post, 1.0, **kwargs)
    else:
        assert _headline(assert_clip_contains, post, 1.0, **kwargs) == f"the clip did not contain the gradient: {headline}"


def test_assert_recovers_counts_from_the_event_and_says_against_what():
    loss = np.full(100, 2.0)
    loss[60:70] = 5.0  # steps 61-70 high after the spike at 61: back at step 71, 10 steps on
    data = {"grad_norm_pre": _spiked(), "loss": loss}
    assert assert_recovers(data, within=10) == 10
    assert assert_recovers({**data, "eval_loss": np.full(100, np.nan)}, within=10) == 10  # no eval: the loss
    assert _headline(assert_recovers, data, within=9) == (
        "loss did not recover within 9 steps of step 61: not back within 1.1× its pre-event mean"
    )
    assert _headline(assert_recovers, data, within=40, at=30, factor=1.25) == (
        "loss did not recover within 40 steps of step 30: not back within 1.25× its pre-event mean"
    )
    reference = {"loss": np.full(100, 2.0)}
    assert assert_recovers(data, within=10, reference=reference, factor=1.5) == 10
    assert assert_recovers(data, within=10, reference={"loss": np.full(100, 4.0)}, factor=1.5) == 0
    assert _headline(assert_recovers, data, within=9, reference=reference, factor=1.5) == (
        "loss did not recover within 9 steps of step 61: not back within 1.5× the reference run"
    )
    assert _headline(assert_recovers, {"loss": [2.0, 2.0]}) == (
        "no event to recover from: no declared burst and no spike in the record"
    )


class _FakeRun:
    """What the assertions read of an engine Run besides its metrics."""

    def __init__(self, meta=None, declared=(), stopped_early=False, model_factory_path=None):
        self.meta, self.declared_events, self.stopped_early = meta or {}, tuple(declared), stopped_early
        self.facts = RunFacts(source="engine", model=ModelFacts(arch=model_factory_path or "gpt"), seed=0)

    def event_at(self, step):
        return None

    def batch_at(self, step):
        return None

    def reproduce_command(self):
        return "spikecheck train fake.yaml --seed 7"


def _with_run(run, metrics=None):
    metrics = metrics or {"grad_norm_pre": _spiked(), "loss": np.full(100, 2.0)}
    return Record({"step": np.arange(1, 101), **metrics}, run, "run fake")


def test_engine_runs_add_their_declared_event_first_nonfinite_tensor_and_reproduce_command():
    # the declared event, not the largest spike, is what recovery is counted from
    loss = np.full(100, 2.0)
    loss[60:70] = 5.0
    assert assert_recovers(_with_run(_FakeRun(declared=(65, 90)), {"grad_norm_pre": _spiked(), "loss": loss}), within=10) == 6
    text = _failure(
        assert_finite,
        _with_run(
            _FakeRun(meta={"first_nonfinite": {"tensor": "h.0.attn", "module": "Block"}}),
            {"loss": np.where(np.arange(100) == 49, np.nan, 2.0)},
        ),
    )
    assert text.splitlines()[0] == "non-finite loss at step 50 (nan); first non-finite tensor: h.0.attn in Block at step 50"
    assert "reproduce: spikecheck train fake.yaml --seed 7" in text and text.endswith("record: run fake")
    assert "diagnosis at step" not in text and "loss: " in text


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (None, "it has no greedy samples (only runs trained by the engine do)"),
        (_FakeRun(stopped_early=True), "the run stopped early"),
        (
            _FakeRun(model_factory_path="my.models:make"),
            "the engine records greedy samples for the built-in GPT only, and this "
            "run trained your own model (my.models:make); sample it yourself and check the output",
        ),
    ],
)
def test_lockin_cannot_be_checked_without_samples(run, reason):
    with pytest.raises(SpikeCheckError) as info:
        assert_no_lockin(_with_run(run))
    assert str(info.value) == f"cannot check lock-in on run fake: {reason}"


def test_lockin_limits():
    def stats(share, distinct):
        return _with_run(
            _FakeRun(
                meta={
                    "lockin": {
                        "top_token": "the",
                        "top_token_share": share,
                        "distinct_2": distinct,
                        "samples": ["the the", "the cat"],
                    }
                }
            )
        )

    assert_no_lockin(stats(0.5, 0.1))  # at the limits: no lock-in
    with pytest.raises(SpikeCheckError) as info:
        assert_no_lockin(stats(0.51, 0.09))
    assert str(info.value) == (
        "repetition lock-in: token 'the' is 51% of the greedy output (limit 50%); distinct-2 is "
        "0.090 (limit 0.1)\n\ngreedy samples:\n  'the the'\n  'the cat'\n\nrecord: run fake"
    )
    with pytest.raises(SpikeCheckError, match=r"^repetition lock-in: distinct-2 is 0.200 \(limit 0.25\)\n"):
        assert_no_lockin(stats(0.6, 0.2), max_top_share=0.7, min_distinct_2=0.25)


# -- records from arrays (pytest_spikecheck.records.series and .convert) -------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"loss": [1.0, 2.0], "x": [1.0]}, "metric 'x' has 1 values but the others have 2"),
        ({"loss": [1.0, 2.0], "step": ["a", "b"]}, "the step column must hold integers, was ['a', 'b']…"),
        ({"loss": [1.0, 2.0], "step": [1, math.nan]}, "the step column holds non-finite values"),
        ({"loss": [1.0] * 4, "step": [1, 2, 3, 3]}, "the step column holds step 3 more than once; steps must be distinct"),
        (
            {"loss": [[1.0], [2.0]]},
            "metric 'loss' is a 2-D array of shape (2, 1); give one value per step (a 1-D array), e.g. one column of it",
        ),
    ],
)
def test_bad_columns_are_named_word_for_word(data, message):
    with pytest.raises(ValueError) as info:
        columns_from_mapping(data)
    assert str(info.value) == message


def test_none_is_not_logged_and_nan_is_a_value():
    columns, missing = columns_from_mapping(
        {"loss": [1.0, None, math.nan], "lr": (0.1, None, 0.1), "gn": np.array([1.0, np.nan, 2.0])}
    )
    np.testing.assert_array_equal(columns["step"], [1, 2, 3])
    np.testing.assert_array_equal(missing["loss"], [False, True, False])
    np.testing.assert_array_equal(missing["lr"], [False, True, False])  # a tuple is a list of values too
    assert "gn" not in missing and columns["gn"].dtype == np.float64  # an array's NaN is a value
    assert columns_from_mapping({"loss": [1.0, 2.0]})[1] == {}  # every entry logged: no mask
    # a MetricColumns' own masks are kept (and merged with its Nones), masks of absent columns dropped
    carried = MetricColumns(
        {"loss": [1.0, 2.0], "eval": [None, 1.0]}, {"loss": np.array([False, True]), "gone": np.ones(2, bool)}
    )
    _, missing = columns_from_mapping(carried)
    assert sorted(missing) == ["eval", "loss"] and missing["loss"].tolist() == [False, True]
    assert missing["eval"].tolist() == [True, False]
    record = as_record({"loss": [1.0, None, math.nan]})
    steps, values = record.series("loss")
    assert steps.tolist() == [1, 3] and values[0] == 1.0 and math.isnan(values[1])
    assert (record.numbered_from_one, record.source, record.reproduce_command()) == (True, "arrays", None)
    assert not as_record({"step": [1, 2], "loss": [1.0, 2.0]}).numbered_from_one
    assert not as_record({"loss": [1.0, 2.0]}, steps=[1, 2]).numbered_from_one
    assert columns_from_mapping({"step": [3.0, 5.0], "loss": [1, 2]})[0]["step"].dtype == np.int64


def test_as_record_refuses_what_it_cannot_read():
    with pytest.raises(TypeError) as info:
        as_record([1.0, 2.0])
    assert str(info.value) == "expected a Run, a mapping of arrays or a path to a metrics log, was list"
    with pytest.raises(TypeError) as info:
        as_record(Record({"step": np.arange(3)}), steps=[1, 2, 3])
    assert str(info.value) == "steps= numbers a mapping of arrays; a Run or a log has its own steps"
    record = Record({"step": np.arange(3)})
    assert as_record(record) is record


# -- the measures the assertions and the diagnosis share (pytest_spikecheck.judge.analysis) -------


def test_measures_on_a_series_with_gaps():
    m = {"step": np.array([1, 2, 3, 5, 8]), "loss": np.array([1.0, np.nan, 3.0, 4.0, 5.0]), "lr": np.ones(5)}
    with pytest.raises(KeyError) as info:
        column(m, "x")
    assert info.value.args[0] == "no 'x' series; have loss, lr"
    steps, values = column(m, "loss")
    assert steps.tolist() == [1, 3, 5, 8] and values.tolist() == [1.0, 3.0, 4.0, 5.0]
    assert value_at(m, "loss", 5) == 4.0 and math.isnan(value_at(m, "loss", 4))
    steps = np.arange(1, 101)
    spike = {"step": steps, "g": np.where(steps == 61, 40.0, 1.0)}
    assert spike_ratio(spike, 61, "g") == 40.0 and spike_ratio(spike, 61, "g", window=5) == 40.0
    assert math.isnan(spike_ratio({"step": steps, "g": np.where(steps == 61, 40.0, 0.0)}, 61, "g"))  # a zero baseline
    assert largest_spike(spike, "g") == (61, 40.0)
    assert largest_spike({"step": steps[:11], "g": np.ones(11)}, "g") == (11, 1.0)  # the first value with a baseline
    short = largest_spike({"step": steps[:10], "g": np.ones(10)}, "g")
    assert short[0] is None and math.isnan(short[1])


@pytest.mark.parametrize(
    ("kwargs", "took"),
    [
        ({}, 5),  # high at steps 61-65, back at 66
        ({"factor": 1.5}, 0),  # 3.0 is within 1.5 x 2.0: it never left
        ({"horizon": 4}, None),  # not back within 61-65
        ({"horizon": 5}, 5),
        ({"reference": 3.0}, 0),
        ({"before": 0}, None),  # no pre-event level
    ],
)
def test_recovery_steps(kwargs, took):
    steps = np.arange(1, 101)
    curve = np.where((steps >= 61) & (steps <= 65), 3.0, 2.0)
    assert recovery_steps({"step": steps, "e": curve}, 61, name="e", **kwargs) == took


def test_the_evidence_table_is_eleven_rows_around_the_step():
    loss = [2.0] * 30
    loss[14] = math.nan
    assert _failure(
        assert_finite,
        {"loss": loss, "eval_loss": [None] * 10 + [1.23456] * 20, "grad_norm_post": [0.5] * 30, "other": [1.0] * 30},
    ) == "\n".join(
        [
            "non-finite loss at step 15 (nan)",
            "",
            "step  loss  eval_loss  grad_norm_post",
            "----  ----  ---------  --------------",
            "  10  2     —          0.5",
            *[f"  {s}  2     1.235      0.5" for s in range(11, 15)],
            "→ 15  nan   1.235      0.5",
            *[f"  {s}  2     1.235      0.5" for s in range(16, 21)],
            "",
            "loss: " + "▁" * 29,
            "",
            "record: arrays",
        ]
    )
    # (inf, not NaN: a NaN before a column's first value is "not yet computed", no failure)
    at_the_start = _failure(assert_finite, {"loss": [math.inf] + [2.0] * 30}).split("\n\n")[1].splitlines()
    assert at_the_start[2] == "→ 1   inf" and at_the_start[-1] == "  11  2" and len(at_the_start) == 13
    at_the_end = _failure(assert_finite, {"loss": [2.0] * 30 + [math.nan]}).split("\n\n")[1].splitlines()
    assert at_the_end[2] == "  26  2" and at_the_end[-1] == "→ 31  nan"
    assert "\n\nloss: !!!\n\n" in _failure(assert_finite, {"loss": [math.nan] * 3})  # no finite value: all marks


def test_a_broken_diagnosis_never_hides_the_failure(monkeypatch):
    import pytest_spikecheck.judge.diagnosis as diagnosis

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(diagnosis, "diagnose", broken)
    text = _failure(assert_spike, {"grad_norm_pre": np.ones(60)}, at=55)
    assert text.startswith("expected a grad_norm_pre spike of ≥ 10× at step 55")
    assert "\n\n(diagnosis unavailable: ValueError: boom)\n\n" in text


def test_assert_recovers_reads_the_eval_loss_first_and_times_it_from_the_norm_spike():
    steps = np.arange(1, 101)
    loss = np.where((steps >= 61) & (steps <= 70), 5.0, 2.0)  # back at step 71
    eval_loss = np.where((steps >= 61) & (steps <= 63), 5.0, 2.0)  # back at step 64
    eval_loss[20] = 50.0  # the eval loss's own largest jump is not the event: the norm's spike is
    data = {"grad_norm": _spiked(), "loss": loss, "eval_loss": eval_loss}
    assert assert_recovers(data, within=10) == 3
    assert assert_recovers(data, within=10, metric="loss") == 10
    assert assert_recovers({**data, "eval_loss": np.full(100, np.nan)}, within=10) == 10  # never evaluated: the loss
    assert assert_recovers(data, within=10, factor=2.6) == 0  # 5.0 is within 2.6x of 2.0
    with pytest.raises(SpikeCheckError) as info:
        assert_recovers(data, within=2)
    assert "→ 61" in str(info.value) and any(line.startswith("eval_loss: ") for line in str(info.value).splitlines())
