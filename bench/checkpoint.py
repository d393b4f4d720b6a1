#!/usr/bin/env python3
"""Checkpoint costs on CPU/gloo: blocking time of sync vs async DCP saves, and the overhead of
the atomic commit (manifest of the digests computed while writing + rename) and of verifying
on resume (each rank hashes its share of the files, checkpoint_resume.verified_latest).

    .venv/bin/python bench/checkpoint.py [--procs 2] [--saves 5] [--dim 256 --layers 4]
    .venv/bin/python bench/checkpoint.py --sizes-gb 0.5,1,2,4 --worlds 2,4 [--saves 3]

Launches itself under torchrun; rank 0 prints the figures. With --sizes-gb, one run per size and
world size (a dim-1024 model with as many layers as make that checkpoint: fp32 weights and both
AdamW moments, 12 bytes a parameter), then a table per GB and, at the largest size, the lines
`ratio sync-commit/raw-write <x>` (goal <= 1.1) and `ratio async-blocking/sync-save <x>` (goal <= 0.02).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
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

    from slurmtools.checkpoint import resume as checkpoint_resume, torch_dcp as checkpoint_torch
    from slurmtools.checkpoint.manager import CheckpointManager
    from slurmtools.reference.tiny_model import TinyLM, TrainConfig, batch_for

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

    def quiesce() -> None:
        """Write back the previous save's dirty pages before the next is timed: otherwise the
        page cache's write-back of one lands on whichever save runs after it."""
        if rank == 0:
            os.sync()
        dist.barrier()

    def raw_save(i: int) -> float:
        quiesce()
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, optim)
        dcp.save({"model": msd, "optim": osd}, storage_writer=FileSystemWriter(os.path.join(root, f"raw{i}"),
                                                                                 overwrite=False))
        dist.barrier()
        return time.perf_counter() - t0

    def managed_save(i: int) -> float:
        quiesce()
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
        dist.barrier()
        t0 = time.perf_counter()
        checkpoint_resume.verified_latest(manager)      # as on resume: every rank hashes its share
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
        print(f"atomic commit (digest manifest + fsync + rename + retention), timed directly: "
              f"median {med(commit_s[1:]) * 1000:.0f} ms")
        print(f"async save: blocks {med(blocking) * 1000:.0f} ms (the call, plus the wait for the staging copy "
              f"before the next optimizer step), complete after {med(complete) * 1000:.0f} ms (incl. one training step)")
        print(f"ratio async-blocking/sync-save {med(blocking) / med(sync):.2f}")
        print(f"verify on resume (each rank hashes its share of the files): median {med(verify) * 1000:.1f} ms")
        print("ROW " + json.dumps({"gb": size / 1e9, "world": world, "raw_s": med(raw), "sync_s": med(sync),
                                   "commit_s": med(commit_s[1:]), "async_block_s": med(blocking),
                                   "verify_s": med(verify)}))
    saver.close()
    dist.barrier()
    dist.destroy_process_group()


SWEEP_DIM = 1024
# bytes of checkpoint per parameter: fp32 weights and AdamW's two fp32 moments
CHECKPOINT_BYTES_PER_PARAM = 12


def layers_for(size_gb: float, dim: int = SWEEP_DIM, heads: int = 4) -> int:
    """Blocks of a dim-wide TinyLM whose checkpoint is about size_gb."""
    from slurmtools.reference.tiny_model import Block
    block_params = sum(p.numel() for p in Block(dim, heads).parameters())
    return max(1, math.ceil(size_gb * 1e9 / (CHECKPOINT_BYTES_PER_PARAM * block_params)))


def sweep(args: argparse.Namespace) -> None:
    rows = []
    for size_gb in [float(x) for x in args.sizes_gb.split(",")]:
        for world in [int(x) for x in args.worlds.split(",")]:
            print(f"== {size_gb:g} GB at world size {world}", flush=True)
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                out = run_under_torchrun(__file__, world, ["--saves", str(args.saves), "--dim", str(SWEEP_DIM),
                                                           "--layers", str(layers_for(size_gb)), "--dir", d])
            rows += [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
    print("GB    world  raw write s/GB  sync save s/GB  commit s/GB  async blocking s/GB  verify s/GB")
    for r in rows:
        print(f"{r['gb']:<5.2f} {r['world']:<6d} {r['raw_s'] / r['gb']:<15.3f} {r['sync_s'] / r['gb']:<15.3f} "
              f"{r['commit_s'] / r['gb']:<12.3f} {r['async_block_s'] / r['gb']:<20.3f} {r['verify_s'] / r['gb']:.3f}")
    largest = max(r["gb"] for r in rows)
    for r in (r for r in rows if r["gb"] == largest):
        print(f"ratio sync-commit/raw-write {r['sync_s'] / r['raw_s']:.2f} ({r['gb']:.2f} GB, world {r['world']})")
        print(f"ratio async-blocking/sync-save {r['async_block_s'] / r['sync_s']:.3f} ({r['gb']:.2f} GB, "
              f"world {r['world']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--sizes-gb", help="comma list of checkpoint sizes to sweep (e.g. 0.5,1,2,4)")
    ap.add_argument("--worlds", default="2", help="comma list of world sizes for --sizes-gb")
    ap.add_argument("--dir", help="where the checkpoints are written (default: a temporary directory)")
    args = ap.parse_args()
    if is_worker():
        worker(args)
        return
    if args.sizes_gb:
        sweep(args)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        run_under_torchrun(__file__, args.procs, ["--saves", str(args.saves), "--dim", str(args.dim),
                                                  "--layers", str(args.layers), "--dir", d])

if __name__ == "__main__":
    main()
