"""Flight-recorder dumps: which rank never entered the collective the others wait in.

torch records every collective of a process group in a ring buffer (slurmtools/train/fr_dump.py). NCCL
dumps it on a collective timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) to `<prefix><rank>`; on any
backend a rank's keep-alive thread reduces its own dump when the supervisor asks (runtime.py),
also while the rank's main thread waits in a collective, and writes `<prefix><rank>.json`, or,
gathered per node, `node-<host>.json` (node_beat.py). In a hang, the ranks that wait have each
entered collective #S of a group; a rank whose newest entry of that group is below S never
entered it: that rank, and its node, is the one to blame.

Reading is `read_reduced` (reduced records first; a full dump only for a rank without one, read
and reduced one at a time, so the supervisor holds one dump at most, and within a time budget:
judging on the ranks read so far is sound, a rank behind among them is behind); deciding is the
pure `laggard`.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from slurmtools.common.control_dir import FLIGHT_RECORDER_REQUEST_FILE
from slurmtools.common.fsutil import read_small_regular, write_json_atomic
from slurmtools.train.fr_dump import MAX_DUMP_BYTES, MAX_SUMMARY_BYTES, Reduced, parse_dump, parse_summary, reduce
from slurmtools.train.node_beat import MAX_RANKS_PER_NODE, NODE_FILE_PREFIX

_RANK_FILE = re.compile(r"^rank_(\d{1,7})$")
_SUMMARY_FILE = re.compile(r"^rank_(\d{1,7})\.json$")
# the supervisor's time for reading full dumps (torch's own, 0.2-0.6 MB each) before it judges on
# those read: reduced records take ~2 ms per node at 8,000 ranks (bench/scale.py)
READ_BUDGET_S = 30.0


def _records(raw: Optional[bytes]) -> List[Tuple[int, Reduced]]:
    """The reduced records in one file's bytes: one rank's record, or a node's {"ranks": [...]}."""
    try:
        data = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        return []
    many = data.get("ranks") if isinstance(data, dict) and "ranks" in data else [data]
    parsed = [parse_summary(record) for record in (many if isinstance(many, list) else [])]
    return [one for one in parsed if one is not None]


def _names(directory: Path) -> List[str]:
    try:
        return sorted(entry.name for entry in os.scandir(directory))
    except OSError:
        return []


def read_summaries(directory: Path) -> Dict[int, Reduced]:
    """rank -> reduced record, from every well-formed `rank_<N>.json` and `node-<host>.json`."""
    reduced: Dict[int, Reduced] = {}
    for name in _names(directory):
        if name.startswith(NODE_FILE_PREFIX) and name.endswith(".json"):
            limit = MAX_SUMMARY_BYTES * MAX_RANKS_PER_NODE
        elif _SUMMARY_FILE.match(name):
            limit = MAX_SUMMARY_BYTES
        else:
            continue
        for rank, groups in _records(read_small_regular(directory / name, limit)):
            reduced[rank] = groups
    return reduced


def read_reduced(directory: Path, budget_s: float = READ_BUDGET_S,
                 summaries: Optional[Dict[int, Reduced]] = None) -> Dict[int, Reduced]:
    """rank -> reduced record for every rank with a record or a well-formed full dump `rank_<N>`
    in directory (others skipped); full dumps only until budget_s has passed. summaries: the
    records already read (records_there), so a waiting supervisor reads the node files once."""
    reduced = dict(summaries) if summaries is not None else read_summaries(directory)
    deadline = time.monotonic() + budget_s
    for name in _names(directory):
        match = _RANK_FILE.match(name)
        if not match or int(match.group(1)) in reduced:
            continue
        if time.monotonic() > deadline:
            break
        raw = read_small_regular(directory / name, MAX_DUMP_BYTES)   # no link, FIFO or huge file
        dump = parse_dump(raw) if raw is not None else None
        del raw
        if dump is not None:
            reduced[int(match.group(1))] = reduce(dump)
    return reduced


def records_there(directory: Path) -> Tuple[Dict[int, Reduced], Set[int]]:
    """The reduced records there, and every rank with a record or a full dump (full dumps by
    name: they are read once, when all are there or the wait is over)."""
    summaries = read_summaries(directory)
    dumped = {int(match.group(1)) for match in map(_RANK_FILE.match, _names(directory)) if match}
    return summaries, dumped | set(summaries)


def ranks_there(directory: Path) -> Set[int]:
    """The ranks with a record or a full dump."""
    return records_there(directory)[1]


