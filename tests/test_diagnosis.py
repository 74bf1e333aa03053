from pytest_spikecheck import diagnose

from short_runs import SHORT_BURST


def test_ladder_on_an_unclipped_burst(short_runs):
    d = diagnose(short_runs[1])
    assert d.step == SHORT_BURST
    rungs = [r for r, _ in d.lines]
    assert rungs == ["1 loss", "2 grad norm", "3 batch", "4 token losses", "5 tensors", "6 Adam v"]
    assert d.facts["burst_samples"] == 3 and d.facts["ratio"] > 5
    assert "NOT clipped" in dict(d.lines)["2 grad norm"]
    assert d.verdict == "rare tokens + concentrated batch + no clip = one-step destabilisation"


def test_ladder_on_the_clipped_control(short_runs):
    d = diagnose(short_runs[0], SHORT_BURST)
    assert "clipped ×" in dict(d.lines)["2 grad norm"]
    assert "the clip contained it" in d.verdict
    assert "Diagnosis at step" in d.markdown()


def test_bare_arrays_get_the_first_rungs():
    g = [1.0] * 80
    g[60] = 40.0
    d = diagnose({"grad_norm_pre": g, "loss": [2.0] * 80})
    assert d.step == 61 and [r for r, _ in d.lines] == ["1 loss", "2 grad norm"]
    assert "post-clip norm not logged" in d.text() and "cannot be told" in d.verdict
    assert diagnose({"grad_norm_pre": [1.0] * 3}).text() == "diagnosis: no spike found in this record"
