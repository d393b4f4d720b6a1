"""The reference trainer's data and LR schedule: a map-style dataset of learnable token sequences
and a warmup + cosine schedule, both deterministic, so a resumed run can be compared bit for bit
with an uninterrupted one; and the gradient accumulation that keeps a run's global batch on fewer
ranks.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from slurmtools.errors import CheckpointError


class SequenceDataset(Dataset[torch.Tensor]):
    """size samples of seq+1 tokens: arithmetic sequences mod vocab (random start, stride 1..3),
    sample i a function of (seed, i) alone (any worker builds the same sample)."""

    def __init__(self, size: int, vocab: int, seq: int, seed: int) -> None:
        self.size, self.vocab, self.seq, self.seed = size, vocab, seq, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 7_919 + index)
        start = int(torch.randint(0, self.vocab, (1,), generator=generator))
        stride = int(torch.randint(1, 4, (1,), generator=generator))
        return (start + stride * torch.arange(self.seq + 1)) % self.vocab


def warmup_cosine(optim: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over warmup_steps, then cosine decay to min_ratio of the base LR at total_steps."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return torch.optim.lr_scheduler.LambdaLR(optim, factor)


def accumulation(global_batch: int, batch_per_rank: int, world: int) -> int:
    """Micro-batches per optimizer step that keep the run's global batch on this world size
    (1 at the size it started on); a global batch this world cannot make up exactly is refused."""
    micro_batches, rest = divmod(global_batch, batch_per_rank * world)
    if rest or micro_batches < 1:
        raise CheckpointError(f"the run's global batch of {global_batch} samples cannot be made of whole micro-batches "
                              f"of {world} ranks x {batch_per_rank} samples: resume on a world size that divides "
                              f"{global_batch // batch_per_rank}")
    return micro_batches
