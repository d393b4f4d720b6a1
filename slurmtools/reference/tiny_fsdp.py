"""The training loop of the reference trainer slurmtools uses in examples, tests and benchmarks
(sbatch path and submitit path alike); what it trains (the settings, the tiny FSDP2 model, one step)
is tiny_model.py.

A real trainer's moving parts, so recovery is tested against them: dropout, a shuffled
multi-worker data loader (slurmtools.train.resumable_loader) and a warmup + cosine LR schedule. Their
state (RNG streams, loader position, scheduler) is saved with every checkpoint
(slurmtools.train.trainer_state), so a resumed run is bit-identical to an uninterrupted one at the same
world size. Checkpoints go through CheckpointManager + DCP; heartbeats and checkpoint requests
through slurmtools.train.control. Needs torch (pip install 'slurmtools[torch]').
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.distributed as dist

from slurmtools.checkpoint import torch_dcp as checkpoint_torch
from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common.control_dir import SDC_CHECK_EVERY_ENV
from slurmtools.errors import CheckpointError
from slurmtools.reference.state_digest import state_hash
from slurmtools.reference.tiny_data import SequenceDataset, accumulation, warmup_cosine
from slurmtools.reference.tiny_faults import Faults
from slurmtools.reference.tiny_model import TrainConfig, batch_for, build, train_step
from slurmtools.snapshot import fsdp as snapshot_fsdp
from slurmtools.train import sdc_canary
from slurmtools.train.agreement import agree
from slurmtools.train.control import TrainingControl
from slurmtools.train.resumable_loader import ResumableLoader
from slurmtools.train.trainer_state import TrainerState


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
        if snaps is not None and step == faults.fail_at:
            # an injected crash comes once the snapshot in flight is sealed (every rank fails here): the
            # tests say which snapshot the restart restores, however slowly the machine runs (a
            # snapshot still sealing when a real crash comes is not kept)
            snaps.snapshotter.wait()
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
