"""The defence bugs that shipped (docs/defence-bugs.md): their breaks refuse what they cannot
mean before anything trains, their assertions judge arrays, and the attention-logit column is
recorded whatever the defences (Megatron-Bridge PR 5329's monitoring bug). The trained twins are
scenarios/test_shipped_defence_bugs.py; the runs here are 2 steps of the nano GPT."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    ClipInfToLog,
    ClipMuonUpdate,
    ConfigError,
    GatedAttention,
    LogitSoftcap,
    QKClip,
    QKLayerNorm,
    Scenario,
    SkipStepCounter,
    ZLoss,
    assert_clip_keeps_finite,
    assert_finite,
    assert_muon_update_scale,
    assert_optimizer_steps,
    train,
)
from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.records import Record
from pytest_spikecheck.errors import SpikeCheckError
from pytest_spikecheck.scenario.break_base import break_from_config, break_to_config

NANO = Scenario.preset("phase-19").replace(steps=2, seed=0, model=GPTConfig(arch="gpt", n_layer=2, n_head=2, n_embd=32))


def test_the_breaks_are_named_in_yaml_and_refuse_what_they_cannot_mean():
    assert break_from_config("clip_muon_update") == ClipMuonUpdate()
    assert break_from_config({"skip_step_counter": {"ratio": 3.0}}) == SkipStepCounter(ratio=3.0)
    assert break_to_config(SkipStepCounter(ratio=3.0)) == {"skip_step_counter": {"ratio": 3.0}}
    with pytest.raises(ConfigError, match=r"^optimizer.clip_when muon_update \(ClipMuonUpdate\) needs optimizer.name muon"):
        NANO.with_breaks(ClipMuonUpdate()).resolved()
    with pytest.raises(ConfigError, match=r"needs optimizer.name muon and a global clip .*grad_clip None"):
        NANO.replace(optimizer__name="muon", optimizer__grad_clip=None).with_breaks(ClipMuonUpdate()).resolved()
    with pytest.raises(ConfigError, match=r"^optimizer.step_counter frozen \(SkipStepCounter\) is AdamW's counter"):
        NANO.replace(optimizer__name="muon").with_breaks(SkipStepCounter()).resolved()
    with pytest.raises(ConfigError, match=r"^optimizer.step_counter must be advance or frozen, was 'stuck'$"):
        NANO.replace(optimizer__step_counter="stuck").resolved()
    with pytest.raises(ConfigError, match=r"SkipStepCounter\(ratio=...\) must be > 1, was 1.0"):
        SkipStepCounter(ratio=1.0)
    with pytest.raises(ConfigError, match=r"^ClipMuonUpdate \(clip_when muon_update\) is declared on one process"):
        train(NANO.replace(optimizer__name="muon").with_breaks(ClipMuonUpdate()), nproc=2)


def test_clip_inf_to_log_is_named_in_yaml_and_refuses_a_clip_or_several_ranks(tmp_path):
    from run_schema import validate_run_folder

    assert break_from_config("clip_inf_to_log") == ClipInfToLog()
    run = train(NANO.with_breaks(ClipInfToLog()))  # a healthy run: the call multiplies by 1, nothing shows
    assert run.facts.clip.when == "inf_to_log" and run.facts.max_norm is None and np.isfinite(run["grad_norm_post"]).all()
    validate_run_folder(run.save(tmp_path / "run"))
    resolved = NANO.with_breaks(ClipInfToLog()).resolved()
    assert (resolved.optimizer.grad_clip, resolved.optimizer.clip_when) == (None, "inf_to_log")
    with pytest.raises(
        ConfigError,
        match=r"^optimizer.clip_when inf_to_log \(ClipInfToLog\) is the logging call of a run "
        r"that does not clip: grad_clip must be null, was 1.0$",
    ):
        NANO.replace(optimizer__clip_when="inf_to_log").resolved()
    with pytest.raises(ConfigError, match=r"^ClipInfToLog \(clip_when inf_to_log\) is declared on one process"):
        train(NANO.with_breaks(ClipInfToLog()), nproc=2)


def _norms(pre: float, post: float, limit: float = float("inf"), finite_pre: float | None = None) -> Record:
    """Three steps, the third with the given pre- and post-clip norms; ``finite_pre``: that step's
    recorded ``grad_finite_pre`` (None: no such column, as in a log)."""
    steps = np.arange(1, 4)
    metrics = {
        "step": steps,
        "loss": np.array([3.0, 2.9, 2.8]),
        "grad_norm_pre": np.array([1.0, 1.1, pre]),
        "grad_norm_post": np.array([1.0, 1.1, post]),
        "clip_limit": np.full(3, limit),
    }
    missing = {}
    if finite_pre is not None:
        metrics["grad_finite_pre"] = np.array([np.nan, np.nan, finite_pre])
        missing["grad_finite_pre"] = np.array([True, True, False])
    return Record(metrics=metrics, missing=missing)


def test_assert_finite_names_the_clip_coefficient_of_an_infinite_norm():
    # the bug's signature: an infinite norm, then NaN gradients, with no clip
    with pytest.raises(
        AssertionError,
        match=r"^non-finite grad_norm_pre at step 3 \(inf\); the gradient norm was inf and "
        r"then every gradient NaN .*inf / inf = NaN .*clip_grad_norm_\(max_norm=inf\) "
        r".*torch.nn.utils.get_total_norm",
    ):
        assert_finite(_norms(float("inf"), float("nan")))
    # finite gradients whose float32 norm overflowed: said as that, not as the clip
    with pytest.raises(
        AssertionError,
        match=r"^non-finite grad_norm_pre at step 3 \(inf\); every gradient is finite "
        r"\(their float64 norm is 1.06e\+21\): only the norm overflowed",
    ):
        assert_finite(_norms(float("inf"), 1.06e21))
    # a NaN gradient (NaN pre-clip norm), NaN after a real clip, or a record that does not state its
    # clip limit (a log without the column): no cause claimed
    unstated = _norms(float("inf"), float("nan"))
    del unstated.metrics["clip_limit"]
    for record in (_norms(float("nan"), float("nan")), _norms(float("inf"), float("nan"), limit=1.0), unstated):
        with pytest.raises(AssertionError) as caught:
            assert_finite(record)
        assert "inf / inf" not in str(caught.value) and "only the norm overflowed" not in str(caught.value)


def test_assert_clip_keeps_finite_fails_exactly_where_the_clip_turned_finite_gradients_non_finite():
    """The clip_inf_to_log bug's own harm, read from the record alone: finite gradients before the
    clip (a finite pre-clip norm, or grad_finite_pre 1 where it overflowed), non-finite after."""
    bug = _norms(float("inf"), float("nan"), finite_pre=1.0)
    with pytest.raises(
        AssertionError,
        match=r"^at step 3 the clip turned finite gradients non-finite: every gradient element was finite "
        r"before the clip \(grad_finite_pre 1; only their norm overflowed to inf, summed in the gradients' "
        r"dtype\), but the optimizer received nan \(grad_norm_post\); with no clip \(clip_limit inf\) that is "
        r"torch.nn.utils.clip_grad_norm_\(max_norm=inf\) called only to log the norm: its coefficient "
        r"max_norm / norm = inf / inf = NaN .*torch.nn.utils.get_total_norm.*\n",
    ):
        assert_clip_keeps_finite(bug)
    with pytest.raises(SpikeCheckError) as caught:
        assert_clip_keeps_finite(bug)
    verdict = caught.value.verdict
    assert (verdict.assertion, verdict.passed, verdict.step, verdict.metric) == (
        "assert_clip_keeps_finite",
        False,
        3,
        "grad_norm_post",
    )
    # the fixed twin: the same finite gradients reach the optimizer (its divergence is assert_finite's)
    twin = _norms(float("inf"), 2.56e25, finite_pre=1.0)
    assert assert_clip_keeps_finite(twin) == {"judged": 3, "norm_overflowed": 1, "not_judged": 0}
    # an element already inf before the clip (torch's clip then makes it NaN too): not this bug
    assert assert_clip_keeps_finite(_norms(float("inf"), float("nan"), finite_pre=0.0))["norm_overflowed"] == 0
    # a log that records only the norm: that step is not judged (unknown), the others are
    assert assert_clip_keeps_finite(_norms(float("inf"), float("nan"))) == {"judged": 2, "norm_overflowed": 0, "not_judged": 1}
    # finite before by its norm, NaN after: caught whatever the limit, the cause said generally
    with pytest.raises(
        AssertionError, match=r"^at step 3 .*\(grad_norm_pre 2\), but the optimizer received nan .*something between"
    ):
        assert_clip_keeps_finite(_norms(2.0, float("nan"), limit=1.0))
    # a pre-clip norm measured in float64 (the HF callback's taps) above float32's limit: the same cause
    with pytest.raises(AssertionError, match=r"^at step 3 .*\(grad_norm_pre 4.24e\+19\).*inf / inf = NaN"):
        assert_clip_keeps_finite(_norms(4.24e19, float("nan")))
    # a skipped step hands the optimizer nothing: not judged
    skipped = _norms(float("inf"), float("nan"), finite_pre=1.0)
    skipped.skipped[3] = "overflow"
    assert assert_clip_keeps_finite(skipped)["judged"] == 2
    with pytest.raises(ConfigError, match=r"^the record has no 'grad_norm_post' column: assert_clip_keeps_finite compares"):
        assert_clip_keeps_finite({"step": [1, 2], "grad_norm_pre": [1.0, 2.0]})
    with pytest.raises(ConfigError, match=r"^no step to judge"):
        assert_clip_keeps_finite({"grad_norm_pre": [float("inf")], "grad_norm_post": [float("nan")]})


def _guard_clip_keeps_finite_catches_the_bug() -> None:
    """What the tests above check, on the bug's record and its twin's."""
    with pytest.raises(SpikeCheckError, match=r"the clip turned finite gradients non-finite"):
        assert_clip_keeps_finite(_norms(float("inf"), float("nan"), finite_pre=1.0))
    assert assert_clip_keeps_finite(_norms(float("inf"), 2.56e25, finite_pre=1.0))["norm_overflowed"] == 1


def _rule_ignores_the_recorded_fact(rec):
    """A rule that reads the pre-clip norm only: an infinite norm is 'unknown', so the bug is never judged."""
    pre = np.asarray(rec.metrics["grad_norm_pre"], dtype=np.float64)
    return np.where(np.isfinite(pre), 1.0, np.nan)


def _rule_takes_an_infinite_norm_for_infinite_gradients(rec):
    """A rule that reads an infinite pre-clip norm as a non-finite gradient: the bug reads as a diverged run."""
    pre = np.asarray(rec.metrics["grad_norm_pre"], dtype=np.float64)
    return np.where(np.isfinite(pre), 1.0, 0.0)


@pytest.mark.parametrize("sabotage", [_rule_ignores_the_recorded_fact, _rule_takes_an_infinite_norm_for_infinite_gradients])
def test_the_clip_inf_to_log_check_fails_when_its_rule_is_sabotaged(sabotage, monkeypatch):
    from pytest_spikecheck.judge import update_checks

    _guard_clip_keeps_finite_catches_the_bug()  # the honest rule passes its guard
    monkeypatch.setattr(update_checks, "finite_before_clip", sabotage)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):  # the bug now passes unnoticed
        _guard_clip_keeps_finite_catches_the_bug()


def _diverging_sgd_with_the_logging_call() -> Scenario:
    # unclipped SGD at lr 1 (momentum 0.95, Nesterov): at step 21 its float32 norm overflows with every
    # gradient finite, and the run stops there (scenarios/test_shipped_defence_bugs.py has the twin)
    from pytest_spikecheck import HighLR

    return NANO.replace(steps=24, optimizer__name="sgd").with_breaks(HighLR(1.0), ClipInfToLog())


def test_the_engine_records_the_fact_the_check_needs_and_the_check_goes_blind_without_it(monkeypatch):
    """The engine measures grad_finite_pre before torch's clip runs. Sabotage: measured after it
    (on the NaN it made), the bug's step reads as gradients already non-finite and passes unnoticed."""
    import math

    from pytest_spikecheck.training import step

    def guard(run) -> None:
        assert run["step"][-1] == 21 and np.isinf(run["grad_norm_pre"][-1]) and np.isnan(run["grad_norm_post"][-1])
        with pytest.raises(SpikeCheckError, match=r"^at step 21 the clip turned finite gradients non-finite: .*inf / inf = NaN"):
            assert_clip_keeps_finite(run)

    bug = train(_diverging_sgd_with_the_logging_call())
    guard(bug)
    # the fact is written at the one step whose pre-clip norm is not finite, null elsewhere
    assert bug.metrics.missing["grad_finite_pre"].tolist() == [True] * 20 + [False] and bug["grad_finite_pre"][-1] == 1.0
    after_the_call = lambda sharding, grad_norm_pre: math.nan if math.isfinite(grad_norm_pre) else 0.0  # noqa: E731
    monkeypatch.setattr(step, "gradients_finite", after_the_call)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        guard(train(_diverging_sgd_with_the_logging_call()))


