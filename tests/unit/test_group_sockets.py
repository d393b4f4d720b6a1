"""A gloo group's connections shut down when the group is left (slurmtools/train/group_sockets.py):
real sockets. The group's own connections are found by what its creation opened, less the store's;
shutting them down ends a peer's blocked read at once; a connection opened since is never touched."""
from __future__ import annotations

import socket
import threading
import time

from slurmtools.train import group_sockets


def _listener() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(8)
    return server


def test_the_connections_a_group_opened_less_the_stores_are_its_own():
    group_peer, store = _listener(), _listener()
    opened = []

    def create() -> None:
        opened.append(socket.create_connection(group_peer.getsockname()))
        opened.append(socket.create_connection(store.getsockname()))
    found = group_sockets.opened_by(create, [store.getsockname()[1]])
    assert [conn[2] for conn in found] == [group_peer.getsockname()]
    assert [conn[0] for conn in found] == [opened[0].fileno()]
    for sock in (*opened, group_peer, store):
        sock.close()


def test_shutting_the_group_down_ends_a_peers_blocked_read_and_spares_the_rest():
    server = _listener()
    mine: list = []
    found = group_sockets.opened_by(lambda: mine.append(socket.create_connection(server.getsockname())), [])
    peer, _ = server.accept()
    other = socket.create_connection(server.getsockname())          # opened after: not the group's
    other_peer, _ = server.accept()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(peer.recv(16)))
    reader.start()
    started = time.monotonic()
    assert group_sockets.shut(found) == 1
    reader.join(timeout=5)
    assert got == [b""] and time.monotonic() - started < 5            # the peer's read ended: EOF
    other.sendall(b"still open")
    assert other_peer.recv(16) == b"still open"
    mine[0].close()
    assert group_sockets.shut(found) == 0                             # closed since: nothing to do
    for sock in (peer, other, other_peer, server):
        sock.close()
