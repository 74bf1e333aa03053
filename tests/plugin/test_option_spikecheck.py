NO_HEAVY_IMPORTS = """
import sys

def test_plugin_loaded_nothing_heavy():
    heavy = [m for m in ("torch", "cupy", "matplotlib", "hypothesis", "transformers", "lightning",
                         "pytorch_lightning", "accelerate", "ray") if m in sys.modules]
    assert heavy == []
"""


def test_without_the_flag_scenario_tests_skip_and_nothing_heavy_loads(tiny):
    tiny.makepyfile(test_imports=NO_HEAVY_IMPORTS)
    result = tiny.runpytest_subprocess("-rs", "-p", "no:randomly")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(["*needs --spikecheck*"])
    assert "== spikecheck ==" not in result.stdout.str()


def test_with_the_flag_scenarios_train_and_the_summary_counts_them(tiny):
    result = tiny.runpytest("--spikecheck")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "spikecheck: backend torch*device cpu, torch threads 1*",
            "*== spikecheck ==*",
            "2 scenarios checked (2 trained, 0 from the disk cache).",
            "2 held, 0 failed.",
            "scenario*steps*spike step*spike ratio*clip containment*recovery*verdict",
            "tiny_break*40*30*no clip*pass",
            "tiny_control*40*30*held*pass",
        ]
    )
    # the header speaks of the cupy backend only where a CUDA device exists (never of why it cannot run)
    assert "cupy backend unavailable" not in result.stdout.str() and "CUDA driver" not in result.stdout.str()


def test_ini_turns_it_on(tiny):
    # One inner session checks both the ini switch and the default seed (each inner session
    # pays torch's start-up, so the cheap checks share one).
    tiny.makeini("[pytest]\nspikecheck = true\n")
    result = tiny.runpytest("-s", "-k", "test_seed")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*seeds the scenarios' own*", "*SEED 42*"])


def test_marker_alone_skips_and_selects(pytester):
    pytester.makepyfile(
        test_marked="""
import pytest

@pytest.mark.spikecheck
def test_marked():
    pass

def test_plain():
    pass
"""
    )
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1, skipped=1)
    pytester.runpytest("--strict-markers", "--spikecheck", "-m", "spikecheck").assert_outcomes(passed=1, deselected=1)


def test_each_scenario_trains_once_per_session(tiny):
    tiny.makepyfile(
        test_more="""
from pytest_spikecheck import NoClip, RareTokenBurst, Scenario

def test_same_scenario_again(spikecheck):
    scenario = Scenario.preset("phase-19").replace(steps=40).with_breaks(NoClip(), RareTokenBurst(count=3, at_step=30))
    first = spikecheck.run(scenario)
    assert spikecheck.run(scenario) is first or spikecheck.run(scenario).metrics is first.metrics
    assert spikecheck.trained <= 2
"""
    )
    tiny.runpytest("--spikecheck", "-p", "no:randomly").assert_outcomes(passed=4)


def test_tests_that_call_spikecheck_run_get_verdicts_and_names_must_be_unique(pytester):
    pytester.makepyfile(
        test_sweep="""
import pytest
from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, assert_spike

@pytest.mark.parametrize("seed", [1, 2])
def test_point(spikecheck, seed):
    base = Scenario.preset("phase-19").replace(steps=40, seed=seed, name=f"point-{seed}")
    assert_spike(spikecheck.run(base.with_breaks(NoClip(), RareTokenBurst(count=3, at_step=30))), at=30, min_ratio=3)

def test_same_name_twice(spikecheck):
    spikecheck.run(Scenario.preset("phase-19").replace(steps=5, name="dup"))
    spikecheck.run(Scenario.preset("phase-19").replace(steps=6, name="dup"))
"""
    )
    result = pytester.runpytest("--spikecheck", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*two different scenarios are both named 'dup'*", "point-1 *pass", "point-2 *pass"])
