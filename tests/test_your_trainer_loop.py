"""A plain training loop recorded with ``pytest_spikecheck.record``: the burst injected into its
data spikes, the recorder measures the norms itself, and the run folder is diagnosed and
asserted on like an engine run. Two 40-step runs of the micro GPT (about 1 s); then the loops
people write with gradient accumulation (4 micro-batches of 2) and with fp16 autocast and a
``GradScaler("cpu")`` at ``init_scale=2**24`` (it overflows in the first steps: skipped steps on
a CPU), and the classic AMP bug, the clip before ``unscale_`` (short fp16 runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from trainer_data import BATCH, BURST_STEP, MAX_NORM, STEPS, catalog, corpus, one_thread, stream

import warnings

from pytest_spikecheck import (
    Run,
    SpikeCheckError,
    assert_clip_contains,
    assert_finite,
    assert_overflow_skips,
    assert_spike,
    diagnose,
    inject_burst,
    record,
)
from pytest_spikecheck.integrations.recorder import ClipBeforeUnscaleWarning, Recorder, RecorderOrderWarning
from pytest_spikecheck.cli import main as cli
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.build import build_model
from pytest_spikecheck.training.optimizers import build_optimizer
from pytest_spikecheck.training.schedule import lr_at


def _rows():
    data, _ = corpus()
    return [(torch.from_numpy(data.train.inputs[i]), torch.from_numpy(data.train.targets[i])) for i in range(len(data.pool))]


def train_plain_loop(max_norm: float | None):
    """The user's loop: their model, optimizer, schedule and clip; four recorder calls."""
    data, _ = corpus()
    scenario = Scenario.preset("phase-19")
    torch.manual_seed(0)
    model = build_model(scenario, data.tokenizer.vocab_size, pad_token_id=data.tokenizer.pad_id)
    optimizer = build_optimizer(model, scenario)
    burst = stream(_rows())
    rec = record(model, optimizer, max_norm=max_norm, catalog=catalog(), stream=burst, name="plain-loop")
    reference = []  # torch's own pre-clip norm (clip_grad_norm_ returns it; max_norm inf: no clip)
    for step, (x, y) in enumerate(DataLoader(burst, batch_size=BATCH), 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=1e-2, total_steps=STEPS, spec=scenario.schedule)
        logits, loss = model(x, y)
        loss.backward()
        with rec.clipping():
            reference.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)))
        optimizer.step()
        rec.step(loss=loss, logits=logits, targets=y)
        optimizer.zero_grad(set_to_none=True)
    return rec.run(), np.array(reference)


@pytest.fixture(scope="module")
def loop_runs():
    with one_thread():
        return {"clip": train_plain_loop(MAX_NORM), "no_clip": train_plain_loop(None)}


@pytest.mark.parametrize("kind", ["clip", "no_clip"])
def test_pre_clip_norm_is_measured_and_matches_torch(loop_runs, kind):
    run, reference = loop_runs[kind]
    assert len(run) == STEPS
    np.testing.assert_allclose(run["grad_norm_pre"], reference, rtol=1e-5)


def test_clipped_run_is_contained_and_post_clip_is_measured(loop_runs):
    run, _ = loop_runs["clip"]
    assert_clip_contains(run, MAX_NORM)
    # the facts as observed: the optimizer object's own groups (decayed, not), the clip it was told
    assert (run.facts.source, run.facts.optimizer, run.facts.max_norm) == ("recorder", "adamw", MAX_NORM)
    assert [(g.weight_decay, g.lr) for g in run.facts.optimizers] == [(0.1, 1e-2), (0.0, 1e-2)]
    assert run.facts.qk_clip is None and run.facts.amp_dtype is None  # not observed, not given: unknown
    over = run["grad_norm_pre"] > MAX_NORM
    assert over[BURST_STEP - 1]
    np.testing.assert_allclose(run["grad_norm_post"][over], MAX_NORM, rtol=1e-5)
    np.testing.assert_allclose(run["grad_norm_post"][~over], run["grad_norm_pre"][~over], rtol=1e-5)
    assert np.all(run["clip_factor"][~over] == 1.0) and np.all(run["clip_factor"][over] < 1.0)


