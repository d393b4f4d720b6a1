"""In-place recovery, the ranks' side (docs/recovery.md): a rank whose process group broke (a peer
lost with its node or its process) does not exit. It waits for the supervisor's word on the next
generation (the control dir's generation.json: its number, the world, the store to meet on), leaves
the broken group (aborted first where the backend can: an NCCL collective a lost peer never joins
blocks its destruction), joins the new group on a fresh prefix of that store, and the trainer starts
its loop again in the same process: no start-up, no import, the data set and the trainer's code
kept; its state comes back from node memory (snapshots: its own copy there, a lost rank's pulled
from the replica its peer keeps). A replacement rank is started straight into generation N.

Off unless SLURMTOOLS_INPLACE is set: a rank then exits on a broken group as before (the
relaunch path). When no generation comes within the wait, it exits too and the supervisor's
relaunch takes over.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar

import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]  # documented, not re-exported

from slurmtools.common.control_dir import GENERATION_ENV, GENERATION_FILE, INPLACE_ENV
from slurmtools.common.generation import Generation, current, read, report_broken, wait_for_next
from slurmtools.errors import UsageError, one_line

T = TypeVar("T")

# how long a rank whose group broke waits for the next generation before it exits (the relaunch)
REFORM_WAIT_S = 60.0
STORE_PREFIX = "slurmtools/generation/"


def leave_group() -> None:
    """Out of the broken group and every group made from it: aborted where the backend can, then
    destroyed; what fails on the way is what was broken already."""
    if not dist.is_initialized():
        return
    abort: Optional[Callable[[], Any]] = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None and dist.get_backend() == "nccl":
        try:
            abort()
        except (RuntimeError, ValueError):
            pass
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):
            pass


def join(generation: Generation, rank: int, backend: str, timeout_s: float) -> None:
    """Join generation's group as rank, on the store's prefix of that generation only (what an
    earlier generation left in the store is never read)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = TCPStore(generation.store_host, generation.store_port, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=PrefixStore(f"{STORE_PREFIX}{generation.number}", store), rank=rank,
                            world_size=generation.world, timeout=timeout)
    os.environ[GENERATION_ENV] = str(generation.number)


def start(backend: str, timeout_s: float, control_dir: Optional[Path], environ: Mapping[str, str] = os.environ
          ) -> None:
    """This process's first group: torchrun's (env://) in generation 0; a replacement started into
    generation N joins that generation's group."""
    number = current(environ)
    if number == 0:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        return
    generation = read(control_dir) if control_dir is not None else None
    if generation is None or generation.number != number:
        raise UsageError(f"started into generation {number}, but the control dir's {GENERATION_FILE} names "
                         f"{'none' if generation is None else generation.number}")
    join(generation, int(environ.get("RANK", "0")), backend, timeout_s)


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(INPLACE_ENV, "") not in ("", "0")


def group_broke(exc: BaseException) -> bool:
    """What a process group raises when a peer is lost: torch's DistError (NCCL's backend error, the
    store's), or gloo's transport error, a plain RuntimeError that names gloo's source file. A
    trainer's own RuntimeError (a shape mismatch, say) is none of these: it fails at once."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo" in str(exc))


def run(train_once: Callable[[], T], control_dir: Optional[Path], rank: int, backend: str, timeout_s: float,
        wait_s: float = REFORM_WAIT_S, environ: Mapping[str, str] = os.environ) -> T:
    """train_once() until it returns. When its group broke (group_broke) and in-place recovery is
    on, wait for the next generation, join it and train again; any other error, or no generation
    in time, is raised as before."""
    while True:
        try:
            return train_once()
        except RuntimeError as exc:
            if control_dir is None or not enabled(environ) or not group_broke(exc):
                raise
            after = current(os.environ)
            if os.environ.get("LOCAL_RANK", "0") == "0":        # one word per node
                report_broken(control_dir, after, socket.gethostname(), one_line(str(exc)))
            generation = wait_for_next(control_dir, after, wait_s)
            if generation is None:
                raise
            print(f"slurmtools: rank {rank}: the process group of generation {after} broke "
                  f"({one_line(str(exc))[:200]}); joining generation {generation.number} in place",
                  file=sys.stderr, flush=True)
            leave_group()
            join(generation, rank, backend, timeout_s)
