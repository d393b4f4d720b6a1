"""Where each node's slurmd listens is asked of the controller once, at the step's launch, for all
its nodes: a node lost while the controller is down (failures come together: the fault matrix's
controller-outage test) is found by its silent ranks and its slurmd that refuses, without the
controller (R48: 95 s when the address was first asked once the node fell silent)."""
from __future__ import annotations

import socket
from typing import Dict, List, Tuple

import pytest

from slurmtools.errors import SlurmCommandError
from slurmtools.requeue import nodecheck
from slurmtools.slurm import commands as slurm

SHOW_NODES = ("NodeName=node2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.12 NodeHostName=node2 State=ALLOCATED\n"
              "NodeName=node3 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.13 NodeHostName=node3 State=ALLOCATED\n")


def test_one_query_gives_every_nodes_address_and_the_port(monkeypatch):
    asked: List[List[str]] = []

    def fake_run(argv, **_kwargs):
        asked.append(list(argv))
        return SHOW_NODES if argv[:4] == ["scontrol", "-o", "show", "node"] else "SlurmdPort              = 7018\n"
    monkeypatch.setattr(slurm, "run_slurm", fake_run)     # Slurm's answers fed in: this tests our reading of them
    assert slurm.slurmd_endpoints("node[2-3]") == {"node2": ("10.77.0.12", 7018), "node3": ("10.77.0.13", 7018)}
    assert asked == [["scontrol", "-o", "show", "node", "node[2-3]"], ["scontrol", "show", "config"]]


def test_a_node_lost_while_the_controller_is_down_is_found_by_the_address_asked_at_launch(monkeypatch):
    listener = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    endpoints: Dict[str, Tuple[str, int]] = {"node2": ("127.0.0.1", listener.getsockname()[1]),
                                             "node3": ("127.0.0.1", refused_port)}
    asked: List[str] = []

    def controller_up(hostlist: str) -> Dict[str, Tuple[str, int]]:
        asked.append(hostlist)
        return dict(endpoints)

    def controller_down(hostlist: str) -> Dict[str, Tuple[str, int]]:
        raise SlurmCommandError(["scontrol"], 1, "Unable to contact slurm controller")

    watch = nodecheck.NodeWatch(10, ["node1", "node2", "node3"], "node1", 0.0)
    try:
        monkeypatch.setattr(slurm, "slurmd_endpoints", controller_up)
        resolved = watch.resolve_endpoints()
        assert resolved is not None
        resolved.result(timeout=10)
        assert asked == ["node[2-3]"]                      # one query, the batch host left out
        monkeypatch.setattr(slurm, "slurmd_endpoints", controller_down)
        assert watch.answers("node2") is True
        assert watch.answers("node3") is False             # dead, found without the controller
    finally:
        watch.close()
        listener.close()


def test_without_the_launch_query_a_silent_node_is_never_declared_dead_on_a_guess(monkeypatch):
    def controller_down(hostlist: str) -> Dict[str, Tuple[str, int]]:
        raise SlurmCommandError(["scontrol"], 1, "Unable to contact slurm controller")
    monkeypatch.setattr(slurm, "slurmd_endpoints", controller_down)
    watch = nodecheck.NodeWatch(10, ["node1", "node2"], "node1", 0.0)
    try:
        assert watch.answers("node2") is True
    finally:
        watch.close()


@pytest.mark.parametrize("candidates", [[], ["node1"]])
def test_nothing_to_ask_when_the_step_has_only_the_batch_host(candidates):
    watch = nodecheck.NodeWatch(10, candidates, "node1", 0.0)
    try:
        assert watch.resolve_endpoints() is None
    finally:
        watch.close()
