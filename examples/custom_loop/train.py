#!/usr/bin/env python3
"""A custom training loop with the slurmtools contract: the DDP loop of examples/plain_ddp and the
lines marked "# slurmtools" (TrainingControl, RequestAgreement, CheckpointManager). Under
`slurmtools run` it is judged hung by its steps, checkpoints at the same step on every rank when
Slurm warns (or its straggling node is swapped out) and stops for the requeue, and resumes from the
newest sealed, verified checkpoint (one cut off mid-write is never chosen). Outside Slurm (plain
torchrun) the same lines do nothing but save.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, ContextManager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from slurmtools.checkpoint import CheckpointManager                        # slurmtools
from slurmtools.runtime import CHECKPOINT_DIR_ENV, TrainingControl         # slurmtools
from slurmtools.train.agreement import RequestAgreement                    # slurmtools

STATE_FILE = "state.pt"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--checkpoint-dir", default="", help="default: the job spec's checkpoint_dir")
    ap.add_argument("--step-sleep-s", type=float, default=0.0, help="stands for more work per step")
    args = ap.parse_args()
    dist.init_process_group("gloo")             # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optim = build_model()
    # --8<-- [start:contract]
    control, agreement = TrainingControl(rank=rank), RequestAgreement()               # slurmtools
    control.install_signal_handlers()           # Slurm's warning and SIGTERM become a request
    manager = CheckpointManager(args.checkpoint_dir or os.environ[CHECKPOINT_DIR_ENV])
    latest = manager.latest()                   # the newest sealed and verified checkpoint, or None
    step = 0
    if latest is not None:
        state = torch.load(latest.path / STATE_FILE, weights_only=True)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = int(state["step"])
    while step < args.steps:
        t0 = time.monotonic()
        control.heartbeat(step)                 # at the top of each step: the hang watchdog's evidence
        loss = train_one_step(model, optim, step, rank, world, args.step_sleep_s, control.busy)
        step += 1
        control.heartbeat(step)
        control.step_done(step, time.monotonic() - t0, loss=loss)       # the report and the metrics
        requested = agreement.check(step, control.checkpoint_requested(), time.monotonic() - t0)
        if requested or step % args.checkpoint_every == 0 or step == args.steps:
            saved_t0 = time.monotonic()
            if rank == 0:                       # written to step_N.tmp, sealed, renamed to step_N
                manager.save(step, lambda path: torch.save(
                    {"model": model.module.state_dict(), "optim": optim.state_dict(), "step": step},
                    Path(path) / STATE_FILE))
                control.checkpoint_done(step, time.monotonic() - saved_t0, requested=requested)
            dist.barrier()
        if requested:                           # every rank at the same step: stop, the job goes on later
            control.mark_stopped_for_requeue(step)
            dist.destroy_process_group()
            return 0
    control.mark_complete(step)
    # --8<-- [end:contract]
    if rank == 0:
        print(f"trained {step} steps on {world} ranks", flush=True)
    dist.destroy_process_group()
    return 0


def build_model() -> "tuple[DistributedDataParallel, torch.optim.Optimizer]":
    """Your model and optimizer (the same initial weights on every rank)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


# --8<-- [start:step]
def train_one_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, rank: int, world: int,
                   sleep_s: float, busy: Callable[[], ContextManager[None]]) -> float:
    """Your step (here a tiny regression on data seeded by step and rank). busy() times this rank's
    own compute, which waits for no other rank: the straggler watch compares it across nodes (a
    collective inside it would make every rank as slow as the slowest)."""
    with busy():
        data = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(16, 32, generator=data)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        time.sleep(sleep_s)
    optim.zero_grad()
    loss.backward()                             # DDP's gradient all-reduce: every rank waits here
    optim.step()
    return float(loss.item())
# --8<-- [end:step]

if __name__ == "__main__":
    sys.exit(main())
