"""The fault matrix on a 5-node mini-cluster (marker `matrix`; scripts/test.sh runs it in lane 2 on a
cluster of its own): failures that come together. Each job is 3 nodes x 1 process, compared with
the uninterrupted run of that shape, and ends with no training process left over.

a two training nodes killed at once, two spares: both replaced in the allocation, no requeue; with
  snapshots on, both members of a pair lost: the persistent checkpoint
b two training nodes killed at once, no spare: one requeue excluding both
c a node killed during start-up, before any of its ranks beat
d a second failure during the recovery from a first
e the controller stopped while the job requeues itself (and started again 30 s later)
f a node partitioned from the others (its link down), healed after the job ended
g the checkpoint's storage failing over (EIO from the kernel) while the restart after a crash reads it
"""
from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.minicluster import daemons
from slurmtools.slurm import commands as slurm
from tests.cluster import eio_fs, training
from tests.cluster.test_faults import _expand
from tests.conftest import TEST_CLUSTER_NODES, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]

MATRIX_NODES = 5     # 3 training nodes and 2 spares
JOB_NODES = 3


@pytest.fixture(scope="module")
def reference3(cluster) -> str:
    """The final state hash of the uninterrupted 3 x 1 run."""
    from tests.cluster import asuser
    if TEST_CLUSTER_NODES < MATRIX_NODES:
        pytest.fail(f"the fault matrix needs a {MATRIX_NODES}-node cluster: run it with "
                    f"SLURMTOOLS_TEST_CLUSTER_NODES={MATRIX_NODES} on a cluster of its own (scripts/test.sh does)")
    spec = _spec(asuser.user_dir("reference3"), "reference3", preflight=True)
    job = training.submit(spec)
    info = training.wait_finished(job, 180)
    finals = training.trainer_events(training.events(spec, job), "final")
    assert info.state == "COMPLETED" and finals, training.describe(spec, job)
    return str(finals[-1]["state_sha256"])


def _spec(workdir: Path, name: str, *, extra: Sequence[str] = (), preflight: bool = training.PREFLIGHT,
          distributed: Optional[Dict[str, Any]] = None, **requeue: Any):
    return training.fault_spec(workdir, name, nodes=JOB_NODES, processes_per_node=1, preflight=preflight,
                               extra=["--step-sleep-s", "0.5", "--no-async-checkpoint", *extra],
                               requeue={"hang_timeout_s": 120, "backoff_s": 0, **requeue},
                               **({"distributed": distributed} if distributed else {}))


def decisions(evts: List[Dict[str, Any]]):
    return [(d["cause"], d["action"]) for d in training.supervisor_events(evts, "decision")]


def _start_nodes(evts: List[Dict[str, Any]]) -> List[List[str]]:
    return [_expand(s["nodes"]) for s in training.supervisor_events(evts, "start")]


@contextlib.contextmanager
def _killed(cluster, nodes: Sequence[str]) -> Iterator[None]:
    """Kill these nodes at once; bring them back (drains lifted, idle) after the test's checks."""
    for node in nodes:
        faults.kill_node(cluster, node)
    try:
        yield
    finally:
        for node in nodes:
            faults.restart_node(cluster, node)
        training.settle(90)


def _completed_with_a_node_killed(cluster, spec, job: int, timeout_s: float) -> "tuple[str, List[dict]]":
    """The second node of the job's newest start killed, the job awaited to COMPLETED, the node
    brought back: the victim and the job's events."""
    victim = _start_nodes(training.events(spec, job))[-1][1]
    with _killed(cluster, [victim]):
        info = training.wait_finished(job, timeout_s)
        evts = training.events(spec, job)
        assert info.state == "COMPLETED", training.describe(spec, job)
    return victim, evts


def _finished(spec, job: int, reference: str, expected: List[tuple], timeout_s: float = 300):
    info = training.wait_finished(job, timeout_s)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    assert decisions(evts) == expected, training.describe(spec, job)
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference
    assert training.leftover_trainers(job) == []
    return evts


def _at_step_6(spec) -> "tuple[int, List[str]]":
    """Submitted and trained to step 6 (checkpoint 4 complete): the job and its first nodes."""
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    return job, _start_nodes(training.events(spec, job))[0]


