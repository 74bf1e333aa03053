def test_help_lists_every_option_with_its_default(pytester):
    result = pytester.runpytest("--help")
    out = result.stdout.str()
    for option in (
        "--spikecheck ",
        "--spikecheck-backend=NAME",
        "--spikecheck-device=DEVICE",
        "--spikecheck-report=DIR",
        "--spikecheck-seed=N",
        "--spikecheck-threads=N",
    ):
        assert option in out, option
    assert "gradient-spike scenarios (pytest-spikecheck)" in out
    for ini in ("spikecheck (bool)", "spikecheck_backend", "spikecheck_report", "spikecheck_seed"):
        assert ini in out, ini


def test_fixtures_are_documented(tiny):
    out = tiny.runpytest("--fixtures").stdout.str()
    assert "spikecheck [session scope]" in out and "spikecheck.run(scenario)" in out
    assert "40 steps, a burst of 3 unseen sentences" in out