def _recorded_loop(log_with: str, tmp_path=None):
    """Someone else's one-step loop under the recorder: an input of 3e19 gives a finite weight
    gradient whose float32 norm overflows (4.24e19 in float64), its norm logged inside
    rec.clipping() with ``log_with``; the run as recorded (saved and loaded where ``tmp_path``)."""
    import math

    import torch

    from pytest_spikecheck import Run, record

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = record(model, sgd)
    loss = model(torch.full((1, 2), 3e19)).sum()
    loss.backward()
    with rec.clipping():
        if log_with == "clip_grad_norm_":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)
        else:
            torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    sgd.step()
    rec.step(loss=loss)
    return Run.load(rec.save(tmp_path / "run")) if tmp_path is not None else rec.run()


@pytest.mark.parametrize("log_with", ["clip_grad_norm_", "get_total_norm"])
def test_a_recorded_loop_that_logs_the_norm_through_clip_inf_gets_the_same_cause(log_with, tmp_path):
    """Logging the norm with clip_grad_norm_(max_norm=inf) inside rec.clipping() turns the gradient
    NaN: assert_finite names that from the recorded norms alone and assert_clip_keeps_finite fails
    it from the recorded fact; get_total_norm (the fix) leaves it finite: assert_clip_keeps_finite
    passes, and assert_finite's failure names the overflowed norm instead (read back from the folder)."""
    run = _recorded_loop(log_with, tmp_path)
    cause = (
        r"the gradient norm was inf and then every gradient NaN"
        if log_with == "clip_grad_norm_"
        else r"every gradient is finite \(their float64 norm is 4.24e\+19\): only the norm overflowed"
    )
    with pytest.raises(AssertionError, match=r"^non-finite grad_norm_pre at step 1 \(inf\); " + cause):
        assert_finite(run)
    # the recorder measured the gradient again in float64 before the call: finite (only the norm overflowed)
    assert run.metrics["grad_finite_pre"].tolist() == [1.0]
    if log_with == "clip_grad_norm_":  # the logging call turned it NaN: caught, the cause named
        with pytest.raises(AssertionError, match=r"^at step 1 the clip turned finite gradients non-finite: .*inf / inf = NaN"):
            assert_clip_keeps_finite(run)
    else:  # the fix: the gradient reached the optimizer finite (assert_finite still fails the norm)
        assert assert_clip_keeps_finite(run) == {"judged": 1, "norm_overflowed": 1, "not_judged": 0}


