"""The job's rendezvous (slurmtools/common/rendezvous.py): a random port nobody listens on, new for every
step, and the torchrun agent on MASTER_ADDR told that it hosts the store, so a squatter on the
port makes the step fail instead of becoming the job's store (real torch TCPStores on this host)."""
from __future__ import annotations

import socket
import subprocess

import pytest

from slurmtools.common.rendezvous import (AGENT_WRAPPER, PORT_TRIES, RDZV_PORT_BASE, RDZV_PORT_SPAN, SHELL_PORT_EXPR,
                                          NoFreePort, free_here, pick_port, step_env)


def test_a_port_is_drawn_from_the_range_and_a_taken_one_is_passed_over():
    draws = iter([5, 6, 7])
    taken = {RDZV_PORT_BASE + 5, RDZV_PORT_BASE + 6}
    assert pick_port(lambda port: port not in taken, lambda span: next(draws)) == RDZV_PORT_BASE + 7
    assert all(RDZV_PORT_BASE <= pick_port() < RDZV_PORT_BASE + RDZV_PORT_SPAN for _ in range(50))
    assert RDZV_PORT_BASE + RDZV_PORT_SPAN - 1 < 32768          # below the ephemeral range


def test_no_free_port_after_the_tries_is_one_line():
    tried = []
    with pytest.raises(NoFreePort) as caught:
        pick_port(lambda port: tried.append(port) is not None, lambda span: 0)
    assert len(tried) == PORT_TRIES
    assert str(caught.value) == (f"no free rendezvous port on this host: {PORT_TRIES} random ports of "
                                 f"20000-31999 tried, every one taken")


def test_a_port_someone_listens_on_is_not_free_and_is_again_once_closed():
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not free_here(port)
    assert free_here(port)


def test_the_step_gets_the_port_for_its_ranks_and_for_torchrun():
    assert step_env("node1", 23456) == {"MASTER_PORT": "23456", "PET_RDZV_ENDPOINT": "node1:23456"}


def _wrapped(**env: str) -> str:
    out = subprocess.run(["bash", "-c", AGENT_WRAPPER, "slurmtools-agent", "sh", "-c",
                          'echo "$PET_RDZV_CONF $PET_RDZV_ENDPOINT"'], env={"PATH": "/usr/bin:/bin", **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_only_the_agent_on_master_addr_hosts_the_store_at_the_supervisors_endpoint():
    base = {"MASTER_ADDR": "node1", "MASTER_PORT": "20001", "PET_RDZV_ENDPOINT": "node1:23456"}
    assert _wrapped(SLURMD_NODENAME="node1", **base) == "is_host=1 node1:23456"
    assert _wrapped(SLURMD_NODENAME="node2", **base) == "is_host=0 node1:23456"
    # without the supervisor: the script's own MASTER_ADDR:MASTER_PORT
    assert _wrapped(SLURMD_NODENAME="node1", MASTER_ADDR="node1", MASTER_PORT="20001") == "is_host=1 node1:20001"


def test_the_scripts_first_pick_is_random_and_in_the_range():
    picks = {int(subprocess.run(["bash", "-c", f"echo {SHELL_PORT_EXPR}"], capture_output=True, text=True,
                                check=True).stdout) for _ in range(8)}
    assert len(picks) > 1 and all(RDZV_PORT_BASE <= port < RDZV_PORT_BASE + RDZV_PORT_SPAN for port in picks)


def test_a_squatter_on_the_port_becomes_the_store_unless_the_agent_is_told_it_hosts_it():
    """torchrun's c10d backend, as the agent on the first node runs it: left to guess, an agent
    that cannot bind the port connects to whatever store listens there (here a squatter's, which
    then holds the job's rendezvous keys); told is_host=1 (AGENT_WRAPPER) it fails instead."""
    pytest.importorskip("torch")
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    port = pick_port()
    squatter = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    squatter.set("planted", "by another user")

    def agent(**conf: str):
        return create_backend(RendezvousParameters("c10d", f"127.0.0.1:{port}", "job", 1, 1, read_timeout="5",
                                                   **conf))
    _, store = agent()                   # torchrun's own guess: a client of the squatter
    assert store.get("planted") == b"by another user"
    with pytest.raises(RendezvousConnectionError):
        agent(is_host="1")
