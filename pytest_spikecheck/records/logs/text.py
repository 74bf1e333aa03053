"""Training logs printed to stdout: the most common record of a large run.

Each line (and each carriage-return segment of a line: tqdm redraws its bar with ``\\r``) is
offered to the line forms of :mod:`.text_forms` (Megatron-LM, torchtitan, nanoGPT, llm.c,
OLMo, generic ``key=value`` / ``key: value``), after ANSI colour codes are removed; the
Hugging Face Trainer's printed dicts and Lightning's progress bars are read around the bar
that carries them. Lines of no known form (argument dumps, warnings, a copy of the script,
tracebacks) are skipped; a file with none of the forms is one error naming the forms tried.

What the log says of its precision (``fp16 ... True`` in an argument dump, ``--fp16``,
``dtype = 'float16'``) is kept for the overflow rule (:mod:`.skips`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import text_forms
from pytest_spikecheck.records.logs.base import MAX_LINE, Reader, Table, columns_of, line_where, read_text

DESCRIPTION = (
    "a training log printed to stdout (Megatron-LM, torchtitan, nanoGPT, llm.c, OLMo, HF Trainer dicts, "
    "Lightning progress bars, key=value or key: value lines)"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TQDM_PAIRS = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")  # "| 10/4854 [00:16<...": a bar's count and total

_FP16_YES = re.compile(
    r"(?:\bfp16\b['\"]?\s*(?:\.{2,}|[:=])\s*['\"]?(?:true)\b|--fp16\b(?!\S*=\s*false)|"
    r"mixed_precision\W{1,4}fp16\b|\bdtype\s*[:=]\s*['\"]?(?:torch\.)?float16\b|"
    r"precision\s*[:=]\s*['\"]?(?:16|16-mixed|amp_fp16)['\"]?(?![\w-]))",
    re.I,
)
_FP16_NO = re.compile(
    r"(?:\bfp16\b['\"]?\s*(?:\.{2,}|[:=])\s*['\"]?false\b|\bbf16\b['\"]?\s*(?:\.{2,}|[:=])\s*['\"]?true\b|"
    r"mixed_precision\W{1,4}(?:bf16|no)\b|\bdtype\s*[:=]\s*['\"]?(?:torch\.)?(?:bfloat16|float32)\b|"
    r"precision\s*[:=]\s*['\"]?(?:bf16\S*|32\S*|amp_bf16)['\"]?)",
    re.I,
)


def detect(path: Path, head: bytes) -> bool:
    return b"\0" not in head  # any other text: the last format asked


def _is_eval(name: str) -> bool:
    return name.lower().startswith(("val", "eval", "test", "valid"))


def fp16_of(text: str) -> bool | None:
    """True where the log's own arguments say fp16, False where they say bf16/fp32 and not
    fp16, None where they say nothing."""
    if _FP16_YES.search(text):
        return True
    return False if _FP16_NO.search(text) else None


def read(path: Path) -> Table:
    text = _ANSI.sub("", read_text(path, DESCRIPTION, keep_carriage_returns=True, max_line=MAX_LINE))
    table, shared = _read(path, text, number_epoch_lines=False)
    if shared is None:
        return table
    # Lines of one epoch log the same metric again: they are printed in the batch loop, and read at
    # the epoch they would merge into one point (the last batch's), every other line's value lost unsaid.
    table, _ = _read(path, text, number_epoch_lines=True)
    table.notes.append(
        f"the {text_forms.EPOCH_FORM} lines count epochs, not steps, and several log one metric in an epoch (epoch "
        f"{shared}): numbered 1, 2, 3, ... in their order, again from 1 where the epoch goes back (a new run); "
        f"their epoch kept as the epoch column"
    )
    return table


def _read(path: Path, text: str, *, number_epoch_lines: bool) -> tuple[Table, int | None]:
    """The table of ``text``, and the first epoch in which two lines of the epoch-counted form log
    the same name (None: one row an epoch, read at its epoch; a training and a validation line of
    one epoch merge). ``number_epoch_lines``: those lines numbered in
    order instead (1, 2, 3, ..., again from 1 where the epoch goes back)."""
    steps: list[int] = []
    rows: list[dict] = []
    lines: list[int] = []
    forms: Counter[str] = Counter()
    notes: list[str] = []
    bars: dict[int, int] = {}  # a progress bar's total -> its last count (a run draws its own and its evals')
    last_train: int | None = None  # the step of the last HF training dict
    train_dicts = 0
    numbered = False
    block: int | None = None  # the row an OLMo step header opened: its indented lines belong to it
    epoch_start: dict[int, int] = {}  # a Lightning epoch -> the step its first batch follows
    epoch_batches: dict[int, int] = {}  # ... and the most batches its bar showed
    shown: dict[str, float | None] = {}  # the values a Lightning bar showed last
    waiting: list[tuple[dict, int]] = []  # stepless validations that belong to the next step line
    last_epoch: int | None = None  # the epoch of the last epoch-counted line
    epoch_line = 0  # its number in order (number_epoch_lines)
    shared: int | None = None  # the first epoch two epoch-counted lines share
    epoch_keys: set[str] = set()  # the names the epoch-counted lines of the last epoch logged

    def add(step: int, values: dict, line: int, form: str) -> None:
        steps.append(step)
        rows.append(values)
        lines.append(line)
        forms[form] += 1

    for n, line in enumerate(text.split("\n"), 1):
        if block is not None and line[:1].isspace():
            found = text_forms.continuation(line)
            if found is not None:
                rows[block][found[0]] = found[1]
                continue
        block = None
        for segment in line.split("\r"):
            if not segment.strip():
                continue
            if "{'" in segment:
                dicts = text_forms.hf_dicts(segment)
                if dicts:
                    for count, total in _TQDM_PAIRS.findall(segment[: segment.index("{'")]):
                        bars[int(total)] = int(count)
                    for values in dicts:
                        if "train_runtime" in values:
                            continue  # the end-of-training summary: its train_loss is the mean over the run
                        step = values.pop("step", None)
                        if all(k.startswith("eval_") or k == "epoch" for k in values):
                            step = step if step is not None else (last_train or 0)  # an evaluation: at its training step
                        else:
                            train_dicts += 1
                            if step is None and bars:
                                # The training bar (the longest one) counts steps; tqdm redraws it at most ten
                                # times a second, so its count can lag: never before the previous dict's step.
                                count = bars[max(bars)]
                                step = count if last_train is None or count > last_train else last_train + 1
                            elif step is None:
                                numbered = True
                                step = train_dicts
                            last_train = int(step)
                        add(int(step), values, n, "HF Trainer dict")
                    for count, total in _TQDM_PAIRS.findall(segment[segment.rindex("}") :]):
                        bars[int(total)] = int(count)
                    continue
            if "Epoch" in segment:
                bar = text_forms.lightning_bar(segment)
                if bar is not None:
                    epoch, batch, values = bar
                    if batch == 0:
                        continue  # a bar reset to 0 (an epoch's start) shows the last epoch's values again
                    if epoch not in epoch_start:  # a new epoch starts where the last one's bar ended
                        epoch_start[epoch] = epoch_start[max(epoch_start)] + epoch_batches[max(epoch_start)] if epoch_start else 0
                    epoch_batches[epoch] = max(epoch_batches.get(epoch, 0), batch)
                    # The bar repeats a validation value until the next validation: kept where it changes.
                    kept = {k: v for k, v in values.items() if not _is_eval(k) or shown.get(k) != v}
                    shown.update(values)
                    add(epoch_start[epoch] + batch, {**kept, "epoch": float(epoch)}, n, "Lightning progress bar")
                    continue
            for count, total in _TQDM_PAIRS.findall(segment):
                bars[int(total)] = int(count)
            for form in text_forms.FORMS:
                parsed = form.parse(segment)
                if parsed is not None and form.name == text_forms.EPOCH_FORM:
                    epoch = parsed[0]
                    # the same metric twice in one epoch: a line a batch (a training and a validation
                    # line of one epoch hold different names, and merge into its row)
                    if epoch != last_epoch:
                        epoch_keys = set(parsed[1])
                    else:
                        if shared is None and epoch_keys.intersection(parsed[1]):
                            shared = epoch
                        epoch_keys |= set(parsed[1])
                    epoch_line = epoch_line + 1 if last_epoch is None or epoch >= last_epoch else 1
                    last_epoch = epoch
                    if number_epoch_lines:
                        parsed = (epoch_line, {**parsed[1], "epoch": float(epoch)})
                if parsed is not None:
                    for values, line in waiting:  # build-nanogpt's validation: at the step line after it
                        add(parsed[0], values, line, "stepless validation")
                    waiting.clear()
                    add(parsed[0], parsed[1], n, form.name)
                    block = len(rows) - 1 if form.name == "OLMo" else None
                    break
            else:
                found = text_forms.stepless_eval(segment)
                if found is not None and found[1]:
                    waiting.append((found[0], n))
                elif found is not None and steps:  # llm.c's "val loss 3.2", an epoch's end: at the step before
                    add(steps[-1], found[0], n, "stepless validation")
    for values, line in waiting:  # a log that ends after a validation line: at its last step
        if steps:
            add(steps[-1], values, line, "stepless validation")
    if not rows:
        tried = ", ".join(f.name for f in (*text_forms.FORMS, *text_forms.OTHER_FORMS))
        raise ConfigError(
            f"{path}: no line of a known training-log form (tried {tried}); expected a trainer_state.json, "
            f"a metrics.csv, TensorBoard event files, an MLflow run, a CSV/JSONL log or a training log "
            f"printed to stdout"
        )
    notes.append(
        "read as text: " + ", ".join(f"{count:,} {form} line{'s' if count != 1 else ''}" for form, count in forms.most_common())
    )
    if numbered:
        notes.append(
            "the HF Trainer dicts carry no step and no progress bar counts them: numbered 1, 2, 3, ... "
            "(each evaluation at the training dict before it)"
        )
    elif forms["HF Trainer dict"]:
        notes.append(
            "the HF Trainer dicts carry no step: each is read at the training progress bar's count before "
            "it (tqdm redraws at most ten times a second, so a step may read a little early), each "
            "evaluation at the training dict before it"
        )
    if forms["Lightning progress bar"]:
        notes.append(
            "Lightning's progress bar counts batches within an epoch: steps read as the batches of the "
            "epochs before plus the bar's count; a validation value the bar repeats is read where it changes"
        )
    columns, _ = columns_of(rows)
    # A field that never held a number ("eta 1.06m", "memory: 30.1GiB(31.7%)") is no series.
    columns = {name: c for name, c in columns.items() if not c.missing.all()}
    return Table(np.asarray(steps, dtype=np.int64), columns, line_where(np.asarray(lines)), notes, fp16=fp16_of(text)), shared


READER = Reader("text", DESCRIPTION, detect, read, steps_own="a text log's lines carry their own step")
