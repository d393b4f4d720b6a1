"""In-place recovery, the ranks' side (docs/recovery.md): a rank whose process group broke (a peer
lost with its node or its process) does not exit. It waits for the supervisor's word on the next
generation (the control dir's generation.json: its number, the world, the store to meet on), leaves
the broken group (aborted first where the backend can: an NCCL collective a lost peer never joins
blocks its destruction), joins the new group on a fresh prefix of that store, and the trainer starts
its loop again in the same process: no start-up, no import, the data set and the trainer's code
kept; its state comes back from node memory (snapshots: its own copy there, a lost rank's pulled
from the replica its peer keeps). A replacement rank is started straight into generation N.

Every survivor must leave the broken group, also one blocked in a collective whose peers live (only
the lost rank's direct peers get an error). Two ways, both on: a rank whose gloo group broke shuts
its group's connections down before it waits (train/group_sockets.py), so every peer blocked on it
gets its error in turn; and a watcher thread breaks the group as soon as the supervisor names the
next generation (NCCL: torch's _abort_process_group, with TORCH_NCCL_ASYNC_ERROR_HANDLING=0 as
that API asks, which the rendered job sets in this mode; gloo: its connections shut down), for a
node lost without a connection error (powered off: no reset ever comes).

Off unless SLURMTOOLS_INPLACE is set: a rank then exits on a broken group as before (the
relaunch path). When no generation comes within the wait, it exits too and the supervisor's
relaunch takes over.
"""
from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, FrozenSet, Iterable, Mapping, Optional, TypeVar

import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]  # documented, not re-exported

from slurmtools.common.control_dir import GENERATION_ENV, GENERATION_FILE, INPLACE_ENV
from slurmtools.common.generation import Generation, current, read, report_broken, report_formed, wait_for_next
from slurmtools.errors import UsageError, one_line
from slurmtools.train import group_sockets

T = TypeVar("T")

# how long a rank whose group broke waits for the next generation before it exits (the relaunch)
REFORM_WAIT_S = 60.0
STORE_PREFIX = "slurmtools/generation/"
# how often the watcher looks for the supervisor's next generation (a stat of one file per rank)
WATCH_EVERY_S = 0.5


class Group:
    """This process's group as in-place recovery sees it: its backend, the connections a gloo
    group opened, and whether the process is leaving or joining one itself (then the watcher
    keeps off). One per process (GROUP)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.backend = ""
        self.connections: FrozenSet[group_sockets.Connection] = frozenset()
        self.leaving = False
        self.broken_for = 0                  # the newest generation the group was broken for
        self.watcher: Optional[threading.Thread] = None

    def create(self, backend: str, init: Callable[[], None], store_ports: Iterable[int], track: bool = True) -> None:
        """init() forms the group; a gloo group's connections noted when in-place recovery may
        have to shut them down (track)."""
        self.backend = backend
        if backend == "gloo" and track:
            self.connections = group_sockets.opened_by(init, store_ports)
        else:
            init()
            self.connections = frozenset()

    def break_off(self) -> None:
        """Every collective of the group on this process returns with an error, now."""
        if self.backend == "gloo":
            group_sockets.shut(self.connections)
        elif dist.is_initialized():
            try:
                dist.distributed_c10d._abort_process_group()
            except (RuntimeError, ValueError):
                pass                         # gone already

    def check(self, control_dir: Path) -> bool:
        """Break the group off if the supervisor has named a newer generation than the one the
        process runs in, once per generation and never while it leaves or joins; whether it did."""
        named = read(control_dir)
        with self.lock:
            if named is None or self.leaving or named.number <= max(current(os.environ), self.broken_for):
                return False
            self.broken_for = named.number
            self.break_off()
            return True

    def watch(self, control_dir: Path, every_s: float = WATCH_EVERY_S) -> None:
        """The watcher thread, started once."""
        def loop() -> None:
            seen = 0
            while True:
                try:
                    changed = (control_dir / GENERATION_FILE).stat().st_mtime_ns
                except OSError:
                    changed = 0
                if changed != seen:
                    seen = changed
                    self.check(control_dir)
                time.sleep(every_s)
        if self.watcher is None:
            self.watcher = threading.Thread(target=loop, daemon=True, name="slurmtools-generation-watch")
            self.watcher.start()

    def set_leaving(self, leaving: bool) -> None:
        with self.lock:
            self.leaving = leaving


GROUP = Group()


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

    def init() -> None:
        store = TCPStore(generation.store_host, generation.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=PrefixStore(f"{STORE_PREFIX}{generation.number}", store),
                                rank=rank, world_size=generation.world, timeout=timeout)
    GROUP.create(backend, init, [generation.store_port])
    os.environ[GENERATION_ENV] = str(generation.number)


def start(backend: str, timeout_s: float, control_dir: Optional[Path], environ: Mapping[str, str] = os.environ
          ) -> None:
    """This process's first group: torchrun's (env://) in generation 0; a replacement started into
    generation N joins that generation's group. With in-place recovery on, the watcher starts."""
    number = current(environ)
    if number == 0:
        timeout = datetime.timedelta(seconds=timeout_s)
        master_port = environ.get("MASTER_PORT", "")
        GROUP.create(backend, lambda: dist.init_process_group(backend, timeout=timeout),
                     [int(master_port)] if master_port.isdigit() else [], track=enabled(environ))
    else:
        generation = read(control_dir) if control_dir is not None else None
        if generation is None or generation.number != number:
            raise UsageError(f"started into generation {number}, but the control dir's {GENERATION_FILE} names "
                             f"{'none' if generation is None else generation.number}")
        rank = int(environ.get("RANK", "0"))
        join(generation, rank, backend, timeout_s)
        if rank == 0 and control_dir is not None:      # rank 0 restarted in place: every rank joined
            report_formed(control_dir, number)
    if control_dir is not None and enabled(environ):
        GROUP.watch(control_dir)


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
    on, break it off for every peer, leave it, wait for the next generation, join it and train
    again; any other error, or no generation in time, is raised as before."""
    while True:
        broke = ""
        try:
            return train_once()
        except RuntimeError as exc:
            if control_dir is None or not enabled(environ) or not group_broke(exc):
                raise
            broke = one_line(str(exc))
        GROUP.set_leaving(True)
        after = current(os.environ)
        if os.environ.get("LOCAL_RANK", "0") == "0":        # one word per node
            report_broken(control_dir, after, socket.gethostname(), broke)
        GROUP.break_off()                                   # the peers still blocked on this rank
        leave_group()
        print(f"slurmtools: rank {rank}: the process group of generation {after} broke ({broke[:200]}); "
              f"waiting up to {wait_s:g} s for the next generation", file=sys.stderr, flush=True)
        generation = wait_for_next(control_dir, after, wait_s)
        if generation is None:
            raise RuntimeError(f"{broke} (no next generation within {wait_s:g} s)")
        print(f"slurmtools: rank {rank}: joining generation {generation.number} in place", file=sys.stderr,
              flush=True)
        join(generation, rank, backend, timeout_s)
        GROUP.set_leaving(False)
        if rank == 0:                       # every rank joined: init returned
            report_formed(control_dir, generation.number)
