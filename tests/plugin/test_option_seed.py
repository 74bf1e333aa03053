def test_seed_override_reaches_every_scenario(tiny):
    result = tiny.runpytest("--spikecheck", "--spikecheck-seed", "7", "-s", "-k", "test_seed")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*seeds all overridden to 7*", "*SEED 7*"])


# The default seed (the scenario's own, 42) is checked by test_option_spikecheck.py::test_ini_turns_it_on.


def test_bad_seed_is_a_usage_error(pytester):
    result = pytester.runpytest("--spikecheck-seed", "forty-two")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*expected an integer seed, was 'forty-two'*"])
