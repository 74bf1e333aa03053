import json
import re


def test_report_files_appear_only_with_the_option(tiny):
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
    result.stdout.fnmatch_lines([f"report: {report / 'index.md'}"])
    assert json.loads((report / "tiny_break" / "summary.json").read_text())["verdict"] == "pass"
    diagnosis = (report / "tiny_break" / "diagnosis.md").read_text()
    table_rows = [line for line in diagnosis.splitlines() if line.startswith("| ")]
    assert len(table_rows) >= 6 and any("|g\\|/√v̂" in row for row in table_rows)
    assert all(len(re.split(r"(?<!\\)\|", row)) == 4 for row in table_rows)  # two cells: "|" in a cell is escaped


def test_runs_are_cached_on_disk_by_content_hash(tiny):
    report = tiny.path / "report"
    tiny.runpytest("--spikecheck", f"--spikecheck-report={report}").assert_outcomes(passed=3)
    result = tiny.runpytest("--spikecheck", f"--spikecheck-report={report}")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["2 scenarios checked (0 trained, 2 from the disk cache)."])
    cached = list((report / ".cache").iterdir())
    assert len(cached) == 2 and all("-torch-cpu-t1-v" in p.name for p in cached)


def test_a_report_path_that_is_a_file_is_a_usage_error_before_training(tiny):
    (tiny.path / "report.txt").write_text("not a folder")
    result = tiny.runpytest("--spikecheck", f"--spikecheck-report={tiny.path / 'report.txt'}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--spikecheck-report *report.txt is an existing file; it must be a folder"])
