"""The TCP connections a gloo process group opened, shut down when the group is left.

Why: gloo has no working abort (torch 2.13's ProcessGroupGloo.abort() and shutdown() leave a
collective blocked on a live peer blocked), and a group a trainer keeps its model on is never
freed, so its connections would stay open until the process exits. A rank whose group broke
shuts them down: every peer blocked on it gets its error at once, and in turn does the same. The
connections are those the group's creation opened (listed before and after it, less the store's),
matched again by descriptor and both addresses when shut, so a descriptor number reused since is
never touched. NCCL is aborted through torch instead (train/inplace.py).
"""
from __future__ import annotations

import os
import socket
from typing import Callable, FrozenSet, Iterable, Tuple

import psutil

# a TCP connection of this process: its descriptor, local and remote address
Connection = Tuple[int, Tuple[str, int], Tuple[str, int]]


def connections() -> FrozenSet[Connection]:
    """This process's connected TCP sockets (a listener has no remote address: not one)."""
    found = set()
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.raddr and conn.fd >= 0:
            found.add((conn.fd, (conn.laddr.ip, conn.laddr.port), (conn.raddr.ip, conn.raddr.port)))
    return frozenset(found)


def opened_by(create: Callable[[], None], store_ports: Iterable[int]) -> FrozenSet[Connection]:
    """create() run; the connections it opened that are not a store's (by either end's port)."""
    before = connections()
    create()
    ports = set(store_ports)
    return frozenset(conn for conn in connections() - before if conn[1][1] not in ports and conn[2][1] not in ports)


def shut(group: FrozenSet[Connection]) -> int:
    """Shut down those of group's connections still open; how many. Never raises."""
    count = 0
    for fd, _, _ in group & connections():
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:
            pass                     # closed meanwhile
    return count
