"""The job's control plane at 128 nodes (marker `scale`: a 130-node cluster of its own, lane 2 of
scripts/test.sh): a light trainer without torch (examples/light/train.py: a sleep stands for each
step's work, so 128 ranks fit 2 cores) on 128 nodes with 2 hot spares. One node is a straggler
(--slow-node): found by its ranks' busy time, checkpointed away from and replaced by the first spare;
then a node is killed: the step fails (its ranks' connections to the step barrier close, as gloo's
do), its slurmd does not answer, the second spare takes its place. The job completes without a
requeue, heartbeats gathered per node throughout."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from slurmtools.common.control_dir import HEARTBEAT_DIR, control_dir_for
from slurmtools.minicluster import faults
from slurmtools.requeue import watchdog
from slurmtools.slurm import drain, commands as slurm
from slurmtools.spec import JobSpec, spec_from_dict
from tests.cluster import training
from tests.cluster.test_faults import _expand
from tests.conftest import TEST_CLUSTER_NODES, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.scale]

LIGHT = training.LIGHT
TRAIN_NODES, SPARES = 128, 2
STEPS = 70      # the straggler swapped by step ~20, the kill after it: 40+ steps of margin


@pytest.fixture
def workdir(cluster, user_tmp):
    if TEST_CLUSTER_NODES < TRAIN_NODES + SPARES:
        pytest.fail(f"the scale test needs a {TRAIN_NODES + SPARES}-node cluster: run it with "
                    f"SLURMTOOLS_TEST_CLUSTER_NODES={TRAIN_NODES + SPARES} on a cluster of its own (scripts/test.sh does)")
    training.settle(180)
    yield user_tmp
    training.cancel_all()


def _spec(workdir) -> JobSpec:
    return spec_from_dict({
        "name": "scale", "nodes": TRAIN_NODES, "processes_per_node": 1, "launcher": "srun", "python": sys.executable,
        "command": [str(LIGHT), "--steps", str(STEPS), "--step-s", "0.2", "--checkpoint-every", "10",
                    "--slow-node", "node5:0.3"],
        "output_dir": str(workdir / "logs"), "checkpoint_dir": str(workdir / "ckpt"), "time_limit_min": 15,
        # node5 at 2.5x; a factor of 1.5 over 5-step windows keeps a rank of a busy 2-core machine from
        # ever looking slow (it would need 0.5 s more sleep in each of two windows in a row)
        "requeue": {"spare_nodes": SPARES, "straggler_factor": 1.5, "straggler_window_steps": 5, "straggler_windows": 2,
                    "hang_timeout_s": 120,
                    "backoff_s": 0, "warning_lead_s": 60, "checkpoint_grace_s": 30},
        "preflight": False,
    })


def _retrained(control: Path, first_attempt: str, ranks: int) -> Optional[str]:
    """The attempt after the first in which every rank has beaten and finished steps (heartbeats are
    one file per node: a later attempt's beats replace an earlier one's), or None."""
    beats: Dict[str, List[watchdog.Beat]] = {}
    for beat in watchdog.read_heartbeats(control):
        beats.setdefault(beat.attempt_id, []).append(beat)
    return next((attempt for attempt, found in beats.items() if attempt != first_attempt and len(found) >= ranks
                 and all(beat.first_progress_s is not None for beat in found)), None)


def _launch_failure(decision: Dict[str, Any]) -> bool:
    """A step Slurm could not launch (srun's launch message to a node timed out: 130 slurmds and
    two other clusters on 2 cores, R87): the supervisor launches it again on the same nodes."""
    return (decision["cause"], decision["action"]) == ("crash", "restart") and "Task launch for" in decision["reason"]


def _wait_quietly(predicate, timeout_s: float) -> bool:
    """Whether predicate() held within timeout_s (polled every second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1.0)
    return bool(predicate())


