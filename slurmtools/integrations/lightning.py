"""PyTorch Lightning under `slurmtools run`: one Callback and one resume call.

    from slurmtools.integrations.lightning import SlurmtoolsCallback, resume_path
    trainer = L.Trainer(max_steps=..., callbacks=[SlurmtoolsCallback(every_n_steps=50)])
    trainer.fit(model, ckpt_path=resume_path())

The callback beats every batch (hang detection by step, stragglers), saves a sealed checkpoint
(slurmtools.checkpoint: `step_N/model.ckpt` with a manifest, never resumed from unless complete)
every `every_n_steps` and when the supervisor asks (the warning, a straggler swap: agreed by all
ranks at a batch boundary, then training stops for the requeue), and marks completion. Lightning's
own SLURM auto-requeue (its SIGUSR1 handler: an `hpc_ckpt` and `scontrol requeue` from rank 0,
which needs scontrol inside the container) is switched off: the supervisor requeues.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment

from slurmtools.checkpoint.manager import Checkpoint, CheckpointManager
from slurmtools.common.control_dir import CHECKPOINT_DIR_ENV
from slurmtools.integrations.lightning_memory import MemoryCopy
from slurmtools.train.agreement import RequestAgreement
from slurmtools.train.control import TrainingControl

CHECKPOINT_FILE = "model.ckpt"


def checkpoint_root(checkpoint_dir: Optional[str] = None) -> Optional[Path]:
    """The job's checkpoint dir: the argument, else the spec's (SLURMTOOLS_CHECKPOINT_DIR)."""
    chosen = checkpoint_dir or os.environ.get(CHECKPOINT_DIR_ENV)
    return Path(chosen) if chosen else None


def newest_sealed(checkpoint_dir: Optional[str] = None) -> Optional[Checkpoint]:
    """The newest complete sealed checkpoint (its step and directory), or None: resume_path's."""
    root = checkpoint_root(checkpoint_dir)
    if root is None or not root.is_dir():
        return None
    return CheckpointManager(root).latest(checksums=True)


def resume_path(checkpoint_dir: Optional[str] = None) -> Optional[str]:
    """The newest complete sealed checkpoint's file for `trainer.fit(ckpt_path=...)`, or None (a
    first start). A checkpoint cut off mid-write has no manifest and is never chosen."""
    newest = newest_sealed(checkpoint_dir)
    return str(newest.path / CHECKPOINT_FILE) if newest is not None else None


class SlurmtoolsCallback(pl.Callback):
    """Heartbeats, sealed checkpoints (periodic and on request) and completion for the supervisor."""

    def __init__(self, every_n_steps: int = 0, checkpoint_dir: Optional[str] = None, keep: int = 2) -> None:
        self.every_n_steps = every_n_steps
        self.root = checkpoint_root(checkpoint_dir)
        self.keep = keep
        self.control: Optional[TrainingControl] = None
        self.step_t = time.monotonic()
        self.stopped_for_requeue = False
        self.agreement = RequestAgreement()
        # a recovery in place's copy of each step's state in this process (lightning_memory): set by
        # lightning_inplace.fit under DDP with snapshots on; None keeps none
        self.memory: Optional[MemoryCopy] = None

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        environment = trainer._accelerator_connector.cluster_environment
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            environment.auto_requeue = False     # before Lightning registers its handlers (Trainer._run)
        if self.control is None:     # once: a fit again in the same process (lightning_inplace) keeps it
            self.control = TrainingControl(rank=trainer.global_rank)
            self.control.install_signal_handlers()
        self.stopped_for_requeue = False
        # each fit agrees from its first step: after an in-place recovery a survivor fits again beside
        # a replacement's fresh callback, and a cadence kept from before would put the agreement's
        # collective at other steps than the replacement's (a deadlock; tests/cluster/test_inplace_lightning.py)
        self.agreement = RequestAgreement()

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        assert self.control is not None
        self.control.heartbeat(trainer.global_step, defer=True)
        self.step_t = time.monotonic()

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        assert self.control is not None
        step = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step_s = time.monotonic() - self.step_t
        self.control.step_done(step, step_s, loss=float(loss.detach()) if isinstance(loss, torch.Tensor) else None)
        requested = self.agreement.check(step, self.control.checkpoint_requested(), step_s)
        if requested or (self.every_n_steps and step % self.every_n_steps == 0):
            self.save(trainer, step, requested=requested)
        if requested:
            self.control.heartbeat(step)          # the step it stops at (a beat per step is at its start)
            self.control.mark_stopped_for_requeue(step)
            self.stopped_for_requeue = True
            trainer.should_stop = True
        elif self.memory is not None and self.memory.due(step):
            # the dict trainer.save_checkpoint writes, without its file and its barrier: no collective
            self.memory.keep(step, trainer._checkpoint_connector.dump_checkpoint(weights_only=False), step_s)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        assert self.control is not None
        if not self.stopped_for_requeue and not trainer.interrupted:
            step = trainer.global_step
            if self.every_n_steps and step % self.every_n_steps != 0:
                self.save(trainer, step, requested=False)         # the final state, sealed
            self.control.heartbeat(step)
            self.control.mark_complete(step)

    def save(self, trainer: "pl.Trainer", step: int, *, requested: bool) -> None:
        """Every rank calls Lightning's save_checkpoint (collective for sharded strategies) into
        rank 0's staging dir; rank 0 seals and renames it (slurmtools.checkpoint)."""
        if self.root is None:
            return
        manager = CheckpointManager(self.root, keep=self.keep)
        if manager.final_dir(step).exists():      # resumed here, or saved already: every rank sees it
            return
        started = time.monotonic()
        if trainer.is_global_zero:
            manager.begin(step)
        trainer.strategy.barrier("slurmtools-checkpoint-begin")
        trainer.save_checkpoint(str(manager.tmp_dir(step) / CHECKPOINT_FILE))
        trainer.strategy.barrier("slurmtools-checkpoint-written")
        if trainer.is_global_zero:
            manager.commit(step, meta={"framework": "lightning", "global_step": step})
            assert self.control is not None
            self.control.checkpoint_done(step, time.monotonic() - started, requested=requested)
        trainer.strategy.barrier("slurmtools-checkpoint-sealed")
