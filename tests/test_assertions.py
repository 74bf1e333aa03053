import json
import math
import subprocess
import sys

import numpy as np
import pytest

from pytest_spikecheck import (
    SpikeCheckError, assert_clip_contains, assert_diverges, assert_finite, assert_no_spike, assert_recovers,
    assert_spike,
)

from pytest_spikecheck.records import Run
from pytest_spikecheck.records.series import MetricColumns
from short_runs import SHORT_BURST


def _flat(n=200, level=1.0):
    return list(level + 0.01 * np.sin(np.arange(n)))


def test_spike_on_plain_arrays_without_torch():
    code = ("import sys\nfrom pytest_spikecheck import assert_spike\n"
            "assert_spike({'grad_norm_pre': [1.0] * 60 + [30.0]}, min_ratio=10)\n"
            "import pytest_spikecheck.integrations\n"
            "print(sorted(m for m in ('torch', 'cupy', 'matplotlib', 'hypothesis', 'transformers', 'lightning') "
            "if m in sys.modules))")
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


@pytest.mark.parametrize(("data", "message"), [
    ({"grad_norm_pre": np.ones((10, 2))}, r"'grad_norm_pre' is a 2-D array of shape \(10, 2\)"),
    ({"grad_norm_pre": [1.0, 2.0, 3.0], "step": [1, 1, 2]}, "holds step 1 more than once"),
    ({"grad_norm_pre": [1.0, 2.0, 3.0], "step": [1, 1.5, 2]}, "must hold integers, has 1.5"),
])
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
