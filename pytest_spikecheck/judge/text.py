"""Plain-text rendering of numbers and tables for messages, the CLI and reports.

``—`` stands for a value that is not there (not logged, not measurable); a real non-finite
value prints as ``nan``/``inf``: the two must never look alike.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60, log: bool = True) -> str:
    """A one-line picture of a series (max per bucket; non-finite values drawn as '!')."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return ""
    buckets = np.array_split(v, min(width, v.size))
    out = []
    finite_all = v[np.isfinite(v)]
    if finite_all.size == 0:
        return "!" * len(buckets)
    tr = (lambda x: np.log10(np.maximum(x, 1e-12))) if log and finite_all.min() > 0 else (lambda x: x)
    lo, hi = tr(finite_all.min()), tr(finite_all.max())
    for b in buckets:
        if not np.isfinite(b).all():
            out.append("!")
            continue
        # Halved before subtracting: hi - lo of values near float64's limit would overflow.
        level = 0 if hi == lo else int((tr(b.max()) / 2 - lo / 2) / (hi / 2 - lo / 2) * (len(_SPARK) - 1))
        out.append(_SPARK[max(0, min(level, len(_SPARK) - 1))])
    return "".join(out)


#: The glyph of a value that is not there.
MISSING = "—"


def fmt(value: float | int | None, spec: str = ".3g") -> str:
    """A logged value: ``—`` for None (not logged); NaN and ±inf print as ``nan``/``inf``."""
    if value is None:
        return MISSING
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return format(value, spec) if math.isfinite(value) else str(value)
    return str(value)


def fmt_measure(value: float | int | None, spec: str = ".3g") -> str:
    """A derived measure (a ratio, a median, a jump) whose NaN means "could not be measured"
    (no baseline, no eval): ``—``; an infinite measure stays ``inf``."""
    if isinstance(value, (float, np.floating)) and math.isnan(value):
        return MISSING
    return fmt(value, spec)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """A plain-text (or markdown) table with aligned columns."""
    if markdown:  # cells are text, never markup: a "|" (|g|/√v̂) would end the cell, a newline the row
        from pytest_spikecheck.judge.escape import markdown_cell

        headers = [markdown_cell(h) for h in headers]
        rows = [[markdown_cell(c) for c in r] for r in rows]
    else:  # nor terminal commands: a control character in a name or a log key is shown, not obeyed
        from pytest_spikecheck.judge.escape import terminal_text

        headers = [terminal_text(h) for h in headers]
        rows = [[terminal_text(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    if markdown:
        lines = [
            "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        ]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    else:
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


_SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def fmt_compact(value: float | None, spec: str = ".2g") -> str:
    """A value in few characters, the exponent without padding: ``1.5e-5``, ``3.8e5``."""
    text = fmt(value, spec)
    mantissa, sep, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if sep else text


def fmt_scale(scale: float | None) -> str:
    """A loss scale: a power of two as ``2²⁴`` (what dynamic scaling produces), else the number."""
    if scale is None or not math.isfinite(scale) or scale <= 0:
        return fmt(scale)
    exponent = math.log2(scale)
    return f"2{str(int(exponent)).translate(_SUPERSCRIPTS)}" if exponent == int(exponent) else fmt(scale, ".4g")
