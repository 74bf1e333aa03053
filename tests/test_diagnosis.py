import numpy as np
import pytest

from pytest_spikecheck import diagnose
from pytest_spikecheck.judge.diagnosis import _fade_steps
from pytest_spikecheck.records import Record
from pytest_spikecheck.records.events import Event
from pytest_spikecheck.records.facts import RunFacts
from pytest_spikecheck.scenario import ClipSpec

from short_runs import SHORT_BURST


def test_ladder_on_an_unclipped_burst(short_runs):
    d = diagnose(short_runs[1])
    assert d.step == SHORT_BURST
    rungs = [r for r, _ in d.lines]
    assert rungs == ["1 loss", "2 grad norm", "3 batch", "4 token losses", "5 tensors", "6 Adam v", "7 logits"]
    assert not d.facts["attention_logit_growth"]  # a data spike at lr 1e-2: the attention logits stay small
    assert d.facts["burst_samples"] == 3 and d.facts["ratio"] > 5
    assert "NOT clipped" in dict(d.lines)["2 grad norm"]
    assert d.verdict == "rare tokens + concentrated batch + no clip = one-step destabilisation"


def test_ladder_on_the_clipped_control(short_runs):
    d = diagnose(short_runs[0], SHORT_BURST)
    assert "clipped to 1, clip factor ×" in dict(d.lines)["2 grad norm"]
    assert d.facts["max_norm"] == 1.0 and d.facts["clipped"] is True and d.facts["contained"] is True
    assert "the clip contained it" in d.verdict
    assert "Diagnosis at step" in d.markdown()


def test_bare_arrays_get_the_first_rungs():
    g = [1.0] * 80
    g[60] = 40.0
    d = diagnose({"grad_norm_pre": g, "loss": [2.0] * 80})
    assert d.step == 61 and [r for r, _ in d.lines] == ["1 loss", "2 grad norm"]
    assert "post-clip norm not logged" in d.text() and "cannot be told" in d.verdict
    assert diagnose({"grad_norm_pre": [1.0] * 3}).text() == "diagnosis: no spike found in this record"


def _spike_at_81(**columns):
    """100 steps at norm 1 with a 40× spike at step 81, plus ``columns`` (each a function of pre)."""
    pre = np.ones(100)
    pre[80] = 40.0
    return {"grad_norm_pre": pre, **{name: make(pre) for name, make in columns.items()}}


def test_a_clip_seen_only_in_the_norms_is_not_called_unclipped():
    # Issue 11: pre 40 / post 1 without a clip_factor column read "NOT clipped ... unclipped".
    d = diagnose(_spike_at_81(loss=lambda p: np.full(100, 2.0), grad_norm_post=lambda p: np.minimum(p, 1.0)))
    assert d.step == 81 and d.facts["clipped"] is True
    assert "clipped to 1" in dict(d.lines)["2 grad norm"] and "NOT" not in d.text()
    assert "unclipped" not in d.verdict and "cannot be told" in d.verdict  # no max_norm: containment unknown
    assert (
        "the clip contained it (post-clip 1 ≤ max_norm 1)"
        in diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0)), max_norm=1.0).verdict
    )


def test_a_leak_is_never_called_contained():
    # Issue 11: post 3 > max_norm 1 (with a clip factor < 1) read "the clip contained it".
    def leaky(pre):
        post = np.minimum(pre, 1.0)
        post[80] = 3.0
        return post

    record = _spike_at_81(grad_norm_post=leaky, clip_factor=lambda p: np.minimum(1.0, 1.0 / p))
    d = diagnose(record, max_norm=1.0)
    assert d.facts["contained"] is False and "ABOVE max_norm 1" in dict(d.lines)["2 grad norm"]
    assert "LEAKED: post-clip 3 > max_norm 1" in d.verdict and "contained it" not in d.verdict
    assert "contained it" not in diagnose(record).verdict  # nor without a max_norm