def test_a_two_nodes_killed_at_once_are_both_replaced_by_spares(cluster, workdir, reference3):
    """With in-memory snapshots every step: the first victim's replica was kept by the second
    (snapshot.peer_of: the next node of the ring), so both members of its pair are lost and every
    rank resumes from the persistent checkpoint, the ledger saying why."""
    spec = _spec(workdir, "twospares", spare_nodes=2, distributed=training.SNAPSHOTS_EVERY_STEP)
    job, nodes = _at_step_6(spec)
    victims = nodes[1:]
    with _killed(cluster, victims):
        evts = _finished(spec, job, reference3, [("node_failure", "restart"), ("completed", "complete")])
        dead = training.supervisor_events(evts, "node_dead")
        assert len(dead) == 1 and sorted([dead[0]["node"], *dead[0]["also"]]) == victims, dead
        spares = sorted(set(_expand(slurm.job_state(job).nodes)) - set(nodes))
        assert len(spares) == 2 and _start_nodes(evts)[1] == sorted([nodes[0], *spares])
        assert slurm.job_state(job).restarts == 0                  # in the allocation, no requeue
        decision = training.supervisor_events(evts, "decision")[0]
        assert sorted([decision["exclude"], *decision["also"]]) == victims
        for node in victims:
            reason = training.blamed_reason(node, job)
            assert reason.startswith("slurmtools: CRITICAL job.node_failure "), reason
        resumed = training.trainer_events(evts, "resumed")
        assert len(resumed) == 1 and resumed[0]["step"] in (4, 8) and not resumed[0]["path"].startswith("in-memory")
        restores = [(e.step, e.why) for e in ledger.read(control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job)))
                    if isinstance(e, ledger.SnapshotRestore)]
        assert len(restores) == 2 and restores[1][0] is None, restores
        assert re.fullmatch(r"step \d+: no copy of rank 1 on a living node", restores[1][1]), restores


def test_b_two_nodes_killed_at_once_without_spares_requeue_once_excluding_both(cluster, workdir, reference3):
    spec = _spec(workdir, "twonospare")
    job, nodes = _at_step_6(spec)
    victims = nodes[1:]
    with _killed(cluster, victims):
        evts = _finished(spec, job, reference3, [("node_failure", "requeue"), ("completed", "complete")])
        second = _start_nodes(evts)[1]
        assert len(second) == JOB_NODES and not set(victims) & set(second), second
        assert slurm.job_state(job).restarts == 1
        assert training.trainer_events(evts, "resumed")[0]["step"] in (4, 8)


def test_c_a_node_killed_during_start_up_before_any_heartbeat(cluster, workdir, reference3):
    spec = _spec(workdir, "startkill", preflight=True)
    job = training.submit(spec)
    # after the preflight step (this job runs one), while the training
    # step starts: a node lost during preflight itself is another case (R17: Slurm found it first
    # and its SIGTERM read as a preemption; see docs/recovery.md)
    wait_for(lambda: training.supervisor_events(training.events(spec, job), "preflight"), 180,
             f"job {job}'s preflight to end and its training step to start", interval_s=0.1)
    assert not [e for e in training.events(spec, job) if "loss" in e]      # no rank has trained yet
    victim = _start_nodes(training.events(spec, job))[0][1]
    with _killed(cluster, [victim]):
        evts = _finished(spec, job, reference3, [("node_failure", "requeue"), ("completed", "complete")])
        assert victim not in _start_nodes(evts)[1]
        assert not training.trainer_events(evts, "resumed")        # nothing to resume: it starts afresh


def test_d_a_second_failure_during_the_recovery_from_a_first(cluster, workdir, reference3):
    """A crash at step 6 restarts in place from checkpoint 4; the restart's second node dies while
    it starts: infrastructure (the job trained before), so a requeue excluding it, not a stop."""
    spec = _spec(workdir, "twofaults", extra=["--fail-at-step", "6"])
    job = training.submit(spec)
    wait_for(lambda: len(training.supervisor_events(training.events(spec, job), "start")) >= 2, 120,
             f"job {job}'s restart in place", interval_s=0.1)
    victim = _start_nodes(training.events(spec, job))[1][1]
    with _killed(cluster, [victim]):
        evts = _finished(spec, job, reference3, [("crash", "restart"), ("node_failure", "requeue"),
                                                 ("completed", "complete")])
        assert victim not in _start_nodes(evts)[2]
        assert [e["step"] for e in training.trainer_events(evts, "resumed")][-1] == 4


CONTROLLER_DOWN_AFTER_DECISION_S = 12   # the requeue must be retried at least once through the outage


def test_e_the_controller_stopped_during_a_requeue(cluster, workdir, reference3):
    """A node dies and the controller is down when the supervisor requeues the job: the requeue
    rides through the outage (slurm.REQUEUE_OUTAGE_S) and the job resumes on the other nodes."""
    spec = _spec(workdir, "ctldrequeue")
    job, nodes = _at_step_6(spec)
    victim = nodes[1]
    faults.stop_controller(cluster)
    with _killed(cluster, [victim]):
        try:
            decided = wait_for(lambda: training.supervisor_events(training.events(spec, job), "decision"), 120,
                               f"job {job}'s supervisor to decide while the controller is down")
            assert (decided[0]["cause"], decided[0]["action"]) == ("node_failure", "requeue")
            time.sleep(CONTROLLER_DOWN_AFTER_DECISION_S)
        finally:
            faults.start_controller(cluster)
        evts = _finished(spec, job, reference3, [("node_failure", "requeue"), ("completed", "complete")])
        assert victim not in _start_nodes(evts)[1]
        assert slurm.job_state(job).restarts == 1