def test_unclipped_run_spikes_at_the_burst_and_is_diagnosed(loop_runs, tmp_path, capsys):
    run, _ = loop_runs["no_clip"]
    np.testing.assert_allclose(run["grad_norm_post"], run["grad_norm_pre"], rtol=1e-5)  # measured: untouched
    assert np.all(run["clip_factor"] == 1.0)
    assert_spike(run, at=BURST_STEP, min_ratio=5)
    with pytest.raises(AssertionError, match="did not contain"):
        assert_clip_contains(run, MAX_NORM)
    run.save(tmp_path / "run")
    loaded = Run.load(tmp_path / "run")
    d = diagnose(loaded)
    data, burst = corpus()
    assert d.step == BURST_STEP
    assert sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)
    assert d.facts["burst_samples"] == 3 and d.facts["rare_loss_share"] > 0.5
    assert "no clip" in d.verdict
    event = loaded.event_at(BURST_STEP)
    assert event.kinds[0] == "burst" and event.adam_surprise["share"] > 0
    assert {w["sample"] for w in event.token_losses["worst"][:3]} <= set(d.facts["injected"])
    assert cli(["diagnose", str(tmp_path / "run")]) == 0
    assert f"diagnosis at step {BURST_STEP}" in capsys.readouterr().out


def test_inject_burst_plans_the_burst_and_holds_its_samples_out():
    data, burst = corpus()
    planned = stream(_rows())
    batch = planned.batch_at(BURST_STEP)
    assert sorted(i for i in batch if i in burst) == sorted(burst) == sorted(planned.burst_ids)
    elsewhere = [i for k, b in enumerate(planned.plan, 1) if k != BURST_STEP for i in b]
    assert not set(elsewhere) & set(burst)
    assert all(len(b) == BATCH for b in planned.plan) and len(planned.plan) == STEPS
    assert list(planned.sampler()) == planned.indices()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"samples": [10_000]}, "sample index 10000 is outside the dataset"),
        ({"samples": [1, 2], "count": 3}, "count <= min(len(samples), batch_size × accumulation)"),
        ({"samples": [1], "at_step": 99}, "1 <= at_step <= steps"),
    ],
)
def test_inject_burst_rejects_bad_input_in_one_line(kwargs, message):
    from pytest_spikecheck import inject_burst

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inject_burst(list(range(50)), **{"at_step": 5, "batch_size": 8, "steps": 20, **kwargs})


def test_recorder_rejects_a_qk_clip_that_is_no_tau():
    with pytest.raises(ConfigError, match=r"record\(..., qk_clip=...\) is your QK-Clip's tau, a number > 0"):
        record(torch.nn.Linear(2, 2), qk_clip="30")


def test_recorder_rejects_a_negative_max_norm():
    with pytest.raises(ConfigError, match="Recorder max_norm must be > 0"):
        record(torch.nn.Linear(2, 2), max_norm=-1.0)


# -- gradient accumulation and mixed precision, as people write them ---------------------------


