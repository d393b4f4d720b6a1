"""What the reference trainer trains: its settings (TrainConfig), the tiny language model sharded
with FSDP2, the batch each rank draws for a step, and one optimizer step with its gradient norm.
The loop around it, with checkpoints, snapshots and the control contract, is tiny_fsdp.py.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Optional

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from slurmtools.train.resumable_loader import ResumableLoader


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
    # TEST ONLY, off unless set: "RANK:STEP": that rank's process ends at once before STEP (a lost
    # rank, for in-place recovery: train/inplace.py)
    kill_rank_at: str = ""
    # TEST ONLY, off unless set: a rank started into a generation of an in-place recovery (a
    # replacement, a restarted rank) ends at once, before it joins: a second failure during it
    kill_replacement: bool = False
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
    # foreach on CPU too (torch picks it by default on GPUs only): the per-tensor update dispatches each
    # op once per DTensor parameter; 20 steps at world 1 took 0.79 CPU-s with it, 1.17 without, same weights
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=True)
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