def test_f_a_node_partitioned_from_the_others(cluster, workdir, reference3):
    """node2's link goes down at step 6: its ranks go on beating on the shared filesystem while
    every collective stalls. The hang is attributed to the node whose slurmd does not answer
    (cut off), the job requeues excluding it, and once healed its orphaned ranks are gone."""
    spec = _spec(workdir, "partition", hang_timeout_s=15)
    job, nodes = _at_step_6(spec)
    victim = nodes[1]
    faults.partition_node(cluster, victim)
    try:
        info = training.wait_finished(job, 300)
    finally:
        faults.heal_node(cluster, victim)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    assert decisions(evts) == [("node_failure", "requeue"), ("completed", "complete")], training.describe(spec, job)
    hang = training.supervisor_events(evts, "hang")
    assert [h["host"] for h in hang] == [victim], hang
    assert training.supervisor_events(evts, "decision")[0]["exclude"] == victim
    assert victim not in _start_nodes(evts)[1]
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference3
    reason = training.blamed_reason(victim, job)
    assert reason.startswith("slurmtools: CRITICAL job.node_failure every rank stopped at step "), reason
    assert f"the slurmd of {victim} does not answer: cut off from the other nodes" in reason, reason
    wait_for(lambda: training.leftover_trainers(job) == [], 90, f"the ranks left on {victim} to end once healed")
    training.settle(90)


EIO_WINDOW_S = 2.5      # the failover: the verification's first reads and its first retry (after 1 s) fail


def _stepped_after_resume(evts: List[Dict[str, Any]]) -> bool:
    """Whether the resumed attempt trained a step: every rank is past its resume (a step's
    collectives wait for all)."""
    resumed = training.trainer_events(evts, "resumed")
    return bool(resumed) and any("loss" in e and e.get("attempt_id") == resumed[0]["attempt_id"] for e in evts)


def test_g_the_checkpoints_storage_failing_over_during_a_resume_is_waited_out(cluster, workdir, reference3,
                                                                             tmp_path):
    """A crash at step 10 restarts in place after a 15-s backoff; meanwhile the newest checkpoint
    (step 8) is put behind a file system on every node of the job (FUSE, eio_fs.py) whose reads of
    its shards fail with EIO for 2.5 s from the first one, as a parallel file system's client does
    while a storage target fails over. The ranks read their shares again with backoff: step 8 is
    neither quarantined nor passed over for step 4, and the run ends with the uninterrupted hash.
    Before the mend an EIO was a corrupt checkpoint: quarantined, the next tried, and with none
    left the trainer began at step 0."""
    spec = _spec(workdir, "eio", extra=["--fail-at-step", "10"], backoff_s=15)
    job = training.submit(spec)
    wait_for(lambda: decisions(training.events(spec, job)) == [("crash", "restart")], 120,
             f"job {job}'s crash decided (its restart waits the backoff)", interval_s=0.2)
    step8 = CheckpointManager(spec.checkpoint_dir).final_dir(8)
    assert [c.step for c in CheckpointManager(spec.checkpoint_dir).complete()][:1] == [8]
    servers = []
    try:
        for node in _start_nodes(training.events(spec, job))[0]:
            slurmd = daemons.read_pidfile(cluster.slurmd_pidfile(node))
            assert slurmd is not None
            servers.append(eio_fs.serve_in_namespace_of(slurmd, step8, EIO_WINDOW_S, tmp_path / f"eio-{node}.log"))
        # a step of the resumed attempt, not its "resumed" line: rank 0 writes that once its own
        # trainer state is read, while another rank may still read its own through the server
        # (R109: rank 2 lost its read to the server's end and the attempt failed)
        wait_for(lambda: _stepped_after_resume(training.events(spec, job)), 120,
                 f"job {job} resumed and stepped", interval_s=0.2)
    finally:
        for server in servers:       # before the save of step 16 prunes step 8 (a mount point)
            server.terminate()
            server.wait(timeout=30)
    evts = _finished(spec, job, reference3, [("crash", "restart"), ("completed", "complete")])
    failed_reads = sum(log.read_text().count("eio_fs: EIO") for log in tmp_path.glob("eio-*.log"))
    assert failed_reads >= JOB_NODES, [log.read_text()[-300:] for log in tmp_path.glob("eio-*.log")]
    resumed = training.trainer_events(evts, "resumed")
    assert [(r["step"], r["path"]) for r in resumed] == [(8, str(step8))], resumed
    assert training.trainer_events(evts, "checkpoint_refused") == []
    assert not list(Path(spec.checkpoint_dir).glob("*.bad-*"))
    # each step met at a port of its own, drawn at random (slurmtools.common.rendezvous), not the job id's
    ports = [r["port"] for r in training.supervisor_events(evts, "rendezvous")]
    assert len(ports) == 2 and ports[0] != ports[1] and all(20000 <= port < 32000 for port in ports), ports
