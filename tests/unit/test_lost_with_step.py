"""A step that fails on its own while one of its nodes dies (during the launch, say, before any
rank beat) is a node failure, not a crash: the supervisor asks every slurmd of the step at once
instead of restarting onto the dead node and finding it a second time (CI, stop 36)."""
from __future__ import annotations

from typing import Iterator, Set

import pytest

from slurmtools.common.ledger import Cause
from slurmtools.requeue import nodecheck, observe
from slurmtools.requeue.policy import Evidence, classify

LAUNCH_TAIL = ("srun: error: Task launch for StepId=100004.1 failed on node node3: Zero Bytes were "
               "transmitted or received\nsrun: error: Application launch failed: Zero Bytes were transmitted\n")


@pytest.fixture
def watch() -> Iterator[nodecheck.NodeWatch]:
    node_watch = nodecheck.NodeWatch(30, ["node1", "node2", "node3", "node4", "node5"], "node1", 0.0)
    node_watch.reprobe_after_s = 0.01
    node_watch.controller_answers = lambda: False      # the witness for our own network: not reachable here
    yield node_watch
    node_watch.close()


def _down(monkeypatch, watch: nodecheck.NodeWatch, dead: Set[str]) -> None:
    monkeypatch.setattr(watch, "answers", lambda node: node not in dead)


def test_a_node_lost_during_the_launch_is_named_with_the_exit(watch, monkeypatch):
    _down(monkeypatch, watch, {"node3"})
    lost = observe.lost_with_step(watch, 1, LAUNCH_TAIL)
    assert lost == (("node3",), "the step failed (exit 1) and the slurmd of node3 does not answer")
    diag = classify(Evidence(exit_code=1, dead_node="node3", dead_detail=lost[1], log_tail=LAUNCH_TAIL))
    assert (diag.cause, diag.node, diag.fatal_for_node) == (Cause.NODE_FAILURE, "node3", True)


def test_the_node_srun_named_comes_first(watch, monkeypatch):
    _down(monkeypatch, watch, {"node2", "node3"})
    lost = observe.lost_with_step(watch, 1, LAUNCH_TAIL)
    assert lost is not None and lost[0] == ("node3", "node2")
    assert lost[1] == "the step failed (exit 1) and the slurmd of node3,node2 does not answer"


def test_every_slurmd_answering_leaves_a_crash(watch, monkeypatch):
    _down(monkeypatch, watch, set())
    assert observe.lost_with_step(watch, 1, LAUNCH_TAIL) is None


def test_a_majority_unreachable_names_nobody(watch, monkeypatch):
    """Three of the five nodes silent, and the controller out of reach too: our own node's network."""
    _down(monkeypatch, watch, {"node2", "node3", "node4"})
    assert observe.lost_with_step(watch, 1, LAUNCH_TAIL) is None


def test_a_slurmd_that_answers_the_second_probe_is_not_lost(watch, monkeypatch):
    missed = {"node3"}

    def answers(node: str) -> bool:
        if node in missed:
            missed.discard(node)
            return False
        return True
    monkeypatch.setattr(watch, "answers", answers)
    assert observe.lost_with_step(watch, 1, LAUNCH_TAIL) is None


def test_a_clean_exit_or_no_exit_asks_nobody(watch, monkeypatch):
    def refuse(node: str) -> bool:
        raise AssertionError(f"probed {node}")
    monkeypatch.setattr(watch, "answers", refuse)
    assert observe.lost_with_step(watch, 0, "") is None
    assert observe.lost_with_step(watch, None, "") is None
