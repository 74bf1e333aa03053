"""Training on several processes with sharded gradients, and the launcher that starts them.

``train(scenario, nproc=2)`` runs the engine's one training loop on N ranks of a
``torch.distributed`` process group (gloo on CPU, NCCL with one GPU per rank on CUDA), with
:class:`FlatShard` as its :class:`~pytest_spikecheck.training.sharding.Sharding`. A step on rank r:

1. forward/backward on rank r's contiguous part of the step's batch (the 8 samples split as
   evenly as they go), its loss weighted by its share of the batch's non-pad tokens, so the
   ranks' losses and gradients *add up* to the single-process mean over the whole batch;
2. a reduce-scatter of the flat gradient: rank r keeps the sum over ranks of one contiguous
   1/N of it (ZeRO-2 style: gradients and AdamW state are sharded, the weights replicated; the
   parameters are laid out in one flat buffer, matrices first, then biases and norm gains,
   padded to a multiple of N);
3. the clip, through :func:`~pytest_spikecheck.clipping.clip_grads_` with ``process_group``:
   each rank measures its shard, one float64 all-reduce adds the squares, every rank applies
   the same scale (or, under :class:`~pytest_spikecheck.scenario.breaks.ShardLocalNorm`, the bug: each
   rank clips to its own shard's norm);
4. AdamW (or SGD) on the rank's shard (its state is sharded too), then an all-gather of the flat
   parameters, which the model's weights are views of. Muon (``optimizer.name: muon``)
   orthogonalises whole matrices, which a shard splits: its matrices lie first in the flat
   buffer, every rank gathers the whole clipped gradient and runs Muon on all of them (the same
   computation on every rank, its momentum replicated), and keeps its own span of the result;
   Muon's AdamW part is sharded as above.

Rank 0 records the run (eval, events, the final lock-in check); the returned run is its record.
The recorded ``grad_norm_pre`` / ``grad_norm_post`` are always those of the whole model's
gradient: under ShardLocalNorm one extra all-reduce, used only for recording, measures what the
buggy clip let through, so ``assert_clip_contains`` sees the truth.

Users with their own launcher (``torchrun``) call :func:`train_in_process_group` on every rank;
:func:`run_on_ranks` is the small spawn launcher behind ``nproc=``, usable for any function.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from pytest_spikecheck.clipping import ClipResult, clip_grads_
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.training.optimizers import build_muon, build_optimizer, optimizer_kind, parameter_groups
from pytest_spikecheck.training.engine import train_with_sharding, validate_nproc
from pytest_spikecheck.training.sharding import EventView, RowsBackward
from pytest_spikecheck.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pytest_spikecheck.records.run import Run
    from pytest_spikecheck.scenario import Scenario

#: How long a rank waits in a collective before it fails the run. A rank waits while rank 0
#: records (an eval, an event's tables: milliseconds on the tiny models) and, before the first
#: step, while the others build their data (seconds); two minutes is a hang.
DEFAULT_TIMEOUT_S = 120.0

#: How long the ranks may take to start (spawn, import torch) and meet. Separate from the
#: collective timeout, so that a short one does not fail a rank that was slow to import.
STARTUP_TIMEOUT_S = 300.0

_HOST = "127.0.0.1"

# torch 2.13 renamed the flat collectives (the old names warn); the GPU machine runs 2.11.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistributedError(RuntimeError):
    """A rank failed, or the process group could not start. The message is one line naming the
    first rank that failed and its error; the rank's traceback is attached as a note."""


