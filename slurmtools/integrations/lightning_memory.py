"""A Lightning fit's state kept in its own process's memory, for a recovery in place
(slurmtools/integrations/lightning_inplace.py; docs/recovery.md, "In place").

Under DDP every rank holds the whole state, the same on each (its model, its optimizers, its loops:
what Lightning's checkpoint of rank 0 holds, which every rank loads on a resume). So a survivor's
own copy of its newest step is also the lost rank's: no replica on another node is needed, and one
copy a node will do (keeps_copy). At the job's snapshot cadence (the spec's
distributed.snapshot_every_steps, spaced out to keep its stall within snapshot_max_overhead_pct,
skipped past snapshot_memory_gb) each node's first rank keeps the checkpoint dict Lightning would
write, serialized, in its memory. When it fits again in place, the ranks agree
(one all-gather) on the newest step any of them holds; if that is newer than every rank's newest
sealed checkpoint, its holder broadcasts it and every rank resumes from it (a private file in the
node's memory dir, as Lightning's `ckpt_path` takes a path), instead of training again the steps since
the checkpoint. Other strategies (FSDP, DeepSpeed: state sharded over the ranks) keep the sealed
checkpoint's path.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from slurmtools.common.control_dir import SNAPSHOT_EVERY_ENV, SNAPSHOT_MAX_OVERHEAD_ENV, SNAPSHOT_MEMORY_GB_ENV
from slurmtools.snapshot.rules import interval_for, settings_from_env
from slurmtools.train.node_beat import memory_root

NONE_HELD = -1        # a rank's word for "no step": a replacement, or a copy never kept
PEAK_COPIES = 2       # a copy's peak in memory: the serialized buffer and the bytes kept


def replicated(trainer: pl.Trainer) -> bool:
    """Whether every rank holds the whole state: Lightning's plain DDP (not a subclass that shards)."""
    return type(trainer.strategy) is DDPStrategy


def keeps_copy(local_rank: int, node_count: int) -> bool:
    """Whether this rank keeps a copy: the first rank of each node, so any one failure (a node, a
    rank) leaves a copy on another node, at a node's memory and time for one copy rather than one a
    rank (8 a node on an 8-GPU node); a job of one node keeps two (its first two ranks), so a rank
    that crashes there leaves one."""
    return local_rank < (1 if node_count > 1 else 2)


def resume_choice(held: Sequence[int], sealed: Sequence[int]) -> Optional[Tuple[int, int]]:
    """(step, the lowest rank holding it) of the newest step a rank holds in memory, when it is newer
    than the newest sealed checkpoint any rank sees; None: resume from the checkpoint. held and
    sealed: one per rank, NONE_HELD for none. Every rank decides the same from the same lists."""
    newest = max(held, default=NONE_HELD)
    if newest == NONE_HELD or newest <= max(sealed, default=NONE_HELD):
        return None
    return newest, list(held).index(newest)


class MemoryCopy:
    """This process's newest copy of its fit's state (step, the serialized checkpoint dict), kept
    across fits in place: made once per process, beside the one SlurmtoolsCallback."""

    def __init__(self, every_steps: int, memory_gb: float, max_overhead_pct: float) -> None:
        self.every_steps = every_steps
        self.interval_steps = every_steps
        self.limit_bytes = int(memory_gb * 1e9)
        self.max_overhead_pct = max_overhead_pct
        self.step = NONE_HELD
        self.blob = b""
        self.said_too_large = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["MemoryCopy"]:
        """The spec's snapshot settings as the job's script exported them; None when they are off."""
        every, memory_gb, overhead_pct = settings_from_env(environ, SNAPSHOT_EVERY_ENV, SNAPSHOT_MEMORY_GB_ENV,
                                                           SNAPSHOT_MAX_OVERHEAD_ENV)
        return cls(every, memory_gb, overhead_pct) if every > 0 else None

    def due(self, step: int) -> bool:
        return step > self.step and step % self.interval_steps == 0

    def keep(self, step: int, checkpoint: Dict[str, Any], step_s: float) -> None:
        """Serialize checkpoint (Lightning's dict of this step) as this process's copy. Its peak is
        two copies (the older one, or the buffer, beside the new one): one whose peak is over the
        memory share is not kept (said once), the older copy stays."""
        started = time.monotonic()
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        size_bytes = buffer.getbuffer().nbytes
        if PEAK_COPIES * size_bytes > self.limit_bytes:
            if not self.said_too_large:
                print(f"slurmtools: the Lightning state ({size_bytes / 1e9:.3g} GB, {PEAK_COPIES}x at a copy's "
                      f"peak) is over snapshot_memory_gb ({self.limit_bytes / 1e9:g} GB): not kept in memory; a "
                      f"recovery in place resumes from the sealed checkpoint", file=sys.stderr, flush=True)
                self.said_too_large = True
            return
        self.blob = b""                         # the older copy freed before the new one is made
        self.step, self.blob = step, buffer.getvalue()
        self.interval_steps = interval_for(time.monotonic() - started, step_s, self.every_steps,
                                           self.max_overhead_pct)


def write_scratch(environ: Mapping[str, str], rank: int, step: int, blob: bytes) -> Path:
    """The agreed copy as a file for Lightning to load, in the node's memory dir (shared by every
    user of the node, /dev/shm by default): made new and private (O_EXCL, 0600, a name of its own),
    so a name planted there by another user is never followed or overwritten."""
    handle, name = tempfile.mkstemp(prefix=f"slurmtools-lightning-rank{rank}-step{step}-", suffix=".ckpt",
                                    dir=memory_root(environ))
    with os.fdopen(handle, "wb") as out:
        out.write(blob)
    return Path(name)


def agreed_copy(memory: MemoryCopy, sealed_step: int, environ: Mapping[str, str]) -> Optional[Path]:
    """Collective over the current group: the agreed in-memory copy written where Lightning can load
    it (the caller removes it after the fit), or None when the sealed checkpoint is as new."""
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (memory.step, sealed_step))
    choice = resume_choice([held for held, _ in gathered], [sealed for _, sealed in gathered])
    if choice is None:
        return None
    step, holder = choice
    payload: List[Any] = [memory.blob if dist.get_rank() == holder else None]
    dist.broadcast_object_list(payload, src=holder)
    path = write_scratch(environ, dist.get_rank(), step, payload[0])
    if dist.get_rank() == 0:
        newest_sealed = max(sealed for _, sealed in gathered)
        print(f"slurmtools: resuming from step {step}, held in memory by rank {holder} (the newest sealed "
              f"checkpoint: {newest_sealed if newest_sealed != NONE_HELD else 'none'})", file=sys.stderr, flush=True)
    return path


def remove(path: Optional[Path]) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
