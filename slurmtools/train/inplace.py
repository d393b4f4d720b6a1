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
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar

import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]  # documented, not re-exported

from slurmtools.common.control_dir import GENERATION_ENV, GENERATION_FILE, INPLACE_ENV
from slurmtools.common.fsutil import read_small_regular, write_json_atomic
from slurmtools.errors import UsageError, one_line

T = TypeVar("T")

# how long a rank whose group broke waits for the next generation before it exits (the relaunch)
REFORM_WAIT_S = 60.0
STORE_PREFIX = "slurmtools/generation/"


@dataclass(frozen=True)
class Generation:
    """A process group the ranks form in place: its number (1, 2, ... within an attempt), its
    world size, and the store every rank meets on (one that outlives the lost node)."""
    number: int
    world: int
    store_host: str
    store_port: int

    @classmethod
    def parse(cls, text: str) -> "Generation":
        """From generation.json; ValueError naming what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"number", "world", "store_host", "store_port"}:
            raise ValueError("expected number, world, store_host and store_port")
        number, world, host, port = data["number"], data["world"], data["store_host"], data["store_port"]
        if not (isinstance(number, int) and number > 0 and isinstance(world, int) and world > 0
                and isinstance(host, str) and host and isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"out of range: {data}")
        return cls(number, world, host, port)


def write(control_dir: Path, generation: Generation) -> None:
    """The supervisor's word: written whole (renamed into place), read by every rank."""
    write_json_atomic(control_dir / GENERATION_FILE, asdict(generation), durable=False)


def read(control_dir: Path) -> Optional[Generation]:
    """The newest generation written, or None (none yet, or a file that is not one: said)."""
    raw = read_small_regular(control_dir / GENERATION_FILE, 4096)
    if raw is None:
        return None
    try:
        return Generation.parse(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"slurmtools: {control_dir / GENERATION_FILE} is no generation: {one_line(str(exc))}", file=sys.stderr,
              flush=True)
        return None


def current(environ: Mapping[str, str] = os.environ) -> int:
    """The generation this process runs in (0: its first group)."""
    text = environ.get(GENERATION_ENV, "0") or "0"
    if not text.isdigit():
        raise UsageError(f"{GENERATION_ENV} must be a generation number, got {text!r}")
    return int(text)


def wait_for_next(control_dir: Path, after: int, wait_s: float, poll_s: float = 0.1) -> Optional[Generation]:
    """The first generation newer than `after` written within wait_s, or None."""
    deadline = time.monotonic() + wait_s
    while True:
        generation = read(control_dir)
        if generation is not None and generation.number > after:
            return generation
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


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
            generation = wait_for_next(control_dir, after, wait_s)
            if generation is None:
                raise
            print(f"slurmtools: rank {rank}: the process group of generation {after} broke "
                  f"({one_line(str(exc))[:200]}); joining generation {generation.number} in place",
                  file=sys.stderr, flush=True)
            leave_group()
            join(generation, rank, backend, timeout_s)
