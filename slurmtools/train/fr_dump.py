"""A flight-recorder dump, reduced to what attribution reads, where it is made.

torch records every collective of a process group in a ring buffer (TORCH_FR_BUFFER_SIZE, 2,000
entries by default): per entry its process group (`pg_id`), `collective_seq_id` (the n-th
collective of that group), `profiling_name` ("nccl:all_reduce", "gloo:all_reduce") and state. A
dump is 0.2-0.6 MB; at 8,000 ranks the whole set is gigabytes of pickles and ~20 GB of Python
objects, and the attribution (flightrec.laggard) reads only each group's newest collective.

So a rank asked for its dump (runtime.TrainingControl's keep-alive thread) reduces its own dump
here and writes one small record, `{"rank": N, "groups": {"<pg>": [seq, "name", "state"]}}`
(a few hundred bytes), which its node's local rank 0 gathers into one file per node
(node_beat.NodeBeats). Dumps torch writes itself (TORCH_NCCL_DUMP_ON_TIMEOUT) are reduced by the
supervisor as it reads them, one at a time. A dump is read with a restricted unpickler: only plain
containers, strings and numbers, never code.
"""
from __future__ import annotations

import io
import pickle
import pickletools
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

MAX_DUMP_BYTES = 64 * 1024 * 1024
MAX_GROUPS = 256                   # process groups kept in a reduced record (FSDP/HSDP use a handful)
MAX_NAME_CHARS = 200
MAX_SUMMARY_BYTES = 64 * 1024      # one reduced record
# a process group's newest collective in one rank's dump: (collective_seq_id, profiling name, state)
Newest = Tuple[int, str, str]
Reduced = Dict[str, Newest]


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


def reduce(dump: Mapping[str, Any]) -> Reduced:
    """group -> (highest collective_seq_id, its profiling name, its state) among a dump's
    collective entries (point-to-point ones left out)."""
    out: Reduced = {}
    entries = dump.get("entries")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        seq, group, name = entry.get("collective_seq_id"), entry.get("pg_id"), entry.get("profiling_name", "")
        state = entry.get("state", "")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(group, (int, str)):
            continue
        key = str(group)[:MAX_NAME_CHARS]
        if key not in out and len(out) >= MAX_GROUPS:
            continue
        if key not in out or seq > out[key][0]:
            out[key] = (seq, name[:MAX_NAME_CHARS] if isinstance(name, str) else "",
                        state[:MAX_NAME_CHARS] if isinstance(state, str) else "")
    return out


def summary_record(rank: int, reduced: Reduced) -> Dict[str, Any]:
    """The record a rank writes instead of its dump."""
    return {"rank": rank, "groups": {group: list(newest) for group, newest in reduced.items()}}


def _plain_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63


def parse_summary(record: Any) -> Optional[Tuple[int, Reduced]]:
    """(rank, reduced) from a record summary_record wrote; None for anything else (evidence or nothing)."""
    if not isinstance(record, dict) or not _plain_int(record.get("rank")):
        return None
    groups = record.get("groups")
    if not isinstance(groups, dict) or len(groups) > MAX_GROUPS:
        return None
    reduced: Reduced = {}
    for group, newest in groups.items():
        if not (isinstance(newest, list) and len(newest) == 3 and _plain_int(newest[0])
                and all(isinstance(text, str) and len(text) <= MAX_NAME_CHARS for text in newest[1:])):
            return None
        reduced[str(group)] = (newest[0], newest[1], newest[2])
    return record["rank"], reduced


def this_process_dump() -> Optional[bytes]:
    """This process's flight recorder (torch's pickle, without stack traces), or None when
    torch.distributed is not in use here."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch._C import _distributed_c10d as c10d
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    raw: bytes = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    return raw


def this_process_summary(rank: int) -> Optional[Dict[str, Any]]:
    """This rank's reduced record, or None (no torch.distributed here, or a dump we cannot read)."""
    raw = this_process_dump()
    dump = parse_dump(raw) if raw is not None else None
    return summary_record(rank, reduce(dump)) if dump is not None else None
