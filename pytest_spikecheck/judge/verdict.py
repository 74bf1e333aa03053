"""What an assertion measured: a :class:`Verdict` (the assertion's name, the metric it read, the
figure it measured, the limit it held that figure to, the step it names, pass or fail, and one
line of reason). Every assertion makes one; a failure's :class:`~pytest_spikecheck.errors.SpikeCheckError`
carries it as ``.verdict``, the assertions that return nothing else return it, and
:func:`collecting` gathers every verdict made inside a block (the pytest plugin collects each
test's this way, for the terminal, JUnit, the job summary and the page). Plain Python: no numpy.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping

__all__ = ["Verdict", "collecting", "emit"]


@dataclass(frozen=True)
class Verdict:
    """One assertion's judgement of one record.

    ``assertion`` names it (``assert_clip_contains``), ``passed`` says how it went and ``reason``
    why, in one line; ``metric``, ``measured``, ``limit`` and ``step`` are the figure it judged
    (None where it has none); ``scenario`` the run's name. A failure carries it
    (``SpikeCheckError.verdict``); the assertions that return nothing else return it; the plugin
    collects each test's for the terminal summary, JUnit XML, the job summary and the report page.
    """

    assertion: str  # "assert_clip_contains"
    passed: bool
    reason: str  # one line
    metric: str | None = None  # the column it judged ("grad_norm_post")
    measured: float | None = None  # the figure it measured (the worst post-clip norm)
    limit: float | None = None  # what that figure was held to (max_norm)
    step: int | None = None  # the step the verdict names (the worst one, the spike's)
    scenario: str | None = None  # the run's name, when the record is a run
    #: the diagnosis ladder at ``step`` ({"step", "lines", "verdict"}), on a failure that names one
    diagnosis: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def outcome(self) -> str:
        return "pass" if self.passed else "FAIL"

    def line(self) -> str:
        """``FAIL assert_qk_clip_contains: <reason>``: what the terminal and JUnit show."""
        return f"{self.outcome} {self.assertion}: {self.reason}"

    def figures(self) -> str:
        """``attn_logit_max 119.4 (limit 60) at step 30``: the measured figure beside its limit."""
        parts = [self.metric or ""]
        if self.measured is not None:
            parts.append(_number(self.measured))
        if self.limit is not None:
            parts.append(f"(limit {_number(self.limit)})")
        if self.step is not None:
            parts.append(f"at step {self.step}")
        return " ".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("measured", "limit"):  # JSON has no inf or NaN
            value = data[key]
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        values = dict(data)
        for key in ("measured", "limit"):
            if isinstance(values.get(key), str):
                values[key] = float(values[key])
        return cls(**{k: values.get(k) for k in cls.__dataclass_fields__ if k in values})


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    return format(value, ",.4g") if isinstance(value, float) and math.isfinite(value) else str(value)


_SINKS: list[list[Verdict]] = []
_REPRODUCE: list[str | None] = []


def emit(verdict: Verdict) -> Verdict:
    """Hand ``verdict`` to every :func:`collecting` block open now; return it."""
    for sink in _SINKS:
        sink.append(verdict)
    return verdict


def current_reproduce() -> str | None:
    """The reproduce command of the innermost :func:`collecting` block that named one."""
    return next((r for r in reversed(_REPRODUCE) if r), None)


@contextlib.contextmanager
def collecting(reproduce: str | None = None) -> Iterator[list[Verdict]]:
    """Collect the verdicts of every assertion made inside the block, in order. ``reproduce``
    (the plugin's ``pytest 'tests/x.py::test_y' --spikecheck``) replaces the run's own reproduce
    command in the failures made inside it."""
    sink: list[Verdict] = []
    _SINKS.append(sink)
    _REPRODUCE.append(reproduce)
    try:
        yield sink
    finally:
        # by identity: list.remove compares by value, and an outer block's sink can equal this one
        # (both empty, or holding the same verdicts: a pytester session inside a plugin test)
        del _SINKS[next(i for i, s in enumerate(_SINKS) if s is sink)]
        _REPRODUCE.pop()