def check_distributed_scenario(resolved: Scenario, nproc: int) -> None:
    """Raise ConfigError if ``resolved`` cannot train on ``nproc`` ranks with flat shards."""
    if resolved.optimizer.clip.kind == "per_tensor":
        raise ConfigError(
            "per-tensor clipping is not defined on flat shards (a shard holds parts of tensors); clip globally with nproc > 1"
        )
    if resolved.model.z_loss > 0:
        raise ConfigError(
            "z-loss (model.z_loss) is not supported with nproc > 1 yet: each rank's z-loss term "
            "covers its own rows only, so the loss column could not be told apart from it"
        )
    if resolved.optimizer.qk_clip is not None:
        raise ConfigError(
            "QKClip is not supported with nproc > 1 yet: it needs the per-head attention logits of the "
            "whole batch, and each rank's forward sees its own rows (train with nproc=1)"
        )
    if resolved.optimizer.clip.when == "per_microbatch":
        raise ConfigError("ClipEachMicrobatch (clip_when per_microbatch) is declared on one process: train it with nproc 1")
    if resolved.optimizer.clip.when == "muon_update":
        raise ConfigError(
            "ClipMuonUpdate (clip_when muon_update) is declared on one process: its clip norm needs the "
            "whole AdamW part's gradients, and each rank holds a shard; train it with nproc 1"
        )
    if resolved.optimizer.clip.when == "inf_to_log":
        raise ConfigError(
            "ClipInfToLog (clip_when inf_to_log) is declared on one process: torch's clip_grad_norm_ "
            "sees one rank's shard only; train it with nproc 1"
        )
    k = resolved.sampler.accumulation
    if resolved.sampler.batch_size < nproc * k:
        times = f" x accumulation {k}" if k > 1 else ""
        raise ConfigError(
            f"nproc {nproc}{times} exceeds the batch size {resolved.sampler.batch_size}: "
            f"every rank needs at least one sample of each {'micro-' if k > 1 else ''}batch"
        )


def process_group_backend(device: str, nproc: int) -> str:
    """``gloo`` for the CPU, ``nccl`` for CUDA (one GPU per rank); ConfigError when unusable."""
    if not device.startswith("cuda"):
        if not dist.is_available() or not dist.is_gloo_available():
            raise ConfigError("training on several CPU processes needs torch.distributed with gloo; this torch has none")
        return "gloo"
    if device != "cuda":
        raise ConfigError(f"with nproc > 1 pass device 'cuda' (rank r trains on cuda:r), was {device!r}")
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        raise ConfigError("training on several CUDA processes needs torch with CUDA and NCCL")
    if torch.cuda.device_count() < nproc:
        raise ConfigError(f"NCCL needs one GPU per rank: nproc {nproc}, but {torch.cuda.device_count()} GPU(s) visible")
    return "nccl"


