"""XID events from the kernel log (`NVRM: Xid (PCI:0000:1b:00): 79, ...`).

Reads /dev/kmsg records ("prio,seq,usec,flags;message") without blocking; the path is a
parameter, and a text file in the same format serves as a fixture. Only records with a
sequence number above the last one seen are new.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import List, Tuple

from slurmtools.common.xid import XID_LINE
from slurmtools.health.model import XidEvent


def parse_records(lines: List[str]) -> List[Tuple[int, str]]:
    out: List[Tuple[int, str]] = []
    for line in lines:
        head, sep, msg = line.partition(";")
        if not sep:
            continue
        parts = head.split(",")
        if len(parts) >= 2 and parts[1].isdigit():
            out.append((int(parts[1]), msg.rstrip("\n")))
    return out


def xid_events(records: List[Tuple[int, str]], after_seq: int) -> List[XidEvent]:
    events = []
    for seq, msg in records:
        if seq <= after_seq:
            continue
        match = XID_LINE.search(msg)
        if match:
            events.append(XidEvent(seq, match.group(1), int(match.group(2)), msg))
    return events


def read_records(path: Path) -> List[Tuple[int, str]]:
    """All records currently in the log; /dev/kmsg is read until it would block."""
    if str(path) != "/dev/kmsg":
        return parse_records(path.read_text(errors="replace").splitlines())
    lines = []
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:   # a record was overwritten while reading: skip it
                    continue
                raise
            if not chunk:
                break
            lines.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    return parse_records(lines)


# mlx5 port changes in the kernel log: "mlx5_core 0000:1a:00.0 ibp26s0: Link down",
# "mlx5_ib: ... port 1 ... link down"; each is one flap seen by the driver
MLX5_LINK_DOWN = re.compile(r"\bmlx5\w*\b.*\blink\s+down\b", re.IGNORECASE)


def link_down_count(records: List[Tuple[int, str]], after_seq: int) -> int:
    """mlx5 link-down lines newer than after_seq."""
    return sum(1 for seq, msg in records if seq > after_seq and MLX5_LINK_DOWN.search(msg))
