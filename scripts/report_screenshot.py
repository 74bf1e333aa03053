"""Take docs/report_page.png: the report page (``index.html``) of the downstream example as
headless Chromium draws it.

    .venv/bin/python scripts/report_screenshot.py [--report out/report-example] [--out docs/report_page.png]

It runs ``pytest --spikecheck --spikecheck-report REPORT --runxfail`` in ``examples/downstream`` (the
repo a user writes: six scenarios, each trained once; with ``--runxfail`` its test that fails on
purpose counts, so the page shows a failed scenario first, with its diagnosis), opens ``REPORT/index.html`` in Chromium with the
browser tests' driver (tests/chromium.py; Debian's ``chromium``, or ``$SPIKECHECK_CHROMIUM``),
checks that it loaded without a console error, and saves the top of the page.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from chromium import Chromium, find_chromium  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default=str(ROOT / "out" / "report-example"), help="report folder to write")
    parser.add_argument("--out", default=str(ROOT / "docs" / "report_page.png"), help="the screenshot")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args()
    executable = find_chromium()
    if executable is None:
        sys.exit("no chromium on PATH: apt-get install chromium (or set SPIKECHECK_CHROMIUM)")
    report = Path(args.report).resolve()
    tests = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--spikecheck",
            f"--spikecheck-report={report}",
            "--runxfail",
            "-p",
            "no:cacheprovider",
            "-q",
        ],
        cwd=ROOT / "examples" / "downstream",
    )
    if tests.returncode != 1:  # exactly the one test that fails on purpose
        sys.exit(f"the example's tests exited {tests.returncode}, not 1 (one failure, on purpose)")
    browser = Chromium(executable)
    try:
        loaded = browser.open(report / "index.html")
        if loaded.errors:
            sys.exit(f"the page logged errors: {loaded.errors}")
        browser.screenshot(Path(args.out), args.width, args.height)
    finally:
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
