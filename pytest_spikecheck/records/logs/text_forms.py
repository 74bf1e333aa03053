"""The line forms of training stdout the text reader knows: one small parser per form, each
built from real public lines (``tests/test_logs_text.py`` holds one test per form).

A form's ``parse(segment)`` returns ``(step, {name: value})`` for a line of its form, or None.
``step`` is None where the line carries none (an HF dict: the text reader takes the step from
the progress bar before it). Values are floats, or None where the text is no number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

Parsed = tuple[int | None, dict[str, float | None]]

_NUM = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)\b"
_NUMBER = re.compile(rf"^\s*['\"]?(?P<n>{_NUM})['\"]?\s*[,;|]?\s*$", re.I)
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d*)?$")


def number(text: str) -> float | None:
    """A value as written in a log line: ``2.31``, ``1.264354E+01``, ``'3.412'``, ``nan``,
    ``Infinity``, ``2,097,152``; None for anything else (``30.1GiB``, ``1/294``)."""
    m = _NUMBER.match(text)
    if m is None:
        return None
    n = m.group("n").rstrip(",")  # "12," in "Step: 12, Rank: 0": the comma separates the fields
    if "," in n:
        if not _THOUSANDS.match(n):
            return None
        n = n.replace(",", "")
    try:
        return float(n)
    except ValueError:
        return None


@dataclass(frozen=True)
class LineForm:
    name: str
    example: str  # one real line of the form, shortened (docs, the "forms tried" error)
    parse: Callable[[str], Parsed | None]


def _pipe_fields(text: str) -> dict[str, float | None]:
    """``name: value`` fields between ``|`` (Megatron, llm.c, build-nanogpt)."""
    out = {}
    for part in text.split("|"):
        name, sep, value = part.rpartition(":")
        if not sep:
            # "norm 15.4 (+0.00z)" (llm.c's z-score after the value), "lr 1.00e-04"
            m = re.match(r"^\s*([A-Za-z][\w /.\-]*?)\s+(\S+)\s+\([^)]*\)\s*$", part)
            if m is None:
                m = re.match(r"^\s*([A-Za-z][\w/.\-]*(?: [A-Za-z][\w/.\-]*)*)\s+(\S+)\s*$", part)
            if m is None:
                continue
            name, value = m.group(1), m.group(2)
        name = name.strip()
        if name:
            out[name] = number(value.split("(")[0]) if "(" in value and not value.strip().startswith("(") else number(value)
    return out


# -- Megatron-LM ---------------------------------------------------------------------------------

_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)$")
_MEGATRON_EVAL = re.compile(r"validation loss at iteration\s+(\d+)\s*\|(.*)$")
_MEGATRON_NAMES = {"number of skipped iterations": "skipped_iterations", "number of nan iterations": "nan_iterations"}


def _megatron(segment: str) -> Parsed | None:
    m = _MEGATRON.search(segment)
    if m is not None:
        fields = _pipe_fields(m.group(2))
        return int(m.group(1)), {_MEGATRON_NAMES.get(k, k): v for k, v in fields.items()}
    m = _MEGATRON_EVAL.search(segment)
    if m is not None:
        fields = _pipe_fields(m.group(2))
        value = next((v for k, v in fields.items() if k.endswith("loss value")), None)
        return (int(m.group(1)), {"eval_loss": value}) if value is not None else None
    return None


# -- torchtitan ----------------------------------------------------------------------------------

_TITAN = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(.*)$")
_TITAN_PAIR = re.compile(r"([A-Za-z_][\w]*):\s+(\S+)")


def _torchtitan(segment: str) -> Parsed | None:
    m = _TITAN.search(segment)
    if m is None:
        return None
    values = {"loss": number(m.group(2))}
    values.update((k, number(v)) for k, v in _TITAN_PAIR.findall(m.group(3)))
    return int(m.group(1)), values


# -- nanoGPT -------------------------------------------------------------------------------------

#: The iteration line; variants print more ``name value`` fields before the time (a MoE fork's
#: ``iter 10: loss 10.8591, aux_loss 0.0508, time 1054.93ms``): read as what they are named.
_NANOGPT = re.compile(rf"^\s*iter (\d+): loss ({_NUM})((?:, [A-Za-z_][\w/]* (?:{_NUM}))*), time", re.I)
_NANOGPT_FIELD = re.compile(rf", ([A-Za-z_][\w/]*) ({_NUM})")
_NANOGPT_EVAL = re.compile(rf"^\s*step (\d+): train loss ({_NUM}), val loss ({_NUM})", re.I)


def _nanogpt(segment: str) -> Parsed | None:
    m = _NANOGPT.match(segment)
    if m is not None:
        values = {"loss": number(m.group(2))}
        values.update((name, number(v)) for name, v in _NANOGPT_FIELD.findall(m.group(3)) if name.lower() != "loss")
        return int(m.group(1)), values
    m = _NANOGPT_EVAL.match(segment)
    if m is not None:  # an evaluation of both splits: neither is the step's training loss
        return int(m.group(1)), {"eval_train_loss": number(m.group(2)), "eval_loss": number(m.group(3))}
    return None


# -- llm.c ---------------------------------------------------------------------------------------

_LLMC = re.compile(rf"^\s*step\s+(\d+)/\d+\s*\|\s*(?:train )?loss\s+({_NUM})(.*)$", re.I)
_LLMC_OLD = re.compile(rf"^\s*step (\d+): train loss ({_NUM})", re.I)
_LLMC_MAIN = re.compile(r"^\s*s:(\d+)\s+((?:\w+:\S+\s*)+)$")  # the -o main.log: "s:0 trl:11.0116 lr:0.000001 norm:14.96"
_LLMC_MAIN_NAMES = {"trl": "loss", "tel": "eval_loss", "eval": "hellaswag_acc", "norm": "grad_norm"}


def _llmc(segment: str) -> Parsed | None:
    m = _LLMC.match(segment)
    if m is not None:
        values = {"loss": number(m.group(2))}
        values.update(({"norm": "grad_norm"}.get(k, k), v) for k, v in _pipe_fields(m.group(3)).items() if k in ("norm", "lr"))
        return int(m.group(1)), values
    m = _LLMC_OLD.match(segment)
    if m is not None:
        return int(m.group(1)), {"loss": number(m.group(2))}
    m = _LLMC_MAIN.match(segment)
    if m is not None:
        pairs = (p.split(":", 1) for p in m.group(2).split())
        return int(m.group(1)), {_LLMC_MAIN_NAMES.get(k, k): number(v) for k, v in pairs}
    return None


# -- build-nanogpt's log.txt ------------------------------------------------------------------------

_BUILD_NANOGPT = re.compile(rf"^(\d+) (train|val|hella) ({_NUM})\s*$", re.I)
_BUILD_NANOGPT_NAMES = {"train": "loss", "val": "eval_loss", "hella": "hellaswag_acc"}


def _build_nanogpt(segment: str) -> Parsed | None:
    """``log/log.txt`` of Karpathy's build-nanogpt (GPT-2 reproductions): ``12 train 9.78``."""
    m = _BUILD_NANOGPT.match(segment)
    return (int(m.group(1)), {_BUILD_NANOGPT_NAMES[m.group(2).lower()]: number(m.group(3))}) if m else None