@dataclass(frozen=True)
class Laggard:
    rank: int
    host: Optional[str]
    collective: str           # what the others wait in, e.g. "gloo:all_reduce"
    seq: int                  # its collective_seq_id in the group
    group: str
    waiting: Tuple[int, ...]  # the ranks that entered it (or, never_started: that started it)
    ranks: Tuple[int, ...] = ()   # every rank to blame, all on host (default: rank alone)
    never_started: bool = False   # every rank entered it, but these ranks' entries never started

    @property
    def detail(self) -> str:
        where = f" on {self.host}" if self.host else ""
        blamed = self.ranks or (self.rank,)
        who = (f"rank {blamed[0]}" if len(blamed) == 1 else "ranks " + ",".join(str(rank) for rank in blamed)) + where
        waiting = ",".join(str(rank) for rank in self.waiting)
        if self.never_started:
            return (f"{who} never started {self.collective} #{self.seq} of process group {self.group} that ranks "
                    f"{waiting} started (flight recorder entry states)")
        return (f"{who} never entered {self.collective} #{self.seq} of process group "
                f"{self.group} that ranks {waiting} wait in (flight recorder)")


# an entry's state in the recorder's order; a rank whose entry of the collective all ranks entered
# is still "scheduled" while others' "started" never launched it (a GPU-side hang)
ENTRY_STATES = ("scheduled", "started", "completed")


def one_node(ranks: Sequence[int], hosts: Mapping[int, str]) -> Optional[str]:
    """The node every one of ranks sits on ("" for one rank of unknown host), else None."""
    if len(ranks) == 1:
        return hosts.get(ranks[0], "")
    named = {hosts.get(rank) for rank in ranks}
    return named.pop() if len(named) == 1 and None not in named else None


def laggard(reduced: Mapping[int, Reduced], hosts: Mapping[int, str]) -> Optional[Laggard]:
    """The rank (or the ranks of one node) that never entered a collective its group's other ranks
    entered; or, all having entered it, whose entry never started while the others' did. None when
    the dumps name no single node (all equal, several nodes behind, fewer than two dumps). A rank
    of the job without a dump is not blamed here: its silence is the node watch's evidence."""
    if len(reduced) < 2:
        return None
    newest = reduced
    for group in sorted({group for per_rank in newest.values() for group in per_rank}):
        # a rank without entries of the group may not be in it (a sub-group): only members compare
        seqs = {rank: per_rank[group][0] for rank, per_rank in newest.items() if group in per_rank}
        top = max(seqs.values())
        behind = sorted(rank for rank, seq in seqs.items() if seq < top)
        waiting = tuple(sorted(rank for rank, seq in seqs.items() if seq == top))
        name = newest[waiting[0]][group][1] or "a collective"
        host = one_node(behind, hosts) if behind else None
        if behind and host is not None:
            return Laggard(behind[0], host or None, name, top, group, waiting, tuple(behind))
        if behind:
            continue
        states = {rank: newest[rank][group][2] for rank in seqs}
        if not all(state in ENTRY_STATES for state in states.values()) or len(set(states.values())) < 2:
            continue
        low = min(states.values(), key=ENTRY_STATES.index)
        stuck = sorted(rank for rank, state in states.items() if state == low)
        host = one_node(stuck, hosts)
        if low != "completed" and host is not None:
            started = tuple(sorted(rank for rank in seqs if rank not in stuck))
            return Laggard(stuck[0], host or None, name, top, group, started, tuple(stuck), never_started=True)
    return None


# How long the supervisor waits for the records it asked for: until none has come for DUMP_WAIT_S
# (at 64,000 ranks they come over several of its passes, a pass and its sleep ~8 s: bench/scale.py),
# and DUMP_WAIT_MAX_S at most; then it judges on those there (a rank missing is not named by them).
DUMP_WAIT_S = 5.0
DUMP_WAIT_MAX_S = 60.0


def dump_wait_over(asked_s: float, last_arrival_s: Optional[float], now_s: float) -> bool:
    """Whether the wait for asked records is over: quiet for DUMP_WAIT_S since the request or the
    newest arrival, or DUMP_WAIT_MAX_S since the request."""
    if now_s - asked_s >= DUMP_WAIT_MAX_S:
        return True
    return now_s - max(asked_s, last_arrival_s if last_arrival_s is not None else asked_s) >= DUMP_WAIT_S


def request_dumps(control_dir: Path) -> bool:
    """Ask every rank of the step for its dump (their keep-alive threads look once a second)."""
    try:
        write_json_atomic(control_dir / FLIGHT_RECORDER_REQUEST_FILE, {"t": time.time()}, durable=False)
    except OSError:
        return False
    return True


def dumps_ready(recorder_dir: Path, ranks: int) -> bool:
    """`ranks` ranks have written their record or dump."""
    return len(ranks_there(recorder_dir)) >= ranks


def collect(control_dir: Path, recorder_dir: Path, ranks: int, wait_s: float = DUMP_WAIT_S
            ) -> Dict[int, Reduced]:
    """Ask for the dumps and wait up to wait_s until `ranks` are there; what is there then. (The
    supervisor does not wait here: observe.DumpRequest asks and looks again on its next passes.)"""
    if not request_dumps(control_dir):
        return read_reduced(recorder_dir)
    deadline = time.monotonic() + wait_s
    while not dumps_ready(recorder_dir, ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    return read_reduced(recorder_dir)