def test_containment_tolerance_is_the_assertions():
    # The same rtol as assert_clip_contains: inside it contained, just past it a leak.
    inside = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0 + 5e-6)), max_norm=1.0)
    past = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0 + 2e-5)), max_norm=1.0)
    assert (inside.facts["contained"], past.facts["contained"]) == (True, False)
    # clipped means below the pre-clip norm by more than rounding
    same = diagnose(_spike_at_81(grad_norm_post=lambda p: p * (1 - 5e-7)), max_norm=100.0)
    assert same.facts["clipped"] is False and "NOT clipped: post-clip 40 = pre-clip" in same.text()


def test_no_loss_column_is_not_a_numeric_break():
    # Issue 11: no loss column and every value finite ended in "non-finite values".
    d = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0)))
    assert "train loss not logged" in dict(d.lines)["1 loss"]
    assert "non-finite" not in d.verdict and d.facts["nonfinite"] == []
    nan_loss = diagnose(_spike_at_81(loss=lambda p: np.where(p > 1, np.nan, 2.0)))
    assert nan_loss.verdict.startswith("non-finite values at step 81 (loss nan)")
    missing_loss = diagnose(_spike_at_81(loss=lambda p: [None if v > 1 else 2.0 for v in p]))
    assert "train loss not logged" in missing_loss.text() and "non-finite" not in missing_loss.verdict


# -- the full ladder without training: a stand-in for an engine Run ---------------------------


class _EngineRun:
    """What diagnose() reads of an engine Run (events, batches, declared events, facts)."""

    def __init__(self, events=(), batches=(), declared=(), clip_kind="global", max_norm=1.0):
        self.events = [Event.from_json(e) for e in events]  # the shape both writers write
        self.batches, self.declared_events = list(batches), tuple(declared)
        adaptive = clip_kind == "adaptive"
        self.facts = RunFacts(
            source="engine",
            clip=ClipSpec(kind=clip_kind, max_norm=max_norm, z=2.5 if adaptive else None, alpha=0.97 if adaptive else None),
        )

    def event_at(self, step):
        return next((e for e in self.events if e.step == step), None)

    def batch_at(self, step):
        return next((b for b in self.batches if b["step"] == step), None)

    def reproduce_command(self):
        return "spikecheck train fake.yaml --seed 0"


def _ladder_record(event_extra=None, declared=(50, 81, 500), **run_kwargs):
    pre = np.ones(100)
    pre[80] = 40.0
    post = np.minimum(pre, 2.0)  # clipped to the event's own limit (a clip to 1 under max_norm 2 is over-clipping)
    adam_v = np.ones(100)
    adam_v[80:85] = [3.0, 2.0, 1.5, 1.1, 1.0]  # back within 1.10x (1.1 itself counts) 3 steps after
    attn = np.full(100, 5.0)
    attn[80:] = 500.0
    attn[85] = 800.0  # the run's largest, 5 steps after the spike
    metrics = {
        "step": np.arange(1, 101),
        "loss": np.full(100, 2.0),
        "grad_norm_pre": pre,
        "grad_norm_post": post,
        "clip_factor": post / pre,
        "adam_v_norm": adam_v,
        "attn_logit_max": attn,
        "logz_mean": np.full(100, 3.3),
    }
    worst = [
        {"token": t, "loss": loss, "novel": novel, "rare": rare}
        for t, loss, novel, rare in [
            ("zq", 9.3, True, True),
            ("ab", 7.5, False, True),
            ("the", 6.0, False, False),
            ("x", 5.0, False, False),
            ("y", 4.0, False, False),
            ("sixth", 3.0, False, False),
        ]
    ]
    event = {
        "step": 81,
        "max_norm": 2.0,
        "token_losses": {
            "worst": worst,
            "rare_loss_share": 0.25,
            "novel_loss_share": 0.125,
            "novel_tokens": 2,
            "mean": 3.5,
            "p90": 5.25,
            "max": 9.3,
        },
        "param_grad_norms": {"wte": 3.0, "h0.attn": 4.0, "h1.mlp": 1.0, "ln_f": 0.5},
        "adam_surprise": {"share": 0.0125, "threshold": 8},
        **(event_extra or {}),
    }
    batch = {
        "step": 81,
        "samples": [0, 1, 2, 3],
        "sources": {"web": 3, "code": 1},
        "rare_samples": 2,
        "rare_tokens": 7,
        "burst_samples": 3,
        "injected": ["b1", "b2"],
    }
    return Record(metrics, _EngineRun([event], [batch], declared, **run_kwargs), "fake run")