def train_loop(
    *,
    accumulation: int = 1,
    dtype=None,
    scaler_init: float | None = None,
    unscale_first: bool = True,
    steps: int = STEPS,
    recorder=Recorder,
    burst_step: int = BURST_STEP,
):
    """The user's loop with ``accumulation`` micro-batches per optimizer step (each micro-batch's
    loss divided by their number, as most loops do) under ``torch.autocast(dtype)`` and, with
    ``scaler_init``, a ``GradScaler("cpu")``; ``unscale_first=False`` is the AMP bug."""
    data, burst = corpus()
    scenario = Scenario.preset("phase-19")
    torch.manual_seed(0)
    model = build_model(scenario, data.tokenizer.vocab_size, pad_token_id=data.tokenizer.pad_id)
    optimizer = build_optimizer(model, scenario)
    scaler = torch.amp.GradScaler("cpu", init_scale=scaler_init) if scaler_init else None
    micro = BATCH // accumulation
    planned = inject_burst(
        _rows(), samples=burst, at_step=burst_step, count=3, batch_size=micro, steps=steps, seed=0, accumulation=accumulation
    )
    rec = recorder(
        model,
        optimizer,
        max_norm=MAX_NORM,
        catalog=catalog(),
        stream=planned,
        name="plain-loop",
        accumulation=accumulation,
        scaler=scaler,
        seed=0,
    )
    batches = iter(DataLoader(planned, batch_size=micro))
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=1e-2, total_steps=steps, spec=scenario.schedule)
        losses, logits_parts, targets = [], [], []
        for _ in range(accumulation):
            x, y = next(batches)
            with autocast:
                logits, loss = model(x, y)
            (scaler.scale(loss / accumulation) if scaler else loss / accumulation).backward()
            losses.append(float(loss.detach()))
            logits_parts.append(logits.detach())
            targets.append(y)
        if scaler is not None and unscale_first:
            scaler.unscale_(optimizer)
        with rec.clipping():
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        rec.step(loss=sum(losses) / accumulation, logits=logits_parts, targets=targets)
        optimizer.zero_grad(set_to_none=True)
    return rec.run()


@pytest.fixture(scope="module")
def accumulated_loop():
    with one_thread():
        return train_loop(accumulation=4)


@pytest.fixture(scope="module")
def fp16_loop():
    with one_thread():
        return train_loop(dtype=torch.float16, scaler_init=2.0**24)


def test_accumulation_is_recorded_per_optimizer_step(accumulated_loop, loop_runs):
    run = accumulated_loop
    assert len(run) == STEPS and run.meta["recorded"]["accumulation"] == 4
    batch = run.batch_at(BURST_STEP)  # the step's 4 micro-batches of 2: all 8 samples
    assert len(batch["samples"]) == BATCH and batch["burst_samples"] == 3
    d = diagnose(run)
    assert d.step == BURST_STEP and d.facts["burst_samples"] == 3  # the burst where it was injected
    assert len(run.event_at(BURST_STEP).token_losses["worst"]) > 0  # all micro-batches' logits
    assert_clip_contains(run, MAX_NORM)
    # step 1 (same weights and batch): the mean of the micro-batch means, as this loop computes it,
    # next to the whole batch's token-weighted mean at accumulation 1
    one, _ = loop_runs["clip"]
    assert run["loss"][0] == pytest.approx(one["loss"][0], rel=1e-2)


def test_a_stream_planned_for_another_accumulation_is_refused():
    data, burst = corpus()
    planned = inject_burst(_rows(), samples=burst, at_step=5, count=3, batch_size=2, steps=10, accumulation=4)
    with pytest.raises(
        ConfigError,
        match=r"the burst stream plans 4 micro-batch\(es\) per optimizer step .* "
        r"accumulation=1: give both the same",
    ):
        record(torch.nn.Linear(2, 2), max_norm=1.0, stream=planned)
    with pytest.raises(ConfigError, match=r"accumulation=\.\.\.\) must be an integer >= 1"):
        record(torch.nn.Linear(2, 2), accumulation=0)


