"""The tiny FSDP2 language model and its training loop: the reference trainer slurmtools uses in
examples, tests and benchmarks (sbatch path and submitit path alike).

A real trainer's moving parts, so recovery is tested against them: dropout, a shuffled
multi-worker data loader (slurmtools.resumable_loader) and a warmup + cosine LR schedule. Their
state (RNG streams, loader position, scheduler) is saved with every checkpoint
(slurmtools.trainer_state), so a resumed run is bit-identical to an uninterrupted one at the same
world size. Checkpoints go through CheckpointManager + DCP; heartbeats and checkpoint requests
through slurmtools.runtime. Needs torch (pip install 'slurmtools[torch]').
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from slurmtools import checkpoint_torch, sdc_canary, snapshot_fsdp
from slurmtools.agreement import agree
from slurmtools.checkpoint import CheckpointManager
from slurmtools.errors import CheckpointError
from slurmtools.resumable_loader import ResumableLoader
from slurmtools.state_digest import state_hash
from slurmtools.tiny_data import SequenceDataset, accumulation, warmup_cosine
from slurmtools.trainer_state import TrainerState
from slurmtools.runtime import SDC_CHECK_EVERY_ENV, TrainingControl
from slurmtools.tiny_faults import Faults


@dataclass
class TrainConfig:
    steps: int = 20
    checkpoint_every: int = 5
    checkpoint_dir: Optional[str] = None
    vocab: int = 256
    dim: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 32
    batch_per_rank: int = 8
    lr: float = 3e-3
    seed: int = 1234
    dropout: float = 0.1
    dataset_size: int = 256         # samples per epoch (shuffled each epoch): 16 steps at 2 ranks x 8
    loader_workers: int = 2
    warmup_steps: int = 4           # then cosine decay to min_lr_ratio x lr at `steps`
    min_lr_ratio: float = 0.1
    step_sleep_s: float = 0.0
    local_work_s: float = 0.0       # a sleep inside TrainingControl.busy each step: the accelerator's compute
    fail_at_step: int = -1
    fail_again_at_step: int = -1    # the attempt after the faulting one fails here (a second, later crash)
    hang_at_step: str = ""
    slow_checkpoint_at: int = -1
    slow_checkpoint_s: float = 30.0
    slow_requested_checkpoint: bool = False     # a requested save (SIGTERM, a warning) takes slow_checkpoint_s more
    faults_on_attempt: int = 0
    slow_node: str = ""             # "HOST:SECONDS": ranks on HOST are that much slower per step (a straggler)
    skip_collective_at: str = ""    # "RANK:STEP": that rank never enters the step's loss all-reduce
    sdc_check_every: int = -1       # the SDC canary's interval; -1: SLURMTOOLS_SDC_CHECK_EVERY (the spec's), else off
    # TEST ONLY, off unless set: "RANK:STEP" makes that rank's canary result wrong from STEP on, as
    # a GPU computing wrong numbers would; read by the canary alone, never by training
    sdc_fault: str = ""
    # periodic saves in the background (a final or requested save blocks); same commit rule
    async_checkpoint: bool = True
    # a periodic (async) save that fails, e.g. on a full file system: "continue" training (the
    # previous checkpoint stays the newest) or "stop"; a requested or final save that fails stops
    on_save_error: str = "continue"
    # TEST ONLY, off unless set: trainer-state names ("rng,loader,scheduler") NOT restored on
    # resume, to show that losing any one of them changes the result
    forget_on_resume: str = ""
    # in-memory snapshots every N steps (docs/snapshots.md); -1: SLURMTOOLS_SNAPSHOT_EVERY (the spec's), else off
    snapshot_every: int = -1


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(hidden)
        mask = torch.triu(torch.ones(hidden.size(1), hidden.size(1), dtype=torch.bool, device=hidden.device), 1)
        hidden = hidden + self.attn(normed, normed, normed, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = hidden + self.mlp(self.norm2(hidden))
        return out


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits as (batch*seq, vocab): a 2-D output, not a view FSDP2 warns about."""
        hidden = self.embed(tokens) + self.pos[: tokens.size(1)]
        for block in self.blocks:
            hidden = block(hidden)
        hidden = self.norm(hidden)
        logits: torch.Tensor = self.head(hidden.reshape(-1, hidden.size(-1)))
        return logits