def test_every_rung_of_an_engine_record_word_for_word():
    # Every rung's numbers are the record's: 4 samples, 3 web + 1 code, wte 3² of 26.25 = 34 %,
    # v 1 -> 3 and back to 1.1 three steps later, the event's own max_norm 2 (not the scenario's 1).
    d = diagnose(_ladder_record())
    assert d.step == 81  # the declared event with the largest ratio (50 has ratio 1; 500 is not logged)
    assert d.text() == (
        "diagnosis at step 81:\n"
        "  1 loss          train loss 2.000 vs median 2.000 over the 50 steps before\n"
        "  2 grad norm     pre-clip 40 = 40.0× the baseline 1; clipped to 2, clip factor ×0.05; within max_norm 2\n"
        "  3 batch         4 samples (3 web, 1 code); 2 with rare tokens (7 rare-token occurrences); "
        "3 injected by a burst: b1, b2\n"
        "  4 token losses  mean 3.50, p90 5.25, max 9.30 nats; worst: 'zq' 9.3†, 'ab' 7.5*, 'the' 6.0, 'x' 5.0, "
        "'y' 4.0 (* rare, † never trained on before); rare tokens carry 25% of the batch loss, 2 never-seen tokens 12%\n"
        "  5 tensors       wte 3 (34% of ‖g‖²); h0.attn 4 (61% of ‖g‖²); h1.mlp 1 (4% of ‖g‖²)\n"
        "  6 Adam v        sqrt(Σv) jumps ×3.00, back within 1.10× after 3 steps; 1.2% of weights have |g|/√v̂ > 8\n"
        "  7 logits        attention logits 500 at step 81 (×100 since step 10); largest 800 at step 86; "
        "output log Z 3.3: attention-logit growth; qk-layernorm contains it\n"
        "  => rare tokens concentrated in one batch; the clip contained it (post-clip 2 ≤ max_norm 2); attention "
        "logits grew beyond control (attention-logit growth: qk-layernorm contains it)"
    )
    lines = d.markdown().splitlines()  # the one renderer (diagnosis_markdown): aligned, escaped cells
    assert lines[:2] == ["**Diagnosis at step 81**", ""] and lines[2].split() == ["|", "rung", "|", "finding", "|"]
    assert lines[4].startswith("| 1 loss ") and "train loss 2.000 vs median 2.000 over the 50 steps before" in lines[4]
    assert "have \\|g\\|/√v̂ > 8" in d.markdown()
    assert d.markdown().endswith(f"\n\n**Verdict:** {d.verdict}\n")
    assert {
        k: d.facts[k]
        for k in (
            "rare_samples",
            "burst_samples",
            "injected",
            "rare_loss_share",
            "novel_loss_share",
            "worst_tokens",
            "top_tensor",
            "v_jump",
            "v_fade",
            "adam_surprise",
            "max_norm",
        )
    } == {
        "rare_samples": 2,
        "burst_samples": 3,
        "injected": ["b1", "b2"],
        "rare_loss_share": 0.25,
        "novel_loss_share": 0.125,
        "worst_tokens": ["zq", "ab", "the", "x", "y"],
        "top_tensor": "wte",
        "v_jump": 3.0,
        "v_fade": 3,
        "adam_surprise": 0.0125,
        "max_norm": 2.0,
    }


def _grad(**columns):
    """100 steps at pre-clip norm 1 with a 40x spike at step 81; ``columns`` as in _spike_at_81, or arrays."""
    record = _spike_at_81()
    record.update({k: (make(record["grad_norm_pre"]) if callable(make) else make) for k, make in columns.items()})
    return record


_EVAL_AT = np.arange(100) % 10 == 9  # evaluated at steps 10, 20, ..., 100