def test_grad_scaler_skips_are_marked_and_are_no_failure(fp16_loop, tmp_path, capsys):
    run = fp16_loop
    skipped = sorted(run.skipped)
    assert skipped and skipped[0] == 1 and set(run.skipped.values()) == {"overflow"}  # 2**24 overflows at once
    scales = run["loss_scale"]
    assert scales[0] == 2**24 and all(scales[s] == scales[s - 1] / 2 for s in skipped)  # halved after each skip
    assert all(run["grad_norm_post"][s - 1] == 0.0 for s in skipped)  # nothing reached the optimizer
    finite = assert_finite(run)
    assert finite.skipped_steps == tuple(skipped)  # the steps, not their count
    assert_clip_contains(run, MAX_NORM)  # unscaled before the clip: it holds
    with pytest.raises(SpikeCheckError, match=rf"the loss scaler skipped {len(skipped)} of {STEPS} steps on overflow"):
        assert_overflow_skips(run)  # the 2**24 start costs more than 1% of a 40-step run ...
    assert assert_overflow_skips(run, after_step=skipped[-1]) == 0.0  # ... and nothing once it settled
    d = diagnose(run)
    assert d.step == BURST_STEP and "injected" in d.facts and "GradScaler" not in d.verdict  # the burst's diagnosis
    first = diagnose(run, 2)
    assert first.verdict.startswith(
        "GradScaler skipped this step (overflow at scale 2²³; scale halved): the update "
        "was not applied, not a numeric break; the data: "
    )
    run.save(tmp_path / "run")
    # spikecheck check reads the skip marks too (no failure), and finds the burst in the loss (issue 35: it
    # read OK, the descent's spread hiding the +0.85-nat jump)
    assert cli(["check", str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert "skipped" in out and f"  {BURST_STEP}    " in out and "loss-jump +0.85" in out
    # issue 35: the scaler's first skips (its norms NaN before any real value) are skips, not "not yet computed"
    assert f"from step {skipped[0]}: a skipped step (overflow)" in out and "not yet computed" not in out
    # sabotage: the history's spread around its median (the descent, not its noise) hides the jump
    from pytest_spikecheck.judge.detectors import LossJump
    from pytest_spikecheck.records.logs import read_log

    steps, values = read_log(tmp_path / "run").series("loss")
    assert BURST_STEP in [d.step for d in LossJump().detect(steps, values)]
    assert BURST_STEP not in [d.step for d in LossJump(detrend=False).detect(steps, values)]


def test_clip_before_unscale_is_warned_and_fails_clip_containment(fp16_loop):
    with (
        one_thread(),
        pytest.warns(
            ClipBeforeUnscaleWarning,
            match=r"^rec.clipping\(\) at step 1: the gradients are "
            r"still scaled by the GradScaler \(×2¹⁶\)",
        ),
    ):
        buggy = train_loop(dtype=torch.float16, scaler_init=2.0**16, unscale_first=False, steps=8, burst_step=6)
    assert buggy.meta["clip_before_unscale_at"] == list(range(1, 9))
    applied = [s for s in buggy["step"] if s not in buggy.skipped]
    post = buggy["grad_norm_post"][np.asarray(applied) - 1]
    np.testing.assert_allclose(post * buggy["loss_scale"][np.asarray(applied) - 1], MAX_NORM, rtol=1e-4)
    assert buggy["grad_norm_pre"][0] > MAX_NORM  # recorded unscaled: the real pre-clip norm
    with pytest.raises(
        SpikeCheckError,
        match=r"^over-clipped at step 1: the optimizer received 1\.5e-5 for pre-clip "
        r"\S+ and max_norm 1 .*: clipped before unscaling",
    ):
        assert_clip_contains(buggy, MAX_NORM)
    assert diagnose(buggy, 3).verdict == "clipped before unscaling: the optimizer received ‖g‖ = 1.5e-5 for max_norm 1"
    assert "post-clip when the optimizer's step returned" in buggy.meta["grad_norms"]


def test_clip_before_unscale_under_filterwarnings_error_is_recorded_not_raised():
    """The README's ``filterwarnings = error``: the warning must not stop the user's training at
    step 1; the run records it, the assertion fails on it, and the diagnosis at its default step
    names the over-clip and its cause."""
    import pytest_spikecheck

    assert pytest_spikecheck.ClipBeforeUnscaleWarning is ClipBeforeUnscaleWarning  # exported at the top level
    with one_thread(), warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        buggy = train_loop(dtype=torch.float16, scaler_init=2.0**16, unscale_first=False, steps=3, burst_step=2)
    assert [type(w.message) for w in shown] == [ClipBeforeUnscaleWarning]  # shown once, not raised
    assert buggy.meta["clip_before_unscale_at"] == [1, 2, 3]
    with pytest.raises(SpikeCheckError, match="clipped before unscaling") as failure:
        assert_clip_contains(buggy, MAX_NORM)
    d = diagnose(buggy)
    assert d.step == failure.value.verdict.step  # the diagnosis is where the assertion failed
    assert "OVER-CLIPPED" in dict(d.lines)["2 grad norm"] and "clipped before unscaling" in dict(d.lines)["2 grad norm"]
    with one_thread(), warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("ignore", ClipBeforeUnscaleWarning)  # an "ignore" is honoured
        train_loop(dtype=torch.float16, scaler_init=2.0**16, unscale_first=False, steps=1, burst_step=1)
    assert quiet == []


class _PostClipAtTheEndOfClipping(Recorder):
    """Sabotage: the post-clip norm measured when ``rec.clipping()`` ends (the scaled, clipped
    gradients), not on what the optimizer consumes."""

    def after_clip(self) -> None:
        super().after_clip()
        self._measure_after_clip()

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        pass


def test_sabotage_a_recorder_that_measures_post_clip_at_the_end_of_clipping_hides_the_bug():
    with one_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ClipBeforeUnscaleWarning)
        hidden = train_loop(
            dtype=torch.float16,
            scaler_init=2.0**16,
            unscale_first=False,
            steps=8,
            burst_step=6,
            recorder=_PostClipAtTheEndOfClipping,
        )
    applied = [s - 1 for s in hidden["step"] if s not in hidden.skipped]
    # it records the scaled gradients after the clip: max_norm, as if the clip had worked
    assert np.allclose(hidden["grad_norm_post"][applied], MAX_NORM, rtol=1e-3)


def test_rec_step_before_the_optimizer_step_is_warned():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = record(model, optimizer)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.warns(RecorderOrderWarning, match=r"^rec.step\(\) at step 1: the optimizer did not step"):
        rec.step(loss=1.0)
    optimizer.step()
    assert rec.run().skipped == {1: "no optimizer step"}


def test_the_callbacks_micro_batch_gatherer_on_the_recorder():
    """The HF and Lightning callbacks gather each micro-batch's forward on the recorder
    (Recorder.gather, step_gathered): the step's loss is the micro-batch losses' sum when each
    is already divided (summed), else their mean; per-token losses only where every micro-batch
    gave logits and targets; the gatherer is empty again for the next step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = record(model, optimizer, accumulation=2, declared={2: "burst", 3: "burst"})
    x, y = torch.randint(0, 7, (2, 3)), torch.randint(0, 7, (2, 3))

    def step(losses, *, summed, targets_of=(0, 1)):
        for i, value in enumerate(losses):
            logits = model(x[i : i + 1])
            torch.nn.functional.cross_entropy(logits.view(-1, 7), y[i].view(-1)).backward()
            rec.gather(
                loss=torch.tensor(value), logits=logits.detach(), summed=summed, targets=y[i : i + 1] if i in targets_of else None
            )
        assert rec.gathered == len(losses)
        optimizer.step()
        row = rec.step_gathered()
        optimizer.zero_grad()
        assert rec.gathered == 0
        return row["loss"]

    assert step([1.0, 3.0], summed=False) == 2.0  # HF's micro-batch means: their mean
    assert step([0.5, 1.5], summed=True) == 2.0  # already divided (HF's num_items_in_batch, Lightning's): their sum
    assert rec.events[-1].step == 2 and rec.events[-1].token_losses["n_tokens"] == 6  # both micro-batches' tokens
    step([1.0, 1.0], summed=False, targets_of=(0,))  # one micro-batch without targets: no per-token losses
    assert rec.events[-1].step == 3 and rec.events[-1].token_losses is None
    rec.gather(loss=None)
    optimizer.step()
    assert math.isnan(rec.step_gathered()["loss"])  # a micro-batch that gave no loss