# -- PyTorch examples' word_language_model ----------------------------------------------------------

_WLM = re.compile(r"^\|\s*epoch\s+(\d+)\s*\|\s*(\d+)\s*/\s*(\d+)\s+batches\s*\|(.*)$", re.I)


def _word_language_model(segment: str) -> Parsed | None:
    """pytorch/examples' word_language_model/main.py: ``| epoch   1 |   200/ 2983 batches | lr 20.00 |
    ms/batch 11.61 | loss  5.21 | ppl   183.1``, the batch counting within its epoch: read at the run's
    batch, (epoch - 1) x batches + the count. (Its ``| end of epoch 1 | ... | valid loss 5.1 |`` line is
    a validation with no step: :func:`stepless_eval`.)"""
    m = _WLM.match(segment)
    if m is None:
        return None
    epoch, batch, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
    fields = {k: v for k, v in _pipe_fields(m.group(4)).items() if k in ("lr", "loss")}
    return (epoch - 1) * total + batch, {**fields, "epoch": float(epoch)}


# -- Hugging Face Trainer's printed dicts ---------------------------------------------------------

_HF_DICT = re.compile(r"\{'[^{}]*\}")
_HF_PAIR = re.compile(rf"'([^']+)':\s*('[^']*'|\"[^\"]*\"|{_NUM}|[A-Za-z_]\w*)", re.I)


def hf_dicts(segment: str) -> list[dict[str, float | None]]:
    """Every ``{'loss': 2.31, 'grad_norm': nan, ...}`` in a segment (after a tqdm bar, say). A dict
    is the Trainer's log when it names a loss or the epoch (``Trainer.log`` adds ``epoch`` to every
    dict it prints); a config printed as a dict (``{'sequence_len': 2048, 'n_layer': 20}``) is not."""
    out = []
    for text in _HF_DICT.findall(segment):
        pairs = _HF_PAIR.findall(text)
        if any(k == "epoch" or "loss" in k.lower() for k, _ in pairs):
            out.append({k: number(v) for k, v in pairs})
    return out


# -- Lightning's progress bar ----------------------------------------------------------------------

_LIGHTNING = re.compile(r"Epoch (\d+):\s*(?:\d+%)?\|[^|]*\|\s*(\d+)/(\d+|\?)\s*\[[^\]]*?,\s*[\d.?]+\s*(?:it/s|s/it),?\s*(.*?)\]")