@pytest.mark.parametrize(
    ("record", "kwargs", "rung", "verdict"),
    [
        (
            _grad(clip_factor=lambda p: np.minimum(1, 1 / p)),
            {"max_norm": 1.0},
            "clipped ×0.025 by the clip factor (post-clip norm not logged)",
            "an outlier batch; clipped, but the post-clip norm is not logged, so whether it was contained cannot be told",
        ),
        (
            _grad(grad_norm_post=lambda p: p.copy()),
            {},
            "NOT clipped: post-clip 40 = pre-clip",
            "a 40× gradient spike reached the optimizer unclipped",
        ),
        (
            _grad(grad_norm_post=lambda p: p * 1.25, clip_factor=lambda p: np.ones(100)),
            {"max_norm": 2.0},
            "NOT clipped: post-clip 50 ≥ pre-clip 40, clip factor ×1; ABOVE max_norm 2",
            "a 40× gradient spike reached the optimizer unclipped",
        ),
        (
            _grad(clip_factor=lambda p: np.ones(100)),
            {},
            "NOT clipped: clip factor ×1 (post-clip norm not logged)",
            "a 40× gradient spike reached the optimizer unclipped",
        ),
        (
            _grad(),
            {},
            "post-clip norm not logged",
            "a 40× gradient spike; the record has no post-clip norm, so whether a clip contained it cannot be told",
        ),
        (
            _grad(clip_factor=lambda p: np.where(p > 1, np.nan, 1.0)),
            {},
            "post-clip norm not logged, clip factor ×nan",
            "a 40× gradient spike; the record has no post-clip norm, so whether a clip contained it cannot be told",
        ),
        (
            _grad(grad_norm_post=lambda p: np.minimum(p, 1.0)),
            {},
            "clipped to 1",
            "an outlier batch; clipped, but the record does not say what max_norm was, so whether it was contained cannot be told",
        ),
        (
            _grad(grad_norm_pre=lambda p: np.where(p > 1, 3.0, 1.0), grad_norm_post=lambda p: np.minimum(p, 5.0)),
            {},
            "NOT clipped: post-clip 5 ≥ pre-clip 3",
            "a 3× gradient spike reached the optimizer unclipped",
        ),  # 3x is a spike
        (
            _grad(grad_norm_pre=lambda p: np.where(p > 1, 2.99, 1.0)),
            {"step": 81},
            "post-clip norm not logged",
            "no clear spike (ratio 3.0×)",
        ),
        (
            _grad(grad_norm_pre=lambda p: np.where(p > 1, np.nan, 1.0), grad_norm_post=lambda p: np.minimum(p, 1.0)),
            {"step": 81, "max_norm": 1.0},
            "post-clip 1: whether it was clipped cannot be told; within max_norm 1",
            "non-finite values at step 81 (grad_norm_pre nan): a numeric break (overflow, 0/0), not a data spike",
        ),
    ],
)
def test_the_grad_norm_rung_and_the_verdict_for_each_clip_outcome(record, kwargs, rung, verdict):
    d = diagnose(record, **kwargs)
    assert d.lines[1][1].split("; ", 1)[1] == rung
    assert d.verdict == verdict


@pytest.mark.parametrize(
    ("eval_loss", "loss_rung", "recovery", "jump"),
    [
        # up 2 nats at the first evaluation after the spike (step 90), back at step 100: 19 steps
        (
            np.where(_EVAL_AT, np.where((np.arange(100) >= 80) & (np.arange(100) < 90), 4.0, 2.0), np.nan),
            "train loss not logged; eval loss jumps +2.000 and is back within 1.10× in 19 steps",
            19,
            2.0,
        ),
        (
            np.where(_EVAL_AT, np.where(np.arange(100) >= 80, 4.0, 2.0), np.nan),
            "train loss not logged; eval loss jumps +2.000 and is not back within 1.10× in the 50 steps after",
            None,
            2.0,
        ),
        (
            np.where(np.arange(100) < 50, 2.0, np.nan),
            "train loss not logged; the eval loss around this step was not logged",
            None,
            None,
        ),
    ],
)
def test_the_loss_rung_reads_the_eval_loss(eval_loss, loss_rung, recovery, jump):
    d = diagnose(_grad(eval_loss=eval_loss))
    assert d.lines[0] == ("1 loss", loss_rung)
    assert d.facts["recovery"] == recovery
    assert np.isnan(d.facts["eval_jump"]) if jump is None else d.facts["eval_jump"] == jump


