"""Flight-recorder dumps: which rank never entered the collective the others wait in.

torch records every collective of a process group in a ring buffer (TORCH_FR_BUFFER_SIZE;
NCCL and gloo alike): per entry its process group, `collective_seq_id` (the n-th collective
of that group), `profiling_name` ("nccl:all_reduce", "gloo:all_reduce") and state. NCCL dumps
it on a collective timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) to `<prefix><rank>`; on any backend a
rank's keep-alive thread dumps it to the same place when the supervisor asks (runtime.py), also
while the rank's main thread waits in a collective. In a hang, the ranks that wait have each
entered collective #S of a group; a rank whose newest entry of that group is below S never
entered it: that rank, and its node, is the one to blame.

Reading is `read_dumps` (a restricted unpickler: only plain containers, strings and numbers,
never code); deciding is the pure `laggard`.
"""
from __future__ import annotations

import io
import pickle
import pickletools
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.fsutil import read_small_regular, write_json_atomic
from slurmtools.runtime import FLIGHT_RECORDER_REQUEST_FILE

MAX_DUMP_BYTES = 64 * 1024 * 1024
_RANK_FILE = re.compile(r"^rank_(\d{1,7})$")


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers, bools and None; refuses every class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"flight-recorder dump refers to {module}.{name}")


# Opcodes that build objects by calling code, or name outside objects: a plain dump has none.
_CODE_OPCODES = frozenset({"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
                           "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"})


def _plain_and_bounded(raw: bytes) -> bool:
    """Whether raw is a pickle of plain values whose memo indices count up as a pickler writes them.

    Walked opcode by opcode (pickletools.genops reads every argument before anything is built)
    before the C unpickler sees it: that unpickler sizes its memo from the largest index and its
    bytes from the stated length, so 9 hostile bytes (a memo index of 2**26) made it allocate about
    1 GB, next to training, before it refused the dump."""
    memo_size = 0
    try:
        for opcode, arg, _ in pickletools.genops(raw):
            name = opcode.name
            if name in _CODE_OPCODES:
                return False
            if name == "MEMOIZE":
                memo_size += 1
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not isinstance(arg, int) or not 0 <= arg <= memo_size:
                    return False
                memo_size = max(memo_size, arg + 1)
            elif name in ("GET", "BINGET", "LONG_BINGET") and not (isinstance(arg, int) and 0 <= arg < memo_size):
                return False
    except Exception:       # torn or not a pickle: genops says so with several exception types
        return False
    return True


def parse_dump(raw: bytes) -> Optional[Dict[str, Any]]:
    """One dump's dict, or None when it is not a plain pickle of a dict with a list of entries."""
    if not _plain_and_bounded(raw):
        return None
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    except Exception:       # any malformed pickle (torn, foreign, hostile) is no evidence
        return None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return None
    return data


def read_dumps(directory: Path) -> Dict[int, Dict[str, Any]]:
    """rank -> dump for every well-formed `rank_<N>` file in directory (others are skipped)."""
    dumps: Dict[int, Dict[str, Any]] = {}
    try:
        paths = sorted(directory.iterdir()) if directory.is_dir() else []
    except OSError:
        return dumps
    for path in paths:
        match = _RANK_FILE.match(path.name)
        raw = read_small_regular(path, MAX_DUMP_BYTES) if match else None   # no link, FIFO or huge file
        dump = parse_dump(raw) if raw is not None else None
        if match and dump is not None:
            dumps[int(match.group(1))] = dump
    return dumps


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


def _newest(entries: List[Any]) -> Dict[str, Tuple[int, str, str]]:
    """group -> (highest collective_seq_id, its profiling name, its state) among a rank's collective entries."""
    out: Dict[str, Tuple[int, str, str]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        seq, group, name = entry.get("collective_seq_id"), entry.get("pg_id"), entry.get("profiling_name", "")
        state = entry.get("state", "")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(group, (int, str)):
            continue
        key = str(group)
        if key not in out or seq > out[key][0]:
            out[key] = (seq, name if isinstance(name, str) else "", state if isinstance(state, str) else "")
    return out


def one_node(ranks: Sequence[int], hosts: Mapping[int, str]) -> Optional[str]:
    """The node every one of ranks sits on ("" for one rank of unknown host), else None."""
    if len(ranks) == 1:
        return hosts.get(ranks[0], "")
    named = {hosts.get(rank) for rank in ranks}
    return named.pop() if len(named) == 1 and None not in named else None


def laggard(dumps: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str]) -> Optional[Laggard]:
    """The rank (or the ranks of one node) that never entered a collective its group's other ranks
    entered; or, all having entered it, whose entry never started while the others' did. None when
    the dumps name no single node (all equal, several nodes behind, fewer than two dumps). A rank
    of the job without a dump is not blamed here: its silence is the node watch's evidence."""
    if len(dumps) < 2:
        return None
    newest = {rank: _newest(list(dump.get("entries") or [])) for rank, dump in dumps.items()}
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


DUMP_WAIT_S = 5.0


def request_dumps(control_dir: Path) -> bool:
    """Ask every rank of the step for its dump (their keep-alive threads look once a second)."""
    try:
        write_json_atomic(control_dir / FLIGHT_RECORDER_REQUEST_FILE, {"t": time.time()}, durable=False)
    except OSError:
        return False
    return True


def dumps_ready(recorder_dir: Path, ranks: int) -> bool:
    """`ranks` dumps are there (names counted; the large dumps are read once, when all are)."""
    return _dump_files(recorder_dir) >= ranks


def collect(control_dir: Path, recorder_dir: Path, ranks: int, wait_s: float = DUMP_WAIT_S
            ) -> Dict[int, Dict[str, Any]]:
    """Ask for the dumps and wait up to wait_s until `ranks` are there; what is there then. (The
    supervisor does not wait here: observe.DumpRequest asks and looks again on its next passes.)"""
    if not request_dumps(control_dir):
        return read_dumps(recorder_dir)
    deadline = time.monotonic() + wait_s
    while not dumps_ready(recorder_dir, ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    return read_dumps(recorder_dir)


def _dump_files(directory: Path) -> int:
    try:
        return sum(1 for path in directory.iterdir() if _RANK_FILE.match(path.name))
    except OSError:
        return 0
