import json
import re


def _entries(cache):
    """The run store's entries (its .locks folder aside)."""
    return [p for p in cache.iterdir() if not p.name.startswith(".")]


def test_report_files_appear_only_with_the_option_and_runs_are_cached_on_disk(tiny):
    report = tiny.path / "report"
    tiny.runpytest("--spikecheck").assert_outcomes(passed=3)
    assert not report.exists()
    result = tiny.runpytest("--spikecheck", f"--spikecheck-report={report}")
    result.assert_outcomes(passed=3)
    for scenario in ("tiny_break", "tiny_control"):
        for f in ("loss.png", "grad_norm.png", "diagnosis.md", "summary.json", "run/metrics.jsonl"):
            assert (report / scenario / f).is_file(), (scenario, f)
    index = (report / "index.md").read_text()
    assert "[tiny_break](tiny_break/diagnosis.md)" in index and "| pass |" in index
    result.stdout.fnmatch_lines([f"report: {report / 'index.html'}"])
    assert json.loads((report / "tiny_break" / "summary.json").read_text())["verdict"] == "pass"
    diagnosis = (report / "tiny_break" / "diagnosis.md").read_text()
    table_rows = [line for line in diagnosis.splitlines() if line.startswith("| ")]
    assert len(table_rows) >= 6 and any("|g\\|/√v̂" in row for row in table_rows)
    assert all(len(re.split(r"(?<!\\)\|", row)) == 4 for row in table_rows)  # two cells: "|" in a cell is escaped

    # The report folder holds a disk cache keyed by content hash: the same session again trains nothing.
    again = tiny.runpytest("--spikecheck", f"--spikecheck-report={report}")
    again.assert_outcomes(passed=3)
    again.stdout.fnmatch_lines(["2 scenarios checked (0 trained, 2 from the disk cache)."])
    cached = _entries(report / ".cache")
    assert len(cached) == 2 and all("-torch-cpu-t1-v" in p.name for p in cached)


def test_a_report_path_that_is_a_file_is_a_usage_error_before_training(tiny):
    (tiny.path / "report.txt").write_text("not a folder")
    result = tiny.runpytest("--spikecheck", f"--spikecheck-report={tiny.path / 'report.txt'}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--spikecheck-report *report.txt is an existing file; it must be a folder"])


MODEL_MODULE = """
import torch

WIDTH = {width}


def make_model(vocab_size):
    return Tiny(vocab_size)


class Tiny(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, WIDTH)
        self.head = torch.nn.Linear(WIDTH, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
"""

FACTORY_SCENARIOS = """
from pytest_spikecheck import Scenario, spikecheck_scenario
from my_model import make_model

BASE = Scenario.preset("phase-19").replace(steps=6)


@spikecheck_scenario
def mine():
    return BASE.replace(model_factory=make_model)


@spikecheck_scenario
def inline():
    return BASE.replace(model_factory=lambda vocab_size: make_model(vocab_size))
"""


def test_editing_the_model_module_retrains(pytester):
    """The disk cache keys a model_factory by its module's source: a width edit retrains; a
    lambda is never cached on disk, and the summary says why."""
    pytester.makepyfile(my_model=MODEL_MODULE.format(width=8))
    pytester.makeconftest(FACTORY_SCENARIOS)
    pytester.makepyfile(
        test_mine="def test_mine(mine):\n    assert len(mine) == 6\n\n\ndef test_inline(inline):\n    assert len(inline) == 6\n"
    )
    report = pytester.path / "report"
    args = ("--spikecheck", f"--spikecheck-report={report}", "-p", "no:cacheprovider")
    first = pytester.runpytest(*args)
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(
        [
            "2 scenarios checked (2 trained, 0 from the disk cache).",
            "inline: model_factory conftest.inline.<locals>.<lambda> is a lambda*not cached on disk*",
        ]
    )
    cached = [p.name for p in _entries(report / ".cache")]
    assert len(cached) == 1 and "-model" in cached[0]  # only the module-level factory's run
    pytester.makepyfile(my_model=MODEL_MODULE.format(width=16))
    edited = pytester.runpytest(*args)
    edited.assert_outcomes(passed=2)
    edited.stdout.fnmatch_lines(["2 scenarios checked (2 trained, 0 from the disk cache)."])
    assert len(_entries(report / ".cache")) == 2  # width 8's run and width 16's
