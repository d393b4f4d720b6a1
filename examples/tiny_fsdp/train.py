#!/usr/bin/env python3
"""A tiny but real FSDP2 trainer for slurmtools: gloo on CPU, nccl on GPU, chosen by itself.

- model: a small transformer language model; data: a deterministic function of the step,
  each rank its own slice, so a resumed run is bit-identical to an uninterrupted one;
- DCP checkpoints every N steps through slurmtools' CheckpointManager (atomic, verified),
  resume from the latest complete one on start;
- one JSON line per step on rank 0: step, loss (float.hex), world size, attempt id;
- heartbeats and checkpoint requests through slurmtools.runtime (the supervisor's protocol).
Fault hooks for tests: --fail-at-step, --hang-at-step RANK:STEP, --step-sleep-s.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from slurmtools import checkpoint_torch
from slurmtools.checkpoint import CheckpointManager
from slurmtools.runtime import TrainingControl, agree


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits as (batch*seq, vocab): a 2-D output, not a view FSDP2 warns about."""
        x = self.embed(tokens) + self.pos[: tokens.size(1)]
        for b in self.blocks:
            x = b(x)
        x = self.norm(x)
        return self.head(x.reshape(-1, x.size(-1)))


def batch_for(step: int, rank: int, world: int, args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """The global batch of a step is fixed; rank r takes its slice (same data at any layout)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    n = args.batch_per_rank * world
    # learnable structure: arithmetic sequences mod vocab (random start, stride 1..3)
    start = torch.randint(0, args.vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    global_batch = (start + stride * torch.arange(args.seq + 1)) % args.vocab
    return global_batch[rank * args.batch_per_rank:(rank + 1) * args.batch_per_rank].to(device)


def state_hash(model: nn.Module, optim: torch.optim.Optimizer) -> str:
    """sha256 over the full (unsharded) model + optimizer state, in key order; collective."""
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    h = hashlib.sha256()

    def feed(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for k in sorted(obj, key=str):
                feed(f"{prefix}.{k}", obj[k])
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                feed(f"{prefix}.{i}", v)
        elif isinstance(obj, torch.Tensor):
            h.update(prefix.encode())
            h.update(obj.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"{prefix}={obj!r}".encode())

    feed("model", msd)
    feed("optim", osd)
    return h.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--checkpoint-dir", default=os.environ.get("SLURMTOOLS_CHECKPOINT_DIR"))
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch-per-rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--step-sleep-s", type=float, default=0.0, help="slow each step (fault tests)")
    ap.add_argument("--fail-at-step", type=int, default=-1, help="raise on every rank at this step")
    ap.add_argument("--hang-at-step", default="", help="RANK:STEP: that rank stops (no heartbeat) at STEP")
    ap.add_argument("--slow-checkpoint-at", type=int, default=-1,
                    help="this step's checkpoint pauses --slow-checkpoint-s between shards and commit")
    ap.add_argument("--slow-checkpoint-s", type=float, default=30.0)
    ap.add_argument("--faults-on-attempt", type=int, default=0,
                    help="inject faults only on this restart count (SLURM_RESTART_COUNT); -1: every attempt")
    return ap.parse_args(argv)


def shutdown() -> None:
    """Every rank reaches the barrier before any tears gloo down: a rank destroying its process
    group while a peer still talks to it can abort the peer at exit."""
    dist.barrier()
    dist.destroy_process_group()


def log(record: dict) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    timeout_s = int(os.environ.get("SLURMTOOLS_COLLECTIVE_TIMEOUT_S", "1800"))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.seq).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    control = TrainingControl(rank=rank)
    manager = CheckpointManager(args.checkpoint_dir) if args.checkpoint_dir else None
    meta = {"attempt_id": control.attempt_id}

    start = 0
    if manager is not None:
        t0 = time.monotonic()
        extra = checkpoint_torch.load_latest(manager, model, optim)
        if extra is not None:
            start = int(extra["step"])
            if rank == 0:
                log({"event": "resumed", "step": start, "path": extra["path"], "world_size": world,
                     "attempt_id": control.attempt_id, "load_s": round(time.monotonic() - t0, 3)})
    hang_rank, _, hang_step = args.hang_at_step.partition(":")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    faults = args.faults_on_attempt in (-1, restart)
    if not faults:
        hang_step, args.fail_at_step, args.slow_checkpoint_at = "", -1, -1
    control.install_signal_handlers()
    step = start
    while step < args.steps:
        if step == args.fail_at_step:
            raise RuntimeError(f"injected failure at step {step}")
        if hang_step and rank == int(hang_rank) and step == int(hang_step):
            print(f"rank {rank}: injected hang at step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        control.heartbeat(step)
        tokens = batch_for(step, rank, world, args, device)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits, tokens[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        step += 1
        reduced = loss.detach().clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        if rank == 0:
            log({"step": step, "total_steps": args.steps, "loss": (reduced.item() / world).hex(), "world_size": world,
                 "attempt_id": control.attempt_id})
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
        requested = agree(control.checkpoint_requested())
        if manager is not None and (requested or step % args.checkpoint_every == 0 or step == args.steps):
            t0 = time.monotonic()
            pause = (lambda: time.sleep(args.slow_checkpoint_s)) if step == args.slow_checkpoint_at else None
            checkpoint_torch.save(manager, step, model, optim, meta=meta, before_commit=pause)
            if rank == 0:
                log({"event": "checkpoint", "step": step, "save_s": round(time.monotonic() - t0, 3),
                     "requested": requested, "attempt_id": control.attempt_id})
        if requested and step < args.steps:
            control.heartbeat(step)
            control.mark_stopped_for_requeue(step)
            if rank == 0:
                log({"event": "stopped_for_requeue", "step": step, "attempt_id": control.attempt_id})
            shutdown()
            return 0
    control.heartbeat(step)
    digest = state_hash(model, optim)
    if rank == 0:
        log({"event": "final", "step": step, "state_sha256": digest, "world_size": world,
             "attempt_id": control.attempt_id})
    control.mark_complete(step)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
