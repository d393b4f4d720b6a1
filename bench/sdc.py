#!/usr/bin/env python3
"""Cost of the silent-data-corruption canary on CPU/gloo: one check (a forward pass of the fixed
reference batch on the current weights, a sha256 of logits and loss, one all-gather) against a
training step of the reference trainer, and its share of step time at the default interval.

    .venv/bin/python bench/sdc.py [--procs 2] [--steps 40] [--every 100]

Launches itself under torchrun; rank 0 prints the figures.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time

from selflaunch import is_worker, run_under_torchrun


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from slurmtools.train.sdc_canary import canary
    from slurmtools.reference.tiny_model import TrainConfig, batch_for, build, train_step

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    cfg = TrainConfig()
    model, optim = build(cfg, world, device)
    steps, checks = [], []
    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        train_step(model, optim, step, rank, world, cfg, device)
        steps.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        assert canary(model, batch_for(-1, 0, 1, cfg, device), device, step, corrupt=False) is None
        checks.append(time.perf_counter() - t0)
    if rank == 0:
        step_s, check_s = statistics.median(steps[2:]), statistics.median(checks[2:])
        print(f"model {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params (tiny_fsdp defaults), "
              f"world size {world}, {args.steps} steps")
        print(f"training step: median {step_s * 1000:.1f} ms; one canary check: median {check_s * 1000:.1f} ms "
              f"({check_s / step_s:.2f} of a step)")
        print(f"canary cost at every {args.every} steps: {check_s / (args.every * step_s):.2%} of step time")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=100, help="the interval to report (distributed.sdc_check_every)")
    args = ap.parse_args()
    if is_worker():
        worker(args)
        return
    run_under_torchrun(__file__, args.procs, ["--steps", str(args.steps), "--every", str(args.every)])


if __name__ == "__main__":
    main()
