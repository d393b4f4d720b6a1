"""Small file helpers shared by checkpoints, health state, control files and ledgers: one
atomic JSON writer and one JSON-lines reader."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Mapping[str, Any], *, durable: bool = True) -> None:
    """temp + replace: readers see the old file or the whole new one, never a torn one.

    durable: also fsync the file and its directory, so the new content survives a crash of
    the machine (checkpoint manifests, health state); heartbeats that are rewritten every
    second only need the atomicity."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(data, indent=1 if durable else None, sort_keys=True, allow_nan=False)
    # never follow a link planted at the temp name, never write into a file we did not create
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_path(path.parent)


def json_lines(text: str) -> List[Dict[str, Any]]:
    """The JSON objects among text's lines (ledgers, supervisor and trainer events in a job's
    output); other lines, torn lines and non-object values are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def read_small_regular(path: Path, max_bytes: int) -> Optional[bytes]:
    """The bytes of a regular file of at most max_bytes; None for anything else (a directory, a
    FIFO, a symlink, a larger file) or when it cannot be read. For files in the control dir,
    which a job's own processes write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, max_bytes + 1)
        return raw if len(raw) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)
