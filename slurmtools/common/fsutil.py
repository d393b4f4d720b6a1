"""Small file helpers shared by checkpoints, health state, control files and ledgers: one
atomic JSON writer, one exclusive temp-file opener, and one bounded JSON-lines reader."""
from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, *, durable: bool = True, mode: int = 0o644) -> None:
    """temp + replace: readers see the old file or the whole new one, never a torn one.

    The temp file gets a fresh random name beside path and is created O_EXCL, which never follows
    a symlink planted at that name (a shared output directory): we only ever write into a file we
    just created. It is removed on any failure. durable: also fsync the file and its directory,
    so the new content survives a crash of the machine (checkpoint manifests, health state);
    heartbeats that are rewritten every second only need the atomicity."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def write_json_atomic(path: Path, data: Mapping[str, Any], *, durable: bool = True) -> None:
    """data as JSON, written with write_text_atomic."""
    text = json.dumps(data, indent=1 if durable else None, sort_keys=True, allow_nan=False)
    write_text_atomic(path, text, durable=durable)


# Numbers in the JSON lines we read (ledgers, step logs, job output) stay within what the code that
# uses them can compute with: an integer of more digits than int64 has, or a number that is not
# finite, makes its line malformed (a 400-digit step count would overflow float arithmetic later).
MAX_JSON_INT_DIGITS = 19


def json_safe(value: Any) -> Any:
    """value for json.dumps(allow_nan=False): a float that is not finite becomes null, through
    lists, tuples and dicts."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:20]}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def bounded_json(text: "str | bytes") -> Any:
    """JSON with bounded numbers (int64-sized integers, finite floats, no NaN or Infinity); ValueError
    for anything else, RecursionError past the parser's nesting limit."""
    return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)


def json_object(line: str) -> Optional[Dict[str, Any]]:
    """One line as a JSON object with bounded numbers, or None (torn, not an object, a number out of
    range, nested past the parser's recursion limit)."""
    try:
        value = bounded_json(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def json_lines(text: str) -> List[Dict[str, Any]]:
    """The JSON objects among text's lines (ledgers, supervisor and trainer events in a job's
    output); other lines, torn lines, non-object values and out-of-range numbers are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        value = json_object(line)
        if value is not None:
            out.append(value)
    return out


def read_json_lines(path: Path, max_bytes: int) -> Optional[List[Dict[str, Any]]]:
    """The JSON objects of a regular file of at most max_bytes (ledgers, step logs); None for anything
    else: a missing file, a directory, a FIFO (never waited on), a symlink, a larger file (never read
    whole into memory)."""
    raw = read_small_regular(path, max_bytes)
    return None if raw is None else json_lines(raw.decode(errors="replace"))


def read_small_regular(path: Path, max_bytes: int, owner: Optional[int] = None) -> Optional[bytes]:
    """The bytes of a regular file of at most max_bytes; None for anything else (a directory, a
    FIFO, a symlink, a larger file) or when it cannot be read. For files in the control dir,
    which a job's own processes write. owner: root reads a user's file only when it is theirs with
    one link (a hard link to a file they do not own would have root read it for them)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):               # ValueError: a NUL byte in the path
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (owner is not None and (info.st_uid != owner or info.st_nlink != 1)):
            return None
        raw = os.read(fd, max_bytes + 1)
        return raw if len(raw) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)
