#!/usr/bin/env python3
"""A plain torchrun DDP script, as users bring them: no slurmtools import. It saves its own
checkpoints with torch.save (to a temporary name, then os.replace: complete once renamed) and
resumes from its newest one. Under `slurmtools run` it still gets node-death detection, crash
restarts within the budget, and completion on exit 0; with `requeue.progress_checkpoints` and
`requeue.progress_log_pattern` in its job spec the supervisor also sees its progress (docs/user-guide.md,
"Your trainer").

    requeue:
      progress_checkpoints: ckpt/step_*.pt
      progress_log_pattern: '^step (\\d+)/'

--crash-once-at-step N (for tests): rank 0 exits 3 at step N, once per checkpoint directory.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def newest_checkpoint(directory: str) -> "str | None":
    paths = glob.glob(os.path.join(directory, "step_*.pt"))
    return max(paths, key=lambda path: int(re.findall(r"\d+", os.path.basename(path))[-1])) if paths else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    ap.add_argument("--crash-once-at-step", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 1)))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    path = newest_checkpoint(args.checkpoint_dir)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from {os.path.basename(path)} at step {start} on {world} ranks", flush=True)
    crashed = os.path.join(args.checkpoint_dir, "crashed-once")
    for step in range(start + 1, args.steps + 1):
        data = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(16, 32, generator=data)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        time.sleep(args.step_sleep_s)
        if rank == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} world {world} host {os.uname().nodename}",
                  flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            if rank == 0:
                final = os.path.join(args.checkpoint_dir, f"step_{step}.pt")
                torch.save({"model": model.module.state_dict(), "optim": optim.state_dict(), "step": step},
                           final + ".tmp")
                os.replace(final + ".tmp", final)
            dist.barrier()
        if rank == 0 and step == args.crash_once_at_step and not os.path.exists(crashed):
            open(crashed, "w").close()
            print(f"crashing at step {step} (--crash-once-at-step)", file=sys.stderr, flush=True)
            os._exit(3)
    if rank == 0:
        print(f"trained {args.steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
