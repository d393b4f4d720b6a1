#!/usr/bin/env python3
"""Checkpoint costs on CPU/gloo: blocking time of sync vs async DCP saves, and the overhead of
the atomic commit (sha256 manifest + fsync + rename) and of verifying on `latest()`.

    .venv/bin/python bench/checkpoint.py [--procs 2] [--saves 5] [--dim 256 --layers 4]

Launches itself under torchrun; rank 0 prints the figures.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

from selflaunch import is_worker, run_under_torchrun


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from slurmtools import checkpoint_torch
    from slurmtools.checkpoint import CheckpointManager
    from slurmtools.tiny_fsdp import TinyLM, TrainConfig, batch_for

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    cfg = TrainConfig(dim=args.dim, layers=args.layers, heads=4)
    model = TinyLM(cfg.vocab, cfg.dim, cfg.layers, cfg.heads, cfg.seq)
    mesh = init_device_mesh("cpu", (world,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int, before_update=None) -> None:
        tokens = batch_for(i, rank, world, cfg, torch.device("cpu"))
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        if before_update is not None:
            before_update()
        optim.step()

    step(0)
    params = sum(p.numel() for p in model.parameters())
    root = args.dir
    manager = CheckpointManager(os.path.join(root, "managed"), keep=2)

    raw, sync, commit, verify = [], [], [], []

    def raw_save(i: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, optim)
        dcp.save({"model": msd, "optim": osd}, storage_writer=FileSystemWriter(os.path.join(root, f"raw{i}"),
                                                                                 overwrite=False))
        dist.barrier()
        return time.perf_counter() - t0

    def managed_save(i: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        checkpoint_torch.save(manager, 100 + i, model, optim)
        return time.perf_counter() - t0

    commit_s: list = []
    real_commit = manager.commit

    def timed_commit(*a, **kw):
        t0 = time.perf_counter()
        try:
            return real_commit(*a, **kw)
        finally:
            commit_s.append(time.perf_counter() - t0)
    manager.commit = timed_commit  # type: ignore[method-assign]

    raw_save(-1)           # warm-up: first saves pay for imports, planner caches and page cache
    managed_save(99)
    for i in range(args.saves):
        if i % 2:          # alternate the order so neither always runs first
            sync.append(managed_save(i))
            raw.append(raw_save(i))
        else:
            raw.append(raw_save(i))
            sync.append(managed_save(i))
        if rank == 0:
            t0 = time.perf_counter()
            manager.latest()
            verify.append(time.perf_counter() - t0)
        step(i + 1)

    saver = checkpoint_torch.AsyncCheckpointer(CheckpointManager(os.path.join(root, "async"), keep=2))
    saver.save(199, model, optim)         # warm-up: the first save allocates the staging buffers
    saver.wait()
    blocking, complete = [], []
    for i in range(args.saves):
        dist.barrier()
        t0 = time.perf_counter()
        saver.save(200 + i, model, optim)
        stall = time.perf_counter() - t0
        waited = []

        def staged() -> None:             # the staging copy overlaps forward/backward; what is left stalls
            t = time.perf_counter()
            saver.wait_staged()
            waited.append(time.perf_counter() - t)
        step(i + 10, before_update=staged)   # training goes on while the shards are written
        blocking.append(stall + waited[0])
        t1 = time.perf_counter()
        saver.wait()
        complete.append(time.perf_counter() - t0)
        if rank == 0:
            t2 = time.perf_counter()
            commit.append(t2 - t1)

    if rank == 0:
        newest = str(manager.latest().path)
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(newest) for f in fs)
        med = statistics.median
        print(f"model {params / 1e6:.2f}M params, world size {world}, checkpoint {size / 1e6:.1f} MB, "
              f"{args.saves} saves each")
        print(f"raw dcp.save (no manifest, no rename): median {med(raw) * 1000:.0f} ms")
        print(f"sync save through CheckpointManager:  median {med(sync) * 1000:.0f} ms (the DCP write itself "
              f"varies {min(raw) * 1000:.0f}-{max(raw) * 1000:.0f} ms with page-cache write-back)")
        print(f"atomic commit (sha256 manifest + fsync + rename + retention), timed directly: "
              f"median {med(commit_s[1:]) * 1000:.0f} ms")
        print(f"async save: blocks {med(blocking) * 1000:.0f} ms (the call, plus the wait for the staging copy "
              f"before the next optimizer step), complete after {med(complete) * 1000:.0f} ms (incl. one training step)")
        print(f"ratio async-blocking/sync-save {med(blocking) / med(sync):.2f}")
        print(f"latest() with sha256 verification: median {med(verify) * 1000:.1f} ms")
    saver.close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dir")
    args = ap.parse_args()
    if is_worker():
        worker(args)
        return
    with tempfile.TemporaryDirectory() as d:
        run_under_torchrun(__file__, args.procs, ["--saves", str(args.saves), "--dim", str(args.dim),
                                                  "--layers", str(args.layers), "--dir", d])


if __name__ == "__main__":
    main()
