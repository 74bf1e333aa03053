"""Progress of long work: a tqdm bar on a terminal, one line per finished piece of work
otherwise, nothing when quiet.

One mechanism for everything that trains or runs many things: ``spikecheck train`` (a bar over
the steps), ``pytest --spikecheck`` (a bar per scenario on a terminal, a line per trained
scenario in CI logs and on xdist workers), and work above training that counts outcomes (a sweep's
points done, failed, cached)::

    progress = Progress(sys.stderr)                  # or mode="lines" / "quiet"
    with progress.task("sweep", total=len(points), unit="point") as task:
        for point in points:
            outcome = run(point)                     # "done", "failed", "cached", ...
            task.update(outcome=outcome)             # the bar shows the counts
            task.line(f"{point}: {outcome}")         # one line each, when not on a terminal
        task.finish(f"{len(points)} points: {task.counts_text()}")

:meth:`ProgressTask.step_callback` turns a task into a training callback (the engine calls it
after every step; the bar shows the loss and the pre-clip norm). Nothing here imports tqdm until
a bar is drawn.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any, Callable, TextIO

MODES = ("auto", "bar", "lines", "quiet")


class Progress:
    """Where progress goes and how: ``mode`` ``auto`` draws bars when ``stream`` is a terminal and
    writes lines otherwise; ``bar``, ``lines`` and ``quiet`` force one. ``prefix`` starts every
    line (the plugin's is ``spikecheck: `` or ``spikecheck [gw0]: ``); ``leave`` keeps a finished bar
    on the terminal (a log of what ran) instead of clearing it."""

    def __init__(self, stream: TextIO | None = None, *, mode: str = "auto", prefix: str = "", leave: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, was {mode!r}")
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if callable(isatty) and isatty() else "lines"
        self.mode = mode
        self.prefix = prefix
        self.leave = leave

    def task(self, name: str, total: int | None = None, unit: str = "step") -> ProgressTask:
        return ProgressTask(self, name, total, unit)

    def write_line(self, text: str) -> None:
        """One line on the stream (not in quiet mode)."""
        if self.mode != "quiet":
            self.stream.write(f"{self.prefix}{text}\n")
            self.stream.flush()


class ProgressTask:
    """One piece of long work: ``update`` advances it (with an outcome to count, and values to
    show beside the bar), ``line`` writes a line in lines mode, ``finish`` ends it."""

    def __init__(self, progress: Progress, name: str, total: int | None, unit: str) -> None:
        self.progress = progress
        self.name = name
        self.done = 0
        self.counts: Counter[str] = Counter()
        self._bar: Any = None
        if progress.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=f"{progress.prefix}{name}",
                unit=unit,
                file=progress.stream,
                leave=progress.leave,
                dynamic_ncols=True,
            )

    def update(self, n: int = 1, *, outcome: str | None = None, **shown: Any) -> None:
        self.done += n
        if outcome is not None:
            self.counts[outcome] += n
        if self._bar is not None:
            if self.counts:
                shown = {**shown, **self.counts}
            if shown:
                self._bar.set_postfix(shown, refresh=False)
            self._bar.update(n)

    def counts_text(self) -> str:
        """The outcomes counted so far, e.g. ``3 done, 1 failed`` (in the order first seen)."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.counts.items())

    def line(self, text: str) -> None:
        """A line for logs: written in lines mode only (a bar already shows the work)."""
        if self.progress.mode == "lines":
            self.progress.write_line(text)

    def finish(self, text: str | None = None) -> None:
        """End the task; in lines mode write ``text`` (its one line), if given."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif text is not None:
            self.line(text)

    def __enter__(self) -> ProgressTask:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:  # left early (an error): close the bar, no finish line
            self._bar.close()
            self._bar = None

    def step_callback(self) -> Callable[[Any], None]:
        """A training callback (``train(..., callbacks=[...])``) that advances the task one step
        and shows the step's loss and pre-clip gradient norm. It only reads the step."""

        def on_step(ctx: Any) -> None:
            if self._bar is None:  # lines or quiet: nothing to draw per step
                self.done += 1
                return
            self.update(1, loss=f"{ctx.row['loss']:.3f}", gnorm=f"{ctx.row['grad_norm_pre']:.3g}")

        return on_step
