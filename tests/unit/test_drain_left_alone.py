"""Our drain never writes over a person's decision (issue 51, finding 4): a node a person set
DOWN or FAIL ("RMA, do not resume"), or one in maintenance, keeps its state and reason; a node
slurmctld marked DOWN itself (not responding) may still be drained with the job's evidence."""
import pytest

from slurmtools.slurm import drain, commands as slurm
from slurmtools.slurm.parse import NodeInfo


def node(state, flags=(), reason=""):
    return NodeInfo("node2", state, tuple(flags), reason, "", "", "")


@pytest.mark.parametrize("info, alone", [
    (node("allocated"), False),
    (node("idle"), False),
    (node("down", ("NOT_RESPONDING",), "Not responding"), False),          # slurmctld's own: ours may follow
    (node("down", (), "Node unexpectedly rebooted"), False),
    (node("down", (), "RMA, do not resume"), True),                         # a person's
    (node("down", (), ""), True),
    (node("fail", (), "bad DIMM"), True),
    (node("failing", (), "bad DIMM"), True),
    (node("idle", ("MAINT",)), True),
    (node("idle", ("MAINTENANCE",)), True),                                 # its name in --json
    (node("allocated", ("DRAIN",), "slurmtools: CRITICAL job.hang x"), True),
    (node("idle", ("DRAIN",), "fan replaced, testing"), True),
])
def test_which_nodes_our_drain_leaves_alone(info, alone):
    assert drain.left_alone(info) is alone


def test_a_node_a_person_set_down_keeps_their_reason(monkeypatch):
    drained = []
    monkeypatch.setattr(slurm, "drain_node", lambda name, reason: drained.append((name, reason)))
    reason = drain.DrainReason("CRITICAL", "job.node_failure", "every rank silent", "17")
    monkeypatch.setattr(slurm, "nodes", lambda names=None: [node("down", (), "RMA, do not resume")])
    assert drain.drain("node2", reason) is False
    assert drain.reboot("node2", reason) is False
    monkeypatch.setattr(slurm, "nodes", lambda names=None: [node("down", ("NOT_RESPONDING",), "Not responding")])
    assert drain.drain("node2", reason) is True
    assert drained == [("node2", reason.render())]