class FlatShard:
    """The N-rank :class:`~pytest_spikecheck.training.sharding.Sharding`: gradients and AdamW state split
    into one contiguous shard per rank of ``group`` (default: the whole world).

    ``build_optimizer`` moves the model's weights into one flat buffer (each parameter becomes a
    view of it, and so does its ``.grad``: autograd accumulates into the flat gradient, as DDP's
    ``gradient_as_bucket_view`` does) and returns an AdamW over this rank's shard, split at the
    boundary between the decayed and the undecayed parameters. AdamW is elementwise, so a shard
    of it computes exactly what the whole does on those elements.
    """

    def __init__(self, group: Any = None) -> None:
        # Explicit: to torch.distributed None means the world, but to clip_grads_ it means no
        # group at all, which is the per-rank-norm bug.
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.is_recorder = self.rank == 0

    # -- set-up ---------------------------------------------------------------------------
    def check(self, resolved: Scenario) -> None:
        check_distributed_scenario(resolved, self.world_size)

    def build_optimizer(self, model: torch.nn.Module, scenario: Scenario) -> torch.optim.Optimizer:
        self._shard_local = scenario.optimizer.clip.kind == "shard_local"
        kind = optimizer_kind(scenario.optimizer.name)  # what it needs of the shards, declared
        matrices = kind.whole_matrices(model, scenario) if kind.whole_matrices is not None else []
        taken = {id(m.param) for m in matrices}
        groups = parameter_groups(model, scenario, [p for p in model.parameters() if p.requires_grad and id(p) not in taken])
        if matrices:  # the whole matrices first: one contiguous region of the flat buffer, replicated
            groups.insert(0, {"params": [m.param for m in matrices], "whole": True})
        ordered = [p for group in groups for p in group["params"]]
        self._flatten(model, ordered)
        lo = self.rank * self.shard_numel
        self._split_clip_parts(ordered, lo)
        shard_groups = self._shard_groups(groups, lo)
        self._muon_numel = sum(m.param.numel() for m in matrices)
        self._muon_pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._muon_params = {id(m.param) for m in matrices}
        # Whether the optimizer keeps Adam moments, and how many updates it took: the same on every
        # rank (a rank whose shard holds only the whole matrices has no AdamW state of its own to ask).
        self._adam, self._updates = kind.adam_moments, 0
        if not matrices and not shard_groups:
            raise ConfigError(
                f"the model's {sum(p.numel() for p in ordered)} parameters are too few to give each of "
                f"{self.world_size} ranks a shard"
            )
        if not matrices:
            return build_optimizer(model, scenario, shard_groups)
        return build_muon(
            self._whole_matrix_views(matrices, lo), shard_groups, scenario, parents=[piece for piece, _ in self._muon_pieces]
        )

    def _flatten(self, model: torch.nn.Module, ordered: list[torch.Tensor]) -> None:
        """Every trainable parameter (in ``ordered``) becomes a view of one flat buffer, and its
        gradient a view of one flat gradient; this rank's shard of both is cloned out."""
        first = ordered[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in ordered):
            raise ConfigError("flat sharding needs every trainable parameter in one dtype on one device")
        numel = sum(p.numel() for p in ordered)
        self.shard_numel = -(-numel // self.world_size)
        padded = self.shard_numel * self.world_size
        self.flat_params = torch.zeros(padded, dtype=first.dtype, device=first.device)
        self.flat_grads = torch.zeros_like(self.flat_params)
        self.params = [p for p in model.parameters() if p.requires_grad]  # the engine's order
        self._slices: dict[torch.Tensor, slice] = {}
        offset = 0
        with torch.no_grad():
            for p in ordered:
                where = slice(offset, offset + p.numel())
                self.flat_params[where].copy_(p.detach().reshape(-1))
                p.data = self.flat_params[where].view_as(p)
                p.grad = self.flat_grads[where].view_as(p)
                self._slices[p] = where
                offset = where.stop
        lo, hi = self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel
        self.shard_params = self.flat_params[lo:hi].clone()
        self.shard_grads = torch.zeros_like(self.shard_params)

    def _split_clip_parts(self, ordered: list[torch.Tensor], lo: int) -> None:
        """What the clip measures and scales: this rank's part of each parameter, not one flat
        tensor. torch's float32 norm of a 75k-element vector is off by ~1e-6 relative, of a
        parameter-sized one by ~1e-7, as in the single-process clip."""
        hi = lo + self.shard_numel
        self._clip_parts: list[torch.Tensor] = []
        position = {p: k for k, p in enumerate(self.params)}
        part_of = []  # each clip part's parameter, as its index in the engine's order
        for p in ordered:
            a, b = max(self._slices[p].start, lo) - lo, min(self._slices[p].stop, hi) - lo
            if a < b:
                part = self.shard_params[a:b]
                part.grad = self.shard_grads[a:b]
                self._clip_parts.append(part)
                part_of.append(position[p])
        self._part_of = torch.tensor(part_of, dtype=torch.long, device=self.flat_params.device)

    def _shard_groups(self, groups: list[dict[str, Any]], lo: int) -> list[dict[str, Any]]:
        """The elementwise optimizer's groups over this rank's shard: each group's span of it, a
        view of shard_params with its gradient the same span of shard_grads."""
        hi = lo + self.shard_numel
        self._pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._piece_starts: list[int] = []  # where each piece begins in this rank's shard
        shard_groups = []
        start = 0
        for group in groups:
            stop = start + sum(p.numel() for p in group["params"])
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            if a < b and not group.get("whole"):
                piece = self.shard_params[a:b]
                self._pieces.append((piece, self.shard_grads[a:b]))
                self._piece_starts.append(a)
                shard_groups.append({**group, "params": [piece]})
            start = stop
        return shard_groups

    def _whole_matrix_views(self, matrices: list[Any], lo: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of the whole (replicated) matrices, one per stacked matrix, their gradients views
        of the whole clipped gradient, gathered before each step; and this rank's span of their
        region with its gradient (what a loss scaler unscales before the clip: the views get
        their gradients only at the step)."""
        self._muon_grads = torch.zeros_like(self.flat_grads)
        tensors = []
        for m in matrices:
            where = self._slices[m.param]
            weight, grad = self.flat_params[where].view_as(m.param), self._muon_grads[where].view_as(m.param)
            tensors += [(weight[rows], grad[rows]) for rows in m.rows()]
        end = min(self._muon_numel - lo, self.shard_numel)
        self._muon_pieces = [(self.shard_params[:end], self.shard_grads[:end])] if end > 0 else []
        return tensors

    # -- one step -------------------------------------------------------------------------
    def forward_backward(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows_backward: RowsBackward
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        rows = slice(x.shape[0] * self.rank // self.world_size, x.shape[0] * (self.rank + 1) // self.world_size)
        batch_tokens = int((y != IGNORE_INDEX).sum())
        self.flat_grads.zero_()
        # The step weights each micro-batch's mean loss by its share of the whole batch's tokens,
        # so the ranks' losses and gradients add up to the mean over the whole batch.
        logits, share, stats = rows_backward(x[rows], y[rows], batch_tokens)
        _reduce_scatter(self.shard_grads, self.flat_grads, op=dist.ReduceOp.SUM, group=self.group)
        for piece, grad in self._pieces + self._muon_pieces:
            piece.grad = grad  # again every step: the engine's zero_grad(set_to_none) drops it
        batch_loss = share.detach().clone()
        dist.all_reduce(batch_loss, op=dist.ReduceOp.SUM, group=self.group)
        return logits, batch_loss, stats

    def loss_scaler(self, device_type: str, **options: Any) -> Any:
        # GradScaler's semantics, with one all-reduce of the overflow flag in unscale_: a rank
        # whose shard overflowed makes every rank skip the step (their shards stay one model).
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type, process_group=self.group, **options)

    def clip(self, max_norm: float, *, backend: str, mode: str, grad_scale: float = 1.0) -> ClipResult:
        # Measured before the clip, every step: this rank's part of each parameter's squared
        # norm (the event record adds them over the ranks; never recovered from a scale).
        grads = [part.grad for part in self._clip_parts]
        self._pre_clip_squares = (
            torch.stack(torch._foreach_norm(grads)).double().square() if grads else torch.zeros(0, dtype=torch.float64)
        )
        if grad_scale != 1.0:  # ClipBeforeUnscale: measured on scaled gradients
            self._pre_clip_squares = self._pre_clip_squares / grad_scale**2
            result = clip_grads_(self._clip_parts, max_norm, backend=backend, mode=mode, process_group=self.group)
            return ClipResult(result.total_norm / grad_scale, result.scale, result.nonfinite)
        if mode != "shard_local":
            return clip_grads_(self._clip_parts, max_norm, backend=backend, mode=mode, process_group=self.group)
        # ShardLocalNorm, the bug: no process group, so each rank clips to its own shard's norm.
        local = clip_grads_(self._clip_parts, max_norm, backend=backend, mode="global")
        # Recording only, not part of the buggy clip: the whole gradient's norm before and after
        # it, from one all-reduce of both squared shard norms (exact in float64).
        squares = torch.stack([local.total_norm, local.total_norm * local.scale]).to(torch.float64).square()
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=self.group)
        pre, post = squares.sqrt().to(torch.float32).unbind()
        finite = pre.isfinite() & (pre > 0)
        scale = torch.where(finite, post / torch.where(finite, pre, 1.0), 1.0)  # the effective global factor
        return ClipResult(pre, scale, ~pre.isfinite())

    def grad_norm(self) -> torch.Tensor:
        # This rank's shard as AdamW will read it, squared in float64, summed over the ranks:
        # the whole gradient's norm, measured apart from any clip (the ShardLocalNorm bug included).
        local = torch.stack(torch._foreach_norm([self.shard_grads], 2, dtype=torch.float64)).square().sum()
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.group)
        return local.sqrt()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._updates += 1
        if self._muon_numel:
            _all_gather(self._muon_grads, self.shard_grads, group=self.group)  # the whole clipped gradient
        optimizer.step()
        if self._muon_numel:  # Muon updated the whole matrices in flat_params: keep this rank's span of them
            lo = self.rank * self.shard_numel
            hi = min(lo + self.shard_numel, self._muon_numel)
            if lo < hi:
                self.shard_params[: hi - lo].copy_(self.flat_params[lo:hi])
        _all_gather(self.flat_params, self.shard_params, group=self.group)

    def adam_v_sum(self, optimizer: torch.optim.Optimizer) -> float:
        state = optimizer.state  # AdamW's moments; SGD keeps none (its sum is 0 on every rank)
        moments = [state[piece]["exp_avg_sq"] for piece, _ in self._pieces if "exp_avg_sq" in state.get(piece, ())]
        # float64: the shards' sums are added across ranks (one process sums in float32, ~1e-7 apart)
        local = (
            torch.cat([v.view(-1) for v in moments]).double().sum()
            if moments
            else torch.zeros((), dtype=torch.float64, device=self.flat_params.device)
        )
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.group)
        return float(local)

    # -- recording ------------------------------------------------------------------------
    def event_view(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
        logits: torch.Tensor,
        clip: ClipResult,
    ) -> EventView:
        """The whole model's gradients and Adam moments, gathered from the shards (every rank
        takes part; only event steps pay for it)."""
        grads = torch.empty_like(self.flat_grads)
        _all_gather(grads, self.shard_grads, group=self.group)
        # Each parameter's pre-clip squared norm, summed over the ranks' parts (measured in clip).
        pre_clip_squares = torch.zeros(len(self.params), dtype=torch.float64, device=grads.device)
        pre_clip_squares.index_add_(0, self._part_of, self._pre_clip_squares.to(grads.device))
        dist.all_reduce(pre_clip_squares, op=dist.ReduceOp.SUM, group=self.group)

        moments = None
        step = torch.tensor(float(self._updates))  # AdamW's step count (every piece's)
        if self._adam and self._updates:
            shard_moments = torch.zeros_like(self.shard_params)
            for (piece, _), start in zip(self._pieces, self._piece_starts):
                shard_moments[start : start + piece.numel()] = optimizer.state[piece]["exp_avg_sq"]
            moments = torch.empty_like(self.flat_params)
            _all_gather(moments, shard_moments, group=self.group)

        full_logits = None
        if self.is_recorder:  # this rank ran only its rows; the token table wants the whole batch
            with torch.no_grad():
                full_logits, _ = model(x, y)
        per_param = [self._slices[p] for p in self.params]
        return EventView(
            logits=full_logits,
            grads=[grads[s].view_as(p) for s, p in zip(per_param, self.params)],
            pre_clip_norms=pre_clip_squares.sqrt().to(torch.float32),
            states=[
                {}
                if moments is None or id(p) in self._muon_params  # Muon's matrices keep no Adam moments
                else {"exp_avg_sq": moments[s].view_as(p), "step": step}
                for s, p in zip(per_param, self.params)
            ],
        )

    def describe(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "process_group": dist.get_backend(self.group),
            "sharding": f"flat: gradients and AdamW state in {self.world_size} shards of {self.shard_numel} elements",
            "clip_norm": (
                "shard-local (ShardLocalNorm: each rank clips to its own shard's norm; the recorded "
                "norms are the whole gradient's)"
                if self._shard_local
                else "global (all-reduced)"
            ),
        }


def train_in_process_group(
    scenario: Scenario, *, backend: str = "auto", device: str = "cpu", threads: int = 1, group: Any = None
) -> Run | None:
    """Train ``scenario`` on the ranks of an initialized process group (every rank calls it, e.g.
    under ``torchrun``); return the run on rank 0, None on the others. ``device="cuda"`` means
    each rank's current CUDA device (``torch.cuda.set_device`` it first)."""
    if not dist.is_initialized():
        raise ConfigError("train_in_process_group needs an initialized process group (torch.distributed.init_process_group)")
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    sharding = FlatShard(group)
    run = train_with_sharding(scenario, sharding, backend=backend, device=device, threads=threads)
    return run if sharding.is_recorder else None


def train_distributed(
    scenario: Scenario,
    *,
    nproc: int,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 1,
    callbacks: Iterable[Any] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Run:
    """``train(scenario, nproc=N)``: spawn N ranks, train, return rank 0's run."""
    nproc = validate_nproc(nproc)
    if list(callbacks):
        raise ConfigError(
            "callbacks cannot be used with nproc > 1: they would run in the rank processes, where the "
            "optimizer holds one shard of the model (train with nproc=1 to use them)"
        )
    check_distributed_scenario(scenario.resolved(), nproc)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    run = run_on_ranks(
        train_in_process_group,
        nproc,
        args=(scenario,),
        kwargs={"backend": backend, "device": device, "threads": threads},
        device=device,
        timeout_s=timeout_s,
    )[0]
    # Wall time from the launch to the result: spawning the ranks (each imports torch) included.
    run.meta["distributed"]["launch_seconds"] = time.perf_counter() - started
    return run


# ---------------------------------------------------------------------------------------------
# The launcher


def run_on_ranks(
    fn: Callable[..., Any],
    nproc: int,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on ``nproc`` spawned processes, each a rank of one initialized
    default process group (gloo; NCCL with ``cuda:rank`` set when ``device`` is CUDA), and return
    their results in rank order.

    ``fn``, ``args`` and the results travel by pickle (``fn`` must be importable). The ranks meet
    through a TCP store this process serves on a port the OS picks (no port to choose, none to
    collide under pytest-xdist). A collective that waits longer than ``timeout_s`` fails its
    rank; the first rank to fail stops them all, and :class:`DistributedError` names it.
    """
    nproc = validate_nproc(nproc)
    pg_backend = process_group_backend(device, nproc)
    payload = (fn, tuple(args), dict(kwargs or {}))
    try:
        pickle.dumps(payload)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f"what the ranks run must be picklable (importable functions, e.g. a module-level model_factory): {exc}"
        ) from None
    store = dist.TCPStore(
        _HOST,
        0,
        world_size=nproc + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
    )
    with tempfile.TemporaryDirectory(prefix="spikecheck-ranks-") as tmp:
        results = Path(tmp)
        context = mp.start_processes(
            _rank_main,
            args=(payload, nproc, store.port, pg_backend, timeout_s, str(results)),
            nprocs=nproc,
            join=False,
            start_method="spawn",
        )
        try:
            while not context.join():
                pass
        except ProcessException as exc:
            exit_codes = [process.exitcode for process in context.processes]
            raise _first_failure(results, exc, exit_codes, nproc) from None
        return [pickle.loads((results / f"rank{rank}.pickle").read_bytes()) for rank in range(nproc)]


def _rank_main(rank: int, payload: tuple, nproc: int, port: int, pg_backend: str, timeout_s: float, results: str) -> None:
    """A spawned rank: join the group, run, leave the result (or the error) in ``results``."""
    fn, args, kwargs = payload
    out = Path(results)
    try:
        if pg_backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore(_HOST, port, is_master=False, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        _wait_for_every_rank(store, nproc)
        try:
            dist.init_process_group(
                pg_backend, store=store, rank=rank, world_size=nproc, timeout=datetime.timedelta(seconds=timeout_s)
            )
        except Exception as exc:
            raise DistributedError(f"could not start the {pg_backend} process group: {_one_line(exc)}") from exc
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            # Reported before the process group goes: destroying it tells the peers, whose own
            # errors must come later in time to be recognised as consequences.
            _report_failure(out, rank, exc)
            raise
        finally:
            dist.destroy_process_group()
        _write_atomically(out / f"rank{rank}.pickle", pickle.dumps(result))
    except BaseException as exc:
        if not (out / f"rank{rank}.error.json").exists():
            _report_failure(out, rank, exc)
        raise
    # The result is on disk: leave without interpreter finalization. Tearing down with gloo's
    # worker threads still alive aborts the process now and then ("terminate called without an
    # active exception", SIGABRT; pytorch/pytorch#65231, #190489): seen here in ~1 of 10 launches.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _report_failure(out: Path, rank: int, exc: BaseException) -> None:
    error = str(exc) if isinstance(exc, DistributedError) else _one_line(exc)
    report = {"rank": rank, "time": time.time(), "error": error, "traceback": traceback.format_exc()}
    _write_atomically(out / f"rank{rank}.error.json", json.dumps(report).encode())


def _wait_for_every_rank(store: Any, nproc: int) -> None:
    """Return once every rank has reached this point (spawned, torch imported, store joined)."""
    store.add("spikecheck/ranks-up", 1)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while store.add("spikecheck/ranks-up", 0) < nproc:
        if time.monotonic() > deadline:
            raise DistributedError(f"not every rank started within {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def _first_failure(results: Path, exc: Exception, exit_codes: list[int | None], nproc: int) -> DistributedError:
    """The root cause among the ranks' failures.

    A rank that died without reporting (a signal, ``os._exit``, a crash in C++) is the cause:
    its peers only report losing it. Otherwise the first report in time is: the others fail
    after it, when their collectives lose it. Ranks the launcher itself terminated after the
    first failure (SIGTERM, SIGKILL) are not causes.
    """
    reports = {r["rank"]: r for r in (json.loads(p.read_text()) for p in results.glob("rank*.error.json"))}
    first_seen = getattr(exc, "error_index", None)
    launcher_kills = (-signal.SIGTERM, -signal.SIGKILL)
    silent = [
        rank
        for rank, code in enumerate(exit_codes)
        if code not in (0, None) and rank not in reports and (rank == first_seen or code not in launcher_kills)
    ]
    if silent:
        rank = first_seen if first_seen in silent else silent[0]
        code = exit_codes[rank]
        if code is not None and code < 0:
            return DistributedError(
                f"rank {rank} of {nproc} was killed by {signal.Signals(-code).name} without reporting an error (out of memory?)"
            )
        return DistributedError(
            f"rank {rank} of {nproc} exited with code {code} without reporting an error (its stderr says why; "
            f"if it failed while importing, a script that trains with nproc > 1 needs "
            f'`if __name__ == "__main__":` around its code, as every spawning launcher does)'
        )
    if not reports:
        return DistributedError(f"a rank of {nproc} failed without a report: {_one_line(exc)}")
    first = min(reports.values(), key=lambda r: r["time"])
    error = DistributedError(f"rank {first['rank']} of {nproc} failed: {first['error']}")
    error.add_note(f"rank {first['rank']}'s traceback:\n{first['traceback'].rstrip()}")
    return error


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