def test_a_straggler_and_a_killed_node_at_128_nodes_are_replaced_by_spares(cluster, workdir):
    spec = _spec(workdir)
    job = training.submit(spec)
    control = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job))
    # the straggler swapped and every rank training again (heartbeats gathered per node): then a node goes
    if not _wait_quietly(lambda: _retrained(control, f"{job}.0", TRAIN_NODES) is not None, 300):
        pytest.fail(f"timed out after 300 s waiting for job {job}'s straggler swapped and all ranks training again\n"
                    + training.supervisor_story(training.events(spec, job))[-8000:]
                    + "\n" + training.describe(spec, job))
    training_now = _retrained(control, f"{job}.0", TRAIN_NODES)
    start = next(s for s in training.supervisor_events(training.events(spec, job), "start")
                 if s["attempt_id"] == training_now)
    victim = _expand(start["nodes"])[6]
    assert len(list((control / HEARTBEAT_DIR).glob("node-*.json"))) >= TRAIN_NODES
    assert not list((control / HEARTBEAT_DIR).glob("[0-9]*.json"))          # no rank wrote a file of its own
    faults.kill_node(cluster, victim)
    try:
        info = training.wait_finished(job, 420)
        evts = training.events(spec, job)
        assert info.state == "COMPLETED", training.describe(spec, job)
        made = training.supervisor_events(evts, "decision")
        story = training.supervisor_story(evts)[-8000:] + "\n" + training.describe(spec, job)
        # Slurm's own removal of the dead node (SlurmdTimeout after the kill, at a moment of its own)
        # can still end the replacement step: part of that node failure, restarted, not counted, once
        aftermath = [d for d in made if d["reason"].endswith("part of the node failure before, not counted")]
        assert len(aftermath) <= 1 and all((d["cause"], d["action"]) == ("node_failure", "restart")
                                           for d in aftermath), story
        relaunched = [d for d in made if _launch_failure(d)]
        assert len(relaunched) <= 2, story
        decisions = [(d["cause"], d["action"]) for d in made if d not in aftermath and d not in relaunched]
        # a string, not a tuple: pytest prints a string message whole (a tuple's repr is cut short)
        assert decisions == [("straggler", "restart"), ("node_failure", "restart"), ("completed", "complete")], (
            f"{decisions}\n{story}")
        found = training.supervisor_events(evts, "straggler")
        assert [(s["node"], s["action"]) for s in found] == [("node5", "swap")] and found[0]["slowdown"] >= 1.5
        lost = [d for d in made if d["cause"] == "node_failure" and d not in aftermath]
        assert [d["node"] for d in lost] == [victim], story
        # the dead node given back before the next step (applied: false when Slurm had marked it down
        # and removed it first, under load): no removal of it can land on that step's launch
        assert [g["nodes"] for g in training.supervisor_events(evts, "give_back")] == [[victim]]
        assert not training.supervisor_events(evts, "give_back_failed")
        assert victim not in _expand(slurm.show_job(job)["NodeList"])
        starts = [_expand(s["nodes"]) for s in training.supervisor_events(evts, "start")]
        assert len(starts) == len(made), story          # every restart a step of its own, on...
        swaps = [nodes for n, nodes in enumerate(starts) if n == 0 or nodes != starts[n - 1]]
        assert len(swaps) == 3, story                   # ...new nodes only after the swap and the loss
        spares = [f"node{TRAIN_NODES + n}" for n in range(1, SPARES + 1)]
        assert swaps[0] == [f"node{n}" for n in range(1, TRAIN_NODES + 1)]
        assert sorted(swaps[1]) == sorted([n for n in swaps[0] if n != "node5"] + spares[:1])
        assert sorted(swaps[2]) == sorted([n for n in swaps[1] if n != victim] + spares[1:])
        assert training.trainer_events(evts, "final")[-1]["step"] == STEPS
        assert slurm.job_state(job).restarts == 0
        assert training.leftover_trainers(job, LIGHT) == []
    finally:
        faults.restart_node(cluster, victim)
        wait_for(lambda: "NOT_RESPONDING" not in slurm.nodes(victim)[0].flags, 90, f"{victim} responding")
        training.lift_blame_drains()
        for node in slurm.nodes():
            if node.drained and drain.is_ours(node.reason):
                drain.resume(node.name)