def test_the_recorder_measures_the_fact_in_float64_and_the_check_goes_blind_without_it(monkeypatch):
    """Sabotage: the recorder measures the gradient again in its own dtype (float32), so its norm
    overflows again and the finite gradient reads as non-finite: the bug passes unnoticed."""
    import torch

    from pytest_spikecheck.integrations import recorder

    def guard() -> None:
        with pytest.raises(SpikeCheckError, match=r"the clip turned finite gradients non-finite"):
            assert_clip_keeps_finite(_recorded_loop("clip_grad_norm_"))

    guard()
    monkeypatch.setattr(recorder, "float64_norm", lambda grads: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        guard()


def test_assert_muon_update_scale_on_arrays():
    steps = np.arange(1, 5)
    healthy = {"step": steps, "muon_update_ratio": np.array([0.88, 0.87, 0.9, 0.89])}
    assert assert_muon_update_scale(healthy)["min"] == pytest.approx(0.87)
    clipped = {
        **healthy,
        "muon_update_ratio": np.array([0.043, 0.043, 0.9, 0.04]),
        "update_clip_norm": np.array([21.2, 21.1, 1.0, 21.0]),
    }
    with pytest.raises(
        AssertionError,
        match=r"^Muon's update at step 4 was 0.04x its expected scale \(allowed 0.5-2x\): "
        r"the step was attenuated 25x by something other than the lr; the clip was "
        r"taken over Muon's update and divided it by 21 \(update_clip_norm\)",
    ):
        assert_muon_update_scale(clipped)
    with pytest.raises(AssertionError, match=r"at step 2 was 3x .*amplified 3x by something other than the lr\n"):
        assert_muon_update_scale({**healthy, "muon_update_ratio": np.array([1.0, 3.0, 1.0, 1.0])})
    with pytest.raises(Exception, match=r"no 'muon_update_ratio' column"):
        assert_muon_update_scale({"step": steps, "loss": np.ones(4)})


def test_assert_optimizer_steps_counts_applied_steps_only():
    steps = np.arange(1, 6)
    skipping = Record(metrics={"step": steps, "optimizer_steps": np.array([1.0, 2.0, 2.0, 3.0, 4.0])}, skipped={3: "skip_spikes"})
    assert assert_optimizer_steps(skipping) == {"applied": 4, "counted": 4}
    # a counter that advances at a skipped step counts a step that never reached the weights
    counted_skip = Record(metrics={"step": steps, "optimizer_steps": np.arange(1.0, 6.0)}, skipped={3: "skip_spikes"})
    with pytest.raises(AssertionError, match=r"^at step 3 the optimizer counted 3 steps but 2 were applied \(1 skipped\)\n"):
        assert_optimizer_steps(counted_skip)
    # the failure carries its verdict (issue 33): what was measured against what, at which step
    with pytest.raises(SpikeCheckError) as caught:
        assert_optimizer_steps(counted_skip)
    verdict = caught.value.verdict
    assert (verdict.assertion, verdict.passed, verdict.step, verdict.measured, verdict.limit) == (
        "assert_optimizer_steps",
        False,
        3,
        3.0,
        2.0,
    )
    frozen = Record(metrics={"step": steps, "optimizer_steps": np.zeros(5)})
    with pytest.raises(AssertionError, match=r"^at step 1 the optimizer counted 0 steps but 1 were applied"):
        assert_optimizer_steps(frozen)


@pytest.mark.parametrize(
    "defence",
    [None, QKClip(tau=30.0), QKLayerNorm(), LogitSoftcap(), ZLoss(), GatedAttention()],
    ids=lambda d: "none" if d is None else d.config_name,
)
def test_attn_logit_max_is_recorded_whatever_the_defences(defence):
    """Megatron-Bridge PR 5329: the max attention logit was logged only with QK-Clip on. Here the
    column is the model's own stat, recorded at every step with any defence or none."""
    run = train(NANO if defence is None else NANO.with_breaks(defence))
    column = run.metrics["attn_logit_max"]
    assert len(column) == 2 and np.all(np.isfinite(column)) and np.all(column > 0)


def test_attn_logit_max_is_recorded_under_muon_without_qk_clip():
    run = train(NANO.replace(optimizer__name="muon", optimizer__lr=0.02))
    assert np.all(np.isfinite(run.metrics["attn_logit_max"])) and "qk_clipped_heads" not in run.metrics
    assert np.all(np.isfinite(run.metrics["muon_update_ratio"]))  # the update recorder reads Muon's step too


def test_attn_logit_max_is_recorded_by_the_recorder_without_qk_clip():
    """The same rule for someone else's loop: the recorder turns on a model's stats hook and
    records its attn_logit_max at every step, with no QK-Clip anywhere; with micro-batches handed
    over one at a time (the HF and Lightning callbacks' gatherer) the step's value is their largest.
    A model without the hook gets no column (not a column of NaN)."""
    import torch

    from pytest_spikecheck import record
    from pytest_spikecheck.training.build import build_model
    from pytest_spikecheck.training.step import model_stats

    torch.manual_seed(0)
    model = build_model(NANO, vocab_size=50)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rec = record(model, optimizer)
    assert model.record_stats
    x, y = torch.randint(0, 50, (4, 9)), torch.randint(0, 50, (4, 9))
    seen = []
    for _ in range(3):
        logits, loss = model(x, y)
        seen.append(model_stats(model)["attn_logit_max"])
        loss.backward()
        optimizer.step()
        rec.step(loss=loss)
        optimizer.zero_grad()
    for _ in range(2):  # two steps of two micro-batches each, through the gatherer
        parts = []
        for rows in (slice(0, 2), slice(2, 4)):
            _, loss = model(x[rows], y[rows])
            parts.append(model_stats(model)["attn_logit_max"])
            (loss / 2).backward()
            rec.gather(loss=loss / 2, summed=True)
        optimizer.step()
        rec.step_gathered()
        optimizer.zero_grad()
        seen.append(max(parts))
    column = rec.run().metrics["attn_logit_max"]
    assert column.tolist() == pytest.approx(seen, rel=1e-6) and len(set(seen)) == 5
    plain = torch.nn.Linear(3, 3)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    rec2 = record(plain, sgd)
    plain(torch.ones(1, 3)).sum().backward()
    sgd.step()
    rec2.step(loss=1.0)
    assert "attn_logit_max" not in rec2.run().metrics


def test_clip_at_inf_to_log_the_norm_turns_every_gradient_nan_in_torch_not_here():
    """The clip_inf_to_log bug (a review of Skovorp/feral PR 16; pytorch issue 46849): torch's
    clip_grad_norm_(max_norm=inf) at an infinite norm multiplies every gradient by inf/inf = NaN,
    the finite ones too; the harness's clip leaves them and says the norm is non-finite. Under a
    GradScaler an overflow is still skipped (its check ran in unscale_), but finite gradients
    whose fp32 norm overflows reach the weights as NaN."""
    import math

    import torch

    from pytest_spikecheck.clipping import clip_grads_

    def grads() -> list[torch.nn.Parameter]:
        a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
        a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([math.inf, 1.0])
        return [a, b]

    theirs = grads()
    assert math.isinf(float(torch.nn.utils.clip_grad_norm_(theirs, max_norm=math.inf)))
    assert all(bool(p.grad.isnan().all()) for p in theirs)
    ours = grads()
    result = clip_grads_(ours, max_norm=math.inf, backend="torch")
    assert bool(result.nonfinite) and math.isinf(float(result.total_norm)) and ours[0].grad.tolist() == [1.0, 2.0, 3.0]

    def scaler_step(factor: float) -> torch.Tensor:
        p = torch.nn.Parameter(torch.ones(2))
        opt, scaler = torch.optim.SGD([p], lr=0.1), torch.amp.GradScaler("cpu", init_scale=2.0**16)
        scaler.scale((p * torch.tensor([factor, 1.0])).sum()).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([p], max_norm=math.inf)  # only to log the norm
        scaler.step(opt)
        return p.detach()

    assert scaler_step(1e35).tolist() == [1.0, 1.0]  # a real overflow: the scaler skips the step
    assert bool(scaler_step(1e30).isnan().all())  # finite gradients, an fp32 norm of inf: NaN weights


def test_a_clip_muon_update_run_folder_validates_against_the_schema(tmp_path):
    from run_schema import validate_run_folder

    run = train(NANO.replace(optimizer__name="muon", optimizer__lr=0.02).with_breaks(ClipMuonUpdate()))
    assert run.facts.clip.when == "muon_update"
    validate_run_folder(run.save(tmp_path / "run"))


def test_each_bug_fails_its_assertion_and_its_fixed_twin_passes():
    """The trained twins in two steps each (scenarios/test_shipped_defence_bugs.py runs eight, with --spikecheck)."""
    from pytest_spikecheck import SkipSpikes

    muon = NANO.replace(optimizer__name="muon", optimizer__lr=0.02, optimizer__weight_decay=0.0)
    fixed, bug = train(muon), train(muon.with_breaks(ClipMuonUpdate()))
    assert_muon_update_scale(fixed)
    with pytest.raises(AssertionError, match=r"attenuated .*\(update_clip_norm\)"):
        assert_muon_update_scale(bug)
    attenuation = fixed["muon_update_ratio"][0] / bug["muon_update_ratio"][0]
    assert attenuation == pytest.approx(bug["update_clip_norm"][0], rel=5e-3)  # the norm the clip divided by
    skip, frozen = train(NANO.with_breaks(SkipSpikes())), train(NANO.with_breaks(SkipStepCounter()))
    assert assert_optimizer_steps(skip) == {"applied": 2, "counted": 2}
    with pytest.raises(AssertionError, match=r"^at step 1 the optimizer counted 0 steps but 1 were applied"):
        assert_optimizer_steps(frozen)
    assert frozen["update_rms"][1] > 1.3 * skip["update_rms"][1]  # step 2: the bias correction of step 1 again


def test_under_a_scaler_an_overflowed_norm_of_finite_gradients_is_no_scaler_skip():
    """GradScaler skips a step for an inf or NaN gradient element, not for a norm that overflows
    float32 while every element is finite: it steps, so the recorder must not excuse the norm as
    the scaler's overflow (it once did, and the step's event was never recorded)."""
    import torch

    from pytest_spikecheck import record

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    rec = record(model, sgd, scaler=scaler)
    loss = model(torch.full((1, 2), 3e19)).sum()  # a finite weight gradient of 3e19: float32 norm inf
    scaler.scale(loss).backward()
    scaler.unscale_(sgd)
    with rec.clipping():
        torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    before = model.weight.detach().clone()
    scaler.step(sgd)
    scaler.update()
    rec.step(loss=loss)
    run = rec.run()
    assert not torch.equal(before, model.weight)  # the scaler stepped
    assert run.skipped == {} and run.metrics["grad_finite_pre"].tolist() == [1.0]
    assert [e.step for e in run.events] == [1]  # the overflowed norm is an event, not an excused skip
