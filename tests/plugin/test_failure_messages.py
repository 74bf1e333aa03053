def test_failures_explain_themselves(pytester):
    pytester.makepyfile(
        test_fail="""
from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, assert_clip_contains, assert_spike, spikecheck_scenario

@spikecheck_scenario
def tiny_break():
    return Scenario.preset("phase-19").replace(steps=40).with_breaks(NoClip(), RareTokenBurst(count=3, at_step=30))

def test_too_demanding(tiny_break):
    assert_spike(tiny_break, at=30, min_ratio=1000)

def test_clip_missing(tiny_break):
    assert_clip_contains(tiny_break, max_norm=1.0)
"""
    )
    result = pytester.runpytest("--spikecheck")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "expected a grad_norm_pre spike of ≥ 1000× at step 30, got" in out
    assert "→ 30" in out and "diagnosis at step 30" in out
    assert "reproduce: pytest 'test_fail.py::test_too_demanding' --spikecheck" in out  # the test, not the session
    assert "FAIL test_fail.py::test_too_demanding (scenario tiny_break)" in out
    assert "the clip did not contain the gradient" in out
    assert "assertions.py" not in out  # __tracebackhide__: the traceback stops at the test
    result.stdout.fnmatch_lines(["tiny_break*FAIL*"])
