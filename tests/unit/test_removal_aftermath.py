"""Slurm removes a dead node from a --no-kill job itself once it marks it DOWN, SlurmdTimeout
after the death, at a moment of its own; when that lands on the step that already replaced the
node, the step ends (the 128-node test in CI: `node59: task 56: Killed`, a counted crash, one in
two full runs). That end is part of the node failure already handled: not counted, once."""
from __future__ import annotations

import pytest

from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue.policy import Action, Capacity, Evidence, classify, decide, slurm_removal_aftermath
from slurmtools.spec import RequeueSpec

LIMITS = RequeueSpec(max_consecutive_failures=2)
# what CI's 128-node run printed for the step after the replacement
CI_TAIL = ("srun: error: node59: task 56: Killed\n"
           "srun: error: node24: task 21: Terminated\n"
           "[rank3]: ConnectionError: rank 0 left the step barrier\n")
NODE_FAILED = AttemptRecord(Cause.NODE_FAILURE, True, 10, "node8", 100.0)
IN_PLACE = Capacity(True, frozenset({"node1"}), 1)


def _ev(tail: str, handled=("node8",), exit_code=1, **more) -> Evidence:
    return Evidence(exit_code=exit_code, log_tail=tail, progressed=True, earlier_progress=True,
                    handled_nodes=handled, **more)


@pytest.mark.parametrize("tail, handled, states, aftermath", [
    (CI_TAIL, ("node8",), {}, True),
    ("srun: error: Node failure on node8\n", ("node8",), {}, True),
    ("srun: error: Task launch for StepId=1.2 failed on node node81: Communication connection failure\n",
     ("node8",), {}, True),
    (CI_TAIL, (), {}, False),                                               # no node failure handled in this run
    ("srun: error: node59: task 56: Exited with exit code 1\n", ("node8",), {}, False),   # the program's own exit
    ("srun: error: Node failure on node9\n", ("node8",), {}, False),        # another node: a new failure
    (CI_TAIL, ("node8",), {"node9": "down"}, False),
    (CI_TAIL + "slurmstepd: error: Detected 1 oom_kill event in StepId=1.2\n", ("node8",), {}, False),
])
def test_slurms_removal_of_a_node_already_handled(tail, handled, states, aftermath):
    assert slurm_removal_aftermath(_ev(tail, handled, node_states=states)) is aftermath


def test_the_ci_failure_is_part_of_the_node_failure_restarted_in_place_not_counted():
    diag = classify(_ev(CI_TAIL))
    assert (diag.cause, diag.node, diag.aftermath) == (Cause.NODE_FAILURE, None, True)
    verdict = decide(diag, [NODE_FAILED], LIMITS, 10, IN_PLACE, now_s=200.0)
    assert (verdict.action, verdict.counted, verdict.excluded) == (Action.RESTART, False, ())
    assert verdict.reason.endswith("part of the node failure before, not counted")
    # without the rule the same end was a counted crash
    assert classify(_ev(CI_TAIL, handled=())).cause is Cause.CRASH


def test_only_once_per_node_failure():
    diag = classify(_ev(CI_TAIL))
    second = decide(diag, [NODE_FAILED, AttemptRecord(Cause.NODE_FAILURE, False, 10)], LIMITS, 10, IN_PLACE,
                    now_s=300.0)
    assert second.counted and second.action is Action.RESTART
    # outside the allocation's means (no restart in place) it is a requeue, still not counted
    assert decide(diag, [NODE_FAILED], LIMITS, 10, Capacity(), now_s=200.0).action is Action.REQUEUE
