"""Turn the pytest-benchmark JSON of benchmarks/bench_clip.py into a markdown table.

    python benchmarks/clip_table.py bench.json [--output table.md]

One row per benchmark: shape, dtype, case, implementation, device, parameters, median time, effective
bandwidth (the bytes the case must move / median time) and the fraction of H200's 4.3 TB/s that
is. The table is printed and, with --output, written to a file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Keep in step with benchmarks/bench_clip.py (not imported: that module imports torch).
H200_BYTES_PER_SECOND = 4.3e12
SHAPE_ORDER = ("tiny", "andrea-12m", "andrea-120m", "gpt2-124m")
DTYPE_ORDER = ("float32", "bfloat16")
CASE_ORDER = ("clip", "no clip")

HEADER = (
    "| shape | dtype | case | implementation | device | parameters | median time | effective GB/s | "
    "fraction of H200 bound |\n|---|---|---|---|---|---:|---:|---:|---:|"
)


def format_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def rows(report: dict) -> list[str]:
    results = []
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if bench.get("group") != "clip" or "bytes_moved" not in info:
            continue
        median = bench["stats"]["median"]
        bandwidth = info["bytes_moved"] / median
        dtype = info.get("dtype", "float32")  # results from before the dtype parameter are fp32
        key = (
            SHAPE_ORDER.index(info["shape"]) if info["shape"] in SHAPE_ORDER else len(SHAPE_ORDER),
            DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER),
            CASE_ORDER.index(info["case"]) if info["case"] in CASE_ORDER else len(CASE_ORDER),
            info["implementation"],
        )
        line = (
            f"| {info['shape']} | {dtype} | {info['case']} | {info['implementation']} | "
            f"{info.get('device_name', info.get('device', '?'))} | {info['parameters']:,} | "
            f"{format_time(median)} | {bandwidth / 1e9:,.1f} | {bandwidth / H200_BYTES_PER_SECOND:.3f} |"
        )
        results.append((key, line))
    return [line for _, line in sorted(results)]


def table(report: dict) -> str:
    lines = rows(report)
    if not lines:
        raise ValueError("expected clip benchmarks (group 'clip' with extra_info) in the JSON, was none")
    machine = report.get("machine_info", {})
    when = report.get("datetime", "unknown date")
    cpu = machine.get("cpu", {}).get("brand_raw", machine.get("processor", "unknown CPU"))
    caption = f"Measured {when} on {machine.get('node', 'unknown host')} ({cpu}); median of the rounds."
    return "\n".join([HEADER, *lines, "", caption]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, metavar="BENCH.json", help="pytest-benchmark --benchmark-json output")
    parser.add_argument("--output", type=Path, metavar="TABLE.md", help="also write the table here")
    args = parser.parse_args(argv)
    try:
        text = table(json.loads(args.json.read_text()))
    except (OSError, ValueError, KeyError) as exc:
        print(f"clip_table: {args.json}: {exc}", file=sys.stderr)
        return 1
    print(text, end="")
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