def batch_for(step: int, rank: int, world: int, cfg: TrainConfig, device: torch.device) -> torch.Tensor:
    """The global batch of a step is fixed; rank r takes its slice (same data at any layout)."""
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    rows = cfg.batch_per_rank * world
    # learnable structure: arithmetic sequences mod vocab (random start, stride 1..3)
    start = torch.randint(0, cfg.vocab, (rows, 1), generator=generator)
    stride = torch.randint(1, 4, (rows, 1), generator=generator)
    global_batch = (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab
    return global_batch[rank * cfg.batch_per_rank:(rank + 1) * cfg.batch_per_rank].to(device)


def build(cfg: TrainConfig, world: int, device: torch.device) -> "tuple[TinyLM, torch.optim.Optimizer]":
    """The model, sharded over all ranks (FSDP2), and its optimizer; the same on every rank."""
    torch.manual_seed(cfg.seed)
    model = TinyLM(cfg.vocab, cfg.dim, cfg.layers, cfg.heads, cfg.seq, cfg.dropout).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return model, optim


def train_step(model: nn.Module, optim: torch.optim.Optimizer, step: int, rank: int, world: int, cfg: TrainConfig,
               device: torch.device, before_update: Optional[Callable[[], None]] = None,
               local_work: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
               numbers: Optional[Dict[str, float]] = None, batches: Optional[ResumableLoader] = None,
               micro_batches: int = 1) -> torch.Tensor:
    """One optimizer step on this rank's next batch (from batches, else its slice of the step's
    fixed global batch, batch_for); the local loss.
    micro_batches > 1 (batches only): that many batches, their gradients accumulated (synchronised
    once, on the last), each loss weighted 1/micro_batches: the step of a larger world (a resume
    on fewer nodes keeps the run's global batch and so its optimisation).
    before_update runs just before the weights change (an async save's staging copy ends there);
    local_work wraps the optimizer step, the part that waits for no other rank (a sharded
    model's update is local), e.g. TrainingControl.busy for the straggler watch. numbers, when
    given, gets the step's data wait, gradient norm and the time of its all-reduce (collective:
    every rank must pass it or none)."""
    if micro_batches > 1 and batches is None:
        raise ValueError("micro_batches > 1 needs a data loader (batch_for gives one batch per step)")
    optim.zero_grad(set_to_none=True)
    data_wait_s = 0.0
    loss = torch.zeros(())
    for micro in range(micro_batches):
        data_t0 = time.monotonic()
        tokens = batches.next_batch().to(device) if batches is not None else batch_for(step, rank, world, cfg, device)
        data_wait_s += time.monotonic() - data_t0
        if micro_batches > 1 and isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(micro == micro_batches - 1)   # reduce once per step
        logits = model(tokens[:, :-1])
        micro_loss = nn.functional.cross_entropy(logits, tokens[:, 1:].reshape(-1))
        if micro_batches > 1:
            micro_loss = micro_loss / micro_batches
        micro_loss.backward()  # type: ignore[no-untyped-call]
        loss = micro_loss.detach() if micro == 0 else loss + micro_loss.detach()
    if numbers is not None:
        numbers["data_wait_s"] = data_wait_s
    if numbers is not None:
        norm_t0 = time.monotonic()
        numbers["grad_norm"] = grad_norm(model)
        numbers["collective_s"] = time.monotonic() - norm_t0
    if before_update is not None:
        before_update()
    with local_work():
        optim.step()
    return loss


def grad_norm(model: nn.Module) -> float:
    """The global L2 norm of the gradients (read only: no clipping). With sharded (DTensor)
    gradients the local norms are all-reduced, so every rank gets the same number."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def log_json(record: Dict[str, Any]) -> None:
    print(json.dumps(dict(record, t=round(time.time(), 3)), sort_keys=True), flush=True)


def train(cfg: TrainConfig, control: TrainingControl, log: Callable[[Dict[str, Any]], None] = log_json
          ) -> Dict[str, Any]:
    """Train until cfg.steps or a checkpoint request; the process group must be initialised.

    Returns {"event": "final", "step", "state_sha256", ...} or {"event": "stopped_for_requeue", "step"}.
    """
    try:
        with contextlib.ExitStack() as cleanup:     # a crash too: the loader's workers are stopped
            return _train(cfg, control, log, cleanup)
    finally:          # a crash too: the last seconds of step numbers reach the step log
        control.flush_metrics()


def _train(cfg: TrainConfig, control: TrainingControl, log: Callable[[Dict[str, Any]], None],
           cleanup: contextlib.ExitStack) -> Dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    model, optim = build(cfg, world, device)
    torch.manual_seed(cfg.seed * 1_000 + rank)        # dropout: each rank its own stream
    manager = CheckpointManager(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    saver = checkpoint_torch.AsyncCheckpointer(manager) if manager and cfg.async_checkpoint else None
    if saver is not None:
        cleanup.push(saver.finish_on_crash)
    # the run's global batch (samples per optimizer step), fixed at its first start and saved with
    # every checkpoint: a resume on fewer ranks accumulates micro-batches to keep it
    global_batch = cfg.batch_per_rank * world
    meta: Dict[str, Any] = {"attempt_id": control.attempt_id}
    batches = ResumableLoader(SequenceDataset(cfg.dataset_size, cfg.vocab, cfg.seq, cfg.seed),
                              batch_size=cfg.batch_per_rank, rank=rank, world=world, seed=cfg.seed,
                              num_workers=cfg.loader_workers)
    cleanup.callback(batches.close)
    schedule = warmup_cosine(optim, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    trainer_state = TrainerState({"loader": batches, "scheduler": schedule})

    start = 0
    extra: Optional[Dict[str, Any]] = None
    t0 = time.monotonic()
    snaps = snapshot_fsdp.Session.open(cfg.snapshot_every, control.control_dir, control.attempt_id)
    if snaps is not None:
        cleanup.push(snaps.exit)
        with control.phase("verifying"):
            extra = snaps.restore_into(model, optim, trainer_state, manager)
    if extra is not None:
        extra.update(path=f"in-memory {extra.pop('why')}", not_restored=[], refused=[], saved_world_size=world)
        start = int(extra["step"])
        global_batch = int(extra.get("global_batch") or global_batch)
    elif manager is not None:
        forget = tuple(name for name in cfg.forget_on_resume.split(",") if name)
        with control.phase("verifying"):          # each rank hashes its share: no hang, however long
            extra = checkpoint_torch.load_latest(manager, model, optim, trainer_state, skip=forget)
        if extra is not None:
            start = int(extra["step"])
            global_batch = int(extra.get("global_batch") or cfg.batch_per_rank * (extra["saved_world_size"] or world))
            if "rng" in extra["not_restored"]:       # another world size: a fresh stream per rank
                torch.manual_seed(cfg.seed * 1_000_003 + start * 1_000 + rank)
    micro_batches = accumulation(global_batch, cfg.batch_per_rank, world)
    meta["global_batch"] = global_batch
    if extra is not None and rank == 0:
        for path, why in extra["refused"]:
            log({"event": "checkpoint_refused", "path": path, "why": why, "attempt_id": control.attempt_id})
        control.checkpoints_refused(extra["refused"])
        log({"event": "resumed", "step": start, "path": extra["path"], "world_size": world,
             "attempt_id": control.attempt_id, "load_s": round(time.monotonic() - t0, 3),
             "not_restored": extra["not_restored"], "saved_world_size": extra["saved_world_size"],
             "global_batch": global_batch, "micro_batches": micro_batches})
        if extra["saved_world_size"] not in (None, world):     # min_nodes: say what changed, and what did not
            print(f"slurmtools: resumed on {world} ranks from a checkpoint of {extra['saved_world_size']}: the global "
                  f"batch stays {global_batch} samples, {micro_batches} micro-batch(es) of {cfg.batch_per_rank} "
                  f"per rank per step (gradient accumulation); the LR schedule is unchanged",
                  file=sys.stderr, flush=True)
    faults = Faults.of(cfg, rank, os.environ)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else None   # GPU work done, not queued

    @contextlib.contextmanager
    def local_work() -> Iterator[None]:
        with control.busy(synchronize):
            yield
            if cfg.local_work_s:
                time.sleep(cfg.local_work_s)
            if faults.slower_s:
                time.sleep(faults.slower_s)
    sdc_every = cfg.sdc_check_every if cfg.sdc_check_every >= 0 else int(os.environ.get(SDC_CHECK_EVERY_ENV) or 0)
    control.install_signal_handlers()
    step = start
    while step < cfg.steps:
        faults.before_step(rank, step)
        control.heartbeat(step)
        step_t0 = time.monotonic()
        numbers: Optional[Dict[str, float]] = {} if control.records_steps else None
        loss = train_step(model, optim, step, rank, world, cfg, device,
                          before_update=saver.wait_staged if saver is not None else None, local_work=local_work,
                          numbers=numbers, batches=batches, micro_batches=micro_batches)
        schedule.step()
        step += 1
        faults.after_update(rank, step)
        reduced = loss.detach().clone()
        collective_t0 = time.monotonic()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        collective_s = time.monotonic() - collective_t0
        if numbers is not None:
            control.step_done(step, time.monotonic() - step_t0, tokens=cfg.batch_per_rank * cfg.seq * micro_batches,
                              loss=reduced.item() / world, grad_norm=numbers["grad_norm"],
                              collective_s=collective_s + numbers["collective_s"], data_wait_s=numbers["data_wait_s"])
        if rank == 0:
            log({"step": step, "total_steps": cfg.steps, "loss": (reduced.item() / world).hex(), "world_size": world,
                 "attempt_id": control.attempt_id})
        if cfg.step_sleep_s:
            time.sleep(cfg.step_sleep_s)
        if saver is not None:
            saver.poll()
            checkpoint_torch.report_failed_saves(saver, cfg.on_save_error, rank, log, control.attempt_id)
        requested = agree(control.checkpoint_requested())
        sealing = manager is not None and (requested or step % cfg.checkpoint_every == 0 or step == cfg.steps)
        if sdc_every and (sealing or step % sdc_every == 0):
            found = sdc_canary.canary(model, batch_for(-1, 0, 1, cfg, device), device, step, faults.corrupts(rank, step))
            if found is not None:     # stop before this state becomes a checkpoint
                if saver is not None:
                    saver.close()     # the save in flight began after a passing check
                control.mark_sdc(found.step, found.odd_ranks, found.node, found.detail, found.nodes)
                if rank == 0:
                    log({"event": "sdc", "step": step, "ranks": found.odd_ranks, "node": found.node,
                         "nodes": list(found.nodes), "detail": found.detail, "attempt_id": control.attempt_id})
                raise RuntimeError(f"silent data corruption: {found.detail}")
        if snaps is not None:
            snaps.after_step(step, model, optim, trainer_state, meta)
            if requested and manager is not None:     # the step in node memory before a save KillWait may cut
                kept = snaps.before_requested_save(step, model, optim, trainer_state, meta)
                if rank == 0:
                    log({"event": "snapshot_before_save", "step": step, "kept": kept, "attempt_id": control.attempt_id})
        if sealing and manager is not None:
            t0 = time.monotonic()
            if saver is not None and not requested and step != cfg.steps:
                # training goes on; the save first waits for the previous one, which on a slow store
                # can take minutes: work, not a hang (outside a phase it was killed as one, again and again)
                with control.phase("saving"):
                    saver.save(step, model, optim, meta=meta, trainer_state=trainer_state)
            else:
                with control.phase("saving"):                 # a requested or final save is blocking
                    if saver is not None:
                        saver.wait()
                        checkpoint_torch.report_failed_saves(saver, cfg.on_save_error, rank, log, control.attempt_id)
                    slow = step == faults.slow_checkpoint_at or (requested and faults.slow_requested_checkpoint)
                    pause = (lambda: time.sleep(cfg.slow_checkpoint_s)) if slow else None
                    try:
                        checkpoint_torch.save(manager, step, model, optim, meta=meta, before_commit=pause,
                                              trainer_state=trainer_state)
                    except CheckpointError as exc:
                        if rank == 0:
                            log({"event": "checkpoint_failed", "step": step, "error": str(exc),
                                 "attempt_id": control.attempt_id})
                        raise
            if rank == 0:
                control.checkpoint_done(step, round(time.monotonic() - t0, 3), requested=requested)
                log({"event": "checkpoint", "step": step, "save_s": round(time.monotonic() - t0, 3),
                     "requested": requested, "attempt_id": control.attempt_id})
        if requested and step < cfg.steps:
            if saver is not None:
                saver.close()
            batches.close()
            control.heartbeat(step)
            control.mark_stopped_for_requeue(step)
            if rank == 0:
                log({"event": "stopped_for_requeue", "step": step, "attempt_id": control.attempt_id})
            return {"event": "stopped_for_requeue", "step": step, "attempt_id": control.attempt_id}
    if saver is not None:
        saver.close()
    batches.close()
    control.heartbeat(step)
    digest = state_hash(model, optim)
    if snaps is not None:
        snaps.finish()          # the final checkpoint is sealed: node memory is freed for the next job
    final = {"event": "final", "step": step, "state_sha256": digest, "world_size": world,
             "attempt_id": control.attempt_id}
    if rank == 0:
        log(final)
    control.mark_complete(step)
    return final


def shutdown() -> None:
    """Every rank reaches the barrier before any tears gloo down: a rank destroying its process
    group while a peer still talks to it can abort the peer at exit."""
    dist.barrier()
    dist.destroy_process_group()
