def test_seed_override_reaches_every_scenario(tiny):
    result = tiny.runpytest("--spikecheck", "--spikecheck-seed", "7", "-s", "-k", "test_seed")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*seeds all overridden to 7*", "*SEED 7*"])


def test_default_seed_is_the_scenarios_own(tiny):
    result = tiny.runpytest("--spikecheck", "-s", "-k", "test_seed")
    result.stdout.fnmatch_lines(["*seeds the scenarios' own*", "*SEED 42*"])


def test_bad_seed_is_a_usage_error(pytester):
    result = pytester.runpytest("--spikecheck-seed", "forty-two")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*expected an integer seed, was 'forty-two'*"])
