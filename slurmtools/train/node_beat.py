"""Heartbeats gathered per node, so that the shared control dir's load grows with nodes, not ranks.

With one heartbeat file per rank, 8,000 ranks put ~80,000 metadata operations a second on one
directory of the shared file system and the supervisor opens 8,000 files a pass (bench/scale.py).
Here every rank writes its heartbeat into a directory in its node's memory
(`$SLURMTOOLS_NODE_LOCAL_DIR`, default /dev/shm:
`slurmtools-<uid>/<attempt>-<control dir's digest>/<host>/`), and one
process of the node, its local rank 0 (which empties the directory when it starts: no record of an
earlier launch is ever gathered; and removes this user's launch directories nobody wrote for 10
minutes whose job Slurm no longer lists: ended jobs leave no litter, node_sweep), gathers them (with each of its own beats, at least every
heartbeat interval) into one file of the control dir, `heartbeat/node-<host>.json`: the per-rank
records as they are, so the laggard rank, its phase and its busy time stay visible. The same
process mirrors the control dir's request markers into the node directory, so the ranks poll
memory, not the shared file system. A rank's news reaches the supervisor within one interval or
one step of local rank 0, whichever is sooner: nothing the supervisor decides on is that fast.

Off (each rank writes its own file in the control dir, as before) when the launcher gives no
local rank (`LOCAL_RANK` from torchrun, `SLURM_LOCALID` from srun) or the node-local directory is
not one this user owns and only this user can write.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurmtools.common.control_dir import NODE_LOCAL_DIR_ENV as NODE_LOCAL_DIR_ENV
from slurmtools.common.fsutil import json_object, read_small_regular, write_json_atomic
from slurmtools.train import node_sweep

DEFAULT_NODE_LOCAL_DIR = "/dev/shm"
NODE_FILE_PREFIX = "node-"
MAX_RANK_RECORD_BYTES = 64 * 1024             # one rank's heartbeat record (watchdog reads it by this)
MAX_RANKS_PER_NODE = 256
# in a node directory: the ranks' reduced flight-recorder records (fr_dump.py), gathered like heartbeats
FLIGHT_RECORDS_SUBDIR = "flight-recorder"
# in a node directory: the ranks' step lines, taken by local rank 0 (node_steps.py)
STEPS_SUBDIR = "steps"
# a launch directory of this user untouched this long, whose job Slurm no longer lists, belongs to
# no running launch (its ranks rewrite their records every heartbeat interval): local rank 0
# removes it when it starts (node_sweep)
STALE_AFTER_S = 600.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def local_rank(environ: Mapping[str, str]) -> Optional[int]:
    """This process's rank on its node, as the launcher says (torchrun, then srun), or None."""
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        text = environ.get(name, "")
        if text.isascii() and text.isdigit():
            return int(text)
    return None


def node_file_name(host: str) -> str:
    return f"{NODE_FILE_PREFIX}{_UNSAFE.sub('_', host)[:200]}.json"


def own_private_dir(path: Path) -> bool:
    """Create path (0700) if missing; True only for a real directory of ours nobody else can write."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def memory_root(environ: Mapping[str, str]) -> Path:
    """The node's memory directory: $SLURMTOOLS_NODE_LOCAL_DIR, default /dev/shm."""
    return Path(environ.get(NODE_LOCAL_DIR_ENV) or DEFAULT_NODE_LOCAL_DIR)


def control_digest(control_dir: Path) -> str:
    """A short name for a control dir: two jobs (or runs) of one user never share node memory."""
    return hashlib.sha256(str(control_dir.absolute()).encode()).hexdigest()[:16]


def user_root(root: Path, uid: int) -> Path:
    """Where one user's node directories live in node memory."""
    return root / f"slurmtools-{uid}"


def node_dir(root: Path, control_dir: Path, attempt_id: str, host: str) -> Optional[Path]:
    """This node's directory for this attempt's heartbeats in node memory, made if need be; None
    where it cannot be ours alone (then heartbeats go to the control dir as per-rank files). Two
    jobs (or two local runs) of one user never share one: the control dir is part of the name."""
    base = user_root(root, os.geteuid())
    job = control_digest(control_dir)
    path = base / f"{_UNSAFE.sub('_', attempt_id)[:100]}-{job}" / _UNSAFE.sub("_", host)[:200]
    for part in (base, path.parent, path):
        if not own_private_dir(part):
            return None
    return path