def lightning_bar(segment: str) -> tuple[int, int, dict[str, float | None]] | None:
    """(epoch, batch within the epoch, the bar's logged values) of a Lightning TQDM progress bar
    that shows values (``train_loss=2.310``); None for other bars (validation, sanity check)."""
    m = _LIGHTNING.search(segment)
    if m is None:
        return None
    values = {}
    for pair in m.group(4).split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip() and name.strip() != "v_num":
            values[name.strip()] = number(value)
    if not any(v is not None for v in values.values()):
        return None
    return int(m.group(1)), int(m.group(2)), values


# -- OLMo's step blocks --------------------------------------------------------------------------

_OLMO = re.compile(r"\[step=(\d+)/\d+(?:,([^\]]*))?\]\s*$")


def _olmo(segment: str) -> Parsed | None:
    m = _OLMO.search(segment)
    if m is None:
        return None
    values = {}
    for pair in (m.group(2) or "").split(","):
        name, sep, value = pair.partition("=")
        if sep:
            values[name.strip()] = number(value)
    return int(m.group(1)), values


_CONTINUATION = re.compile(r"^\s+([A-Za-z][\w./ ()\-]*?)\s*=\s*(\S+)\s*$")


def continuation(line: str) -> tuple[str, float | None] | None:
    """An indented ``name=value`` line under a step header (OLMo prints one metric a line)."""
    m = _CONTINUATION.match(line)
    return (m.group(1), number(m.group(2))) if m else None


# -- an evaluation line with no step ----------------------------------------------------------------

_STEPLESS_EVAL = re.compile(rf"^\s*(?:validation|val|eval)(?: set)? (loss|bpb)\s*[:=]?\s*({_NUM})\s*$", re.I)
_EPOCH_END = re.compile(rf"^\|\s*end of epoch\s+\d+\s*\|.*?\bvalid (loss)\s+({_NUM})", re.I)
_BUILD_NANOGPT_EVAL = re.compile(rf"^validation loss: ({_NUM})\s*$")
#: ``Validation - loss=3.8854e+00 ppl=48.69 best_loss=3.8406e+00 best_ppl=46.55`` (kh-kim/simple-nmt's
#: epoch end): the word, then only name=value pairs.
_EVAL_PAIRS = re.compile(rf"^\s*(?:validation|valid|val|eval)\s*[-:|]?\s*((?:[A-Za-z_]\w*\s*=\s*(?:{_NUM})[\s,;|]*)+)$", re.I)
_ONE_PAIR = re.compile(rf"([A-Za-z_]\w*)\s*=\s*({_NUM})", re.I)


def stepless_eval(segment: str) -> tuple[dict[str, float | None], bool] | None:
    """A validation line with no step: ({"eval_loss": 3.2}, whether it belongs to the step line
    that *follows* it). build-nanogpt's train_gpt2.py prints ``validation loss: 3.2`` at the top
    of step N's iteration, before that step's ``step N | loss: ...`` line (its log.txt writes
    ``N val 3.2``): the step after. llm.c's ``val loss 3.2`` (printed before ``step N+1/...``,
    its loop counting from 0 and its lines from 1) and word_language_model's ``| end of epoch 1
    | ... | valid loss 5.10 | ...`` (after the epoch's last batch) belong to the line before."""
    m = _BUILD_NANOGPT_EVAL.match(segment)
    if m:
        return {"eval_loss": number(m.group(1))}, True
    m = _STEPLESS_EVAL.match(segment) or _EPOCH_END.match(segment)
    if m:
        return {f"eval_{m.group(1).lower()}": number(m.group(2))}, False
    m = _EVAL_PAIRS.match(segment)
    if m:  # simple-nmt's "Validation - loss=... ppl=... best_loss=...": the best so far is no measurement
        pairs = {f"eval_{k}": number(v) for k, v in _ONE_PAIR.findall(m.group(1)) if not k.lower().startswith("best")}
        return (pairs, False) if pairs else None
    return None


# -- generic key=value / key: value ------------------------------------------------------------------