def test_without_a_gradient_norm_the_verdict_says_so():
    assert diagnose({"loss": _spike_at_81()["grad_norm_pre"]}).verdict == (
        "no gradient norm logged at step 81: whether it spiked cannot be told"
    )
    d = diagnose({"grad_norm_pre": [1.0] * 80 + [None] + [1.0] * 19}, 81)
    assert d.lines[1][1] == "pre-clip not logged; post-clip norm not logged"
    assert d.verdict == "no grad_norm_pre logged at step 81: whether it spiked cannot be told"
    assert diagnose({"grad_norm_pre": [1.0] * 3}).markdown() == "No spike found in this record.\n"


@pytest.mark.parametrize(
    ("run_kwargs", "event_extra", "max_norm", "limit"),
    [
        ({}, {}, None, 2.0),  # the event's own limit
        ({}, {"max_norm": None}, None, 1.0),  # else the facts'
        ({"clip_kind": "adaptive"}, {"max_norm": None}, None, None),  # an adaptive limit is only in events (format 1)
        ({}, {}, 0.5, 0.5),  # the caller's wins
    ],
)
def test_the_clip_limit_comes_from_the_caller_the_event_or_the_facts(run_kwargs, event_extra, max_norm, limit):
    assert diagnose(_ladder_record(event_extra, **run_kwargs), max_norm=max_norm).facts["max_norm"] == limit


def test_the_declared_event_with_the_largest_ratio_is_diagnosed():
    assert diagnose(_ladder_record(declared=(50, 81))).step == 81
    assert diagnose(_ladder_record(declared=(81, 50))).step == 81
    assert diagnose(_ladder_record(declared=(5, 3))).step == 5  # no ratio (too early) for either: the first
    assert diagnose(_ladder_record(declared=(500,))).step == 81  # not logged: the largest spike instead


@pytest.mark.parametrize(
    ("adam_v", "fade"),
    [
        ([1.0, 3.0, 2.0, 1.1], 2),  # 1.1 is within 1.10x of 1.0
        ([1.0, 3.0, 2.0, 1.2], None),  # never back
        ([1.0, 1.05, 2.0, 3.0], 0),  # never left
        ([0.0, 3.0, 0.0, 0.0], None),  # no level before: no fade to measure
        ([np.nan, 3.0, 1.0, 1.0], None),
        ([1.0, 3.0, np.nan, 1.0], 2),  # a NaN is not "back"
    ],
)
def test_adam_v_fade(adam_v, fade):
    assert _fade_steps({"step": np.array([80, 81, 82, 83]), "adam_v_norm": np.array(adam_v)}, 81) == fade
    assert _fade_steps({"step": np.array([80, 81])}, 81) is None  # no adam_v_norm column


def test_the_facts_are_the_records_numbers():
    d = diagnose(
        _grad(loss=np.full(100, 2.5), grad_norm_post=lambda p: np.minimum(p, 1.0), clip_factor=lambda p: np.minimum(1, 1 / p)),
        max_norm=1.0,
    )
    assert d.facts == {
        "loss": 2.5,
        "loss_baseline": 2.5,
        "grad_norm_pre": 40.0,
        "baseline": 1.0,
        "ratio": 40.0,
        "grad_norm_post": 1.0,
        "clip_factor": 0.025,
        "max_norm": 1.0,
        "clipped": True,
        "contained": True,
        "overclipped": False,
        "skipped": None,
        "nonfinite": [],
    }


def test_shares_of_a_non_finite_total_print_as_a_dash_with_the_reason():
    """Rungs 5-6 at a step whose gradient is not finite printed ``inf (nan% of ‖g‖²)`` and ``nan% of
    weights``: a percentage of a non-finite total is no number."""
    record = _ladder_record(
        {"param_grad_norms": {"wte": float("inf"), "h0.attn": 4.0}, "adam_surprise": None}
    )  # as the engine records it at a non-finite step
    lines = dict(diagnose(record, 81).lines)
    assert lines["5 tensors"] == ("wte inf (—); h0.attn 4 (—) (no shares: the step's gradient norm is not finite)")
    assert lines["6 Adam v"].endswith("— of weights have |g|/√v̂ > 10 (not measured: the step's gradient is not finite)")
    assert "nan%" not in " ".join(lines.values())