def gather(directory: Path) -> List[Dict[str, Any]]:
    """The per-rank records in a node directory (malformed ones left out: the supervisor judges)."""
    records = []
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.name.endswith(".json"))
    except OSError:
        return []
    for name in names[:MAX_RANKS_PER_NODE]:
        raw = read_small_regular(directory / name, MAX_RANK_RECORD_BYTES)
        # bounded numbers only: a NaN another rank wrote would make the node's file unwritable
        # (allow_nan=False) and end local rank 0's keep-alive thread: the node would look silent
        record = json_object(raw.decode(errors="replace")) if raw is not None else None
        if record is not None:
            records.append(record)
    return records


def clear(directory: Path) -> None:
    """Records and markers of an earlier launch under the same name (a rerun in the same dir) go."""
    for folder in (directory / FLIGHT_RECORDS_SUBDIR, directory / STEPS_SUBDIR, directory):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)


def sweep_stale(directory: Path, now: float, stale_after_s: float = STALE_AFTER_S,
                live_jobs: Optional[node_sweep.LiveJobs] = None) -> List[str]:
    """Remove the other launch directories beside directory's (this user's, per attempt) that no
    rank wrote for stale_after_s and whose job Slurm no longer lists (node_sweep): ended jobs leave
    no litter in node memory, a live one (hung, requeued and waiting) keeps its own."""
    launch = directory.parent
    return node_sweep.sweep(launch.parent, node_sweep.ATTEMPT_DIR, launch.name, now, stale_after_s, live_jobs)


def mirror_markers(control_dir: Path, directory: Path, names: Sequence[str]) -> None:
    """Each marker present in the control dir is present in the node directory, and only those."""
    for name in names:
        local = directory / name
        try:
            if (control_dir / name).exists():
                if not local.exists():
                    local.touch()
            else:
                local.unlink(missing_ok=True)
        except OSError:
            pass          # the ranks see the marker one interval later, or the supervisor's timeout acts


class NodeBeats:
    """A rank's side: its heartbeat into node memory; on local rank 0, the node's file and markers."""

    def __init__(self, control_dir: Path, directory: Path, rank: int, host: str, gathers: bool,
                 markers: Sequence[str]) -> None:
        self.control_dir, self.directory, self.rank, self.host = control_dir, directory, rank, host
        self.gathers, self.markers = gathers, tuple(markers)
        self.recorder_dir: Optional[Path] = None     # where this node's flight records go, once asked
        self.flight_records_written = 0

    @classmethod
    def for_rank(cls, control_dir: Path, rank: int, host: str, attempt_id: str, environ: Mapping[str, str],
                 markers: Sequence[str]) -> Optional["NodeBeats"]:
        """None when gathering per node is off (no local rank, no private node-local directory)."""
        local = local_rank(environ)
        if local is None:
            return None
        root = memory_root(environ)
        directory = node_dir(root, control_dir, attempt_id, host)
        if directory is None:
            if local == 0:     # one line per node in the job's output: an admin's setting to mend
                print(f"slurmtools: {NODE_LOCAL_DIR_ENV} {root}: no directory of this user's own there (missing, "
                      f"or others can write it); each rank writes its heartbeat to the control dir",
                      file=sys.stderr, flush=True)
            return None
        if local == 0:
            clear(directory)
            sweep_stale(directory, time.time(), node_sweep.stale_after_s(environ, STALE_AFTER_S))
        return cls(control_dir, directory, rank, host, local == 0, markers)

    def write(self, record: Dict[str, Any], heartbeat_dir: Path, now: float) -> None:
        """This rank's record into node memory; local rank 0 then writes the node's file."""
        write_json_atomic(self.directory / f"{self.rank}.json", record, durable=False)
        if self.gathers:
            mirror_markers(self.control_dir, self.directory, self.markers)
            write_json_atomic(heartbeat_dir / node_file_name(self.host),
                              {"node": self.host, "time": now, "ranks": gather(self.directory)}, durable=False)
            self._gather_flight_records()

    def write_flight_record(self, record: Dict[str, Any], recorder_dir: Path) -> None:
        """This rank's reduced flight recorder into node memory; local rank 0's next beats gather
        the node's records into recorder_dir/node-<host>.json (until no more come)."""
        local = self.directory / FLIGHT_RECORDS_SUBDIR
        local.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(local / f"{self.rank}.json", record, durable=False)
        self.recorder_dir = recorder_dir

    def _gather_flight_records(self) -> None:
        if self.recorder_dir is None:
            return
        records = gather(self.directory / FLIGHT_RECORDS_SUBDIR)
        if len(records) != self.flight_records_written:
            write_json_atomic(self.recorder_dir / node_file_name(self.host), {"node": self.host, "ranks": records},
                              durable=False)
            self.flight_records_written = len(records)

    def marker_exists(self, name: str) -> bool:
        return (self.directory / name).exists()
