import re


def _verdicts(result):
    rows = [line for line in result.stdout.lines if line.startswith("tiny_")]
    return sorted(re.sub(r"\s+", " ", r) for r in rows)


def test_xdist_gives_the_same_verdicts(tiny):
    serial = tiny.runpytest("--spikecheck", "-p", "no:randomly")
    serial.assert_outcomes(passed=3)
    parallel = tiny.runpytest_subprocess("--spikecheck", "-n", "2", "-p", "no:randomly")
    parallel.assert_outcomes(passed=3)
    assert _verdicts(serial) and _verdicts(serial) == _verdicts(parallel)