_STEP_KEYS = ("step", "global_step", "iteration", "iter", "it", "steps", "global step", "train/global_step")
_PAIR = re.compile(
    rf"(?<![\w./])([A-Za-z_][\w./\-]*(?: [A-Za-z_][\w./\-]*){{0,2}}?)\s*[:=]\s*({_NUM}|'[^']*'|\"[^\"]*\")"
    rf"(?![\w.])",
    re.I,
)
_WORD_STEP = re.compile(r"\b(?:global[ _](?:batch|step)|step|iteration)\s+(\d+)\s*(?:\([^)]*\)\s*)?(?:[,|;]|$)", re.I)
_LEADING_STEP = re.compile(r"^\s*(?:\[[^\]]*\]\s*)*(step|iter|iteration)\s+(\d+)(?:\s*/\s*\d+)?\s*[|,:]", re.I)
#: The form of lines that count epochs and no steps (:func:`_epoch_counted`).
EPOCH_FORM = "epoch-counted"
#: A line that counts epochs and no steps, one row an epoch (its mean): ``Epoch 5 - ... loss=4.36``.
_LEADING_EPOCH = re.compile(r"^\s*(?:\[[^\]]*\]\s*)*epoch\s*[:=]?\s*(\d+)(?:\s*/\s*\d+)?\s*[-|,:]", re.I)


def _generic(segment: str) -> Parsed | None:
    step, values = _generic_fields(segment)
    if step is None or not any(v is not None for v in values.values()):
        return None
    return step, values


def _epoch_counted(segment: str) -> Parsed | None:
    """A line that counts epochs and no steps (kh-kim/simple-nmt's ``Epoch 5 - ... loss=4.36``):
    read at its epoch. The text reader numbers them in order instead where several share an
    epoch (a line a batch: ``Epoch 1 | loss: 2.31`` printed in the batch loop)."""
    if "%|" in segment:  # a progress bar counts batches
        return None
    m = _LEADING_EPOCH.match(segment)
    if m is None:
        return None
    step, values = _generic_fields(segment)
    if step is not None:  # the line counts steps too: the generic form's
        return None
    values.pop("epoch", None)
    if not any(v is not None for v in values.values()):
        return None
    return int(m.group(1)), values


def _generic_fields(segment: str) -> tuple[int | None, dict[str, float | None]]:
    """The step a ``key=value`` / ``key: value`` line counts (None: none) and its fields."""
    values: dict[str, float | None] = {}
    step = None
    lead = _LEADING_STEP.match(segment)
    if lead is not None:
        step = int(lead.group(2))
        rest = segment[lead.end() :]
        # "step 12 | loss 2.31 | norm 0.9": fields after a "|", "name value" ones too
        values.update(_pipe_fields(rest) if "|" in rest or segment[lead.end() - 1] == "|" else {})
    for name, value in _PAIR.findall(segment):
        values.setdefault(name, number(value))
    for key in list(values):
        if key.lower() in _STEP_KEYS and step is None:
            v = values.pop(key)
            if v is not None and v == int(v) and v >= 0:
                step = int(v)
        elif key.lower() in _STEP_KEYS:
            values.pop(key)
    m = re.search(r"\b(?:step|iter|iteration)\s*[:=]?\s*(\d+)\s*/\s*\d+", segment, re.I)
    if step is None and m is not None:
        step = int(m.group(1))
    m = _WORD_STEP.search(segment)
    if step is None and m is not None:  # Python logging: "Epoch 1, Global Batch 120, Training Loss: 3.2"
        step = int(m.group(1))
    return step, values


#: The forms, most specific first: a line is read by the first that accepts it.
FORMS: tuple[LineForm, ...] = (
    LineForm(
        "Megatron-LM", "iteration 100/500000 | ... | lm loss: 2.69E+00 | loss scale: 1.0 | grad norm: 0.87 | ...", _megatron
    ),
    LineForm("torchtitan", "step: 10  loss:  8.1234  grad_norm:  1.2  memory: 30.1GiB(31.7%)  tps: 1,234", _torchtitan),
    LineForm("nanoGPT", "iter 100: loss 3.4880, time 1444.41ms, mfu 0.01%", _nanogpt),
    LineForm("llm.c", "step    1/19560 | loss 11.0095 (+nanz)| norm 15.4 (+nanz)| lr 1.00e-06 | ...", _llmc),
    LineForm("OLMo", "[step=100/15000,epoch=0] followed by indented name=value lines", _olmo),
    LineForm("build-nanogpt log.txt", "12 train 9.782434", _build_nanogpt),
    LineForm(
        "word_language_model",
        "| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.61 | loss  5.21 | ppl 183.1",
        _word_language_model,
    ),
    LineForm("key=value / key: value", "step=100 loss=2.31 grad_norm=0.42", _generic),
    LineForm(EPOCH_FORM, "Epoch 5 - loss=4.3587e+00 ppl=78.23", _epoch_counted),
)
#: Forms the reader tries around a line rather than on it (named in the "forms tried" error).
OTHER_FORMS = (
    LineForm("HF Trainer dict", "{'loss': 2.31, 'grad_norm': 0.42, 'learning_rate': 2e-05, 'epoch': 0.1}", hf_dicts),
    LineForm(
        "Lightning progress bar", "Epoch 0:  45%|####5     | 450/1000 [00:30<00:37, 14.8it/s, train_loss=2.31]", lightning_bar
    ),
)
