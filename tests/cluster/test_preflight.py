"""Preflight on the real mini-cluster: a node with a slow link (tc tbf), a slow node (CPU
quota) and a node computing wrong results (the test-only canary fault) are each named before
training, drained with the evidence, and replaced by the spare; training then ends with the
uninterrupted run's exact final state. The same wrong-results setting, starting mid-run, is
caught by the in-training SDC canary instead. The reference run, the notebook's jobs and the
fault matrix's start-up test run preflight on the healthy cluster too (no node named: their own
tests would fail otherwise; tests/cluster/training.py PREFLIGHT)."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurmtools.common import ledger
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.preflight.canary import CANARY_FAULT_ENV
from slurmtools.slurm import drain, commands as slurm
from tests.cluster import training
from tests.cluster.test_faults import _expand

pytestmark = pytest.mark.cluster


@pytest.fixture
def workdir(cluster, user_tmp):
    training.settle()
    yield user_tmp
    for node in cluster.node_names:
        faults.heal_node(cluster, node)
    training.cancel_all()
    for node in slurm.nodes():
        if node.drained and drain.is_ours(node.reason):
            drain.resume(node.name)


def _spec(workdir, name, **over):
    return training.fault_spec(workdir, name, requeue={"spare_nodes": 1}, preflight=True, **over)


def _run_naming(spec, node, test):
    """Submit; preflight names `node` with `test`, the spare takes its place, training completes."""
    job = training.submit(spec)
    info = training.wait_finished(job, 240)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    verdict = training.supervisor_events(evts, "preflight")
    assert [(v["status"], v["named"]) for v in verdict] == [("failed", [node])], training.describe(spec, job)
    assert [f["test"] for f in verdict[0]["findings"] if f["node"] == node][0] == test
    assert [(d["cause"], d["action"], d["node"]) for d in training.supervisor_events(evts, "decision")] == [
        ("preflight", "restart", node), ("completed", "complete", None)]
    reason = training.blamed_reason(node, job)
    assert reason.startswith(f"slurmtools: CRITICAL preflight.{test} node={node} measured="), reason
    assert " expected=" in reason, reason
    starts = training.supervisor_events(evts, "start")
    assert [_expand(s["nodes"]) for s in starts] == [["node1", "node2"], ["node1", "node3"]]
    records = [e for e in ledger.read(Path(spec.checkpoint_dir) / ".slurmtools" / str(job)) if isinstance(e, ledger.PreflightCheck)]
    assert [(r.status, sorted(r.named)) for r in records] == [("failed", [node])]
    return job, evts


def test_a_a_slow_link_is_named_by_the_pairwise_rounds(cluster, workdir, reference_run):
    faults.degrade_node(cluster, "node2", rate_mbit=100)
    job, evts = _run_naming(_spec(workdir, "pf-link"), "node2", "busbw")
    links = training.supervisor_events(evts, "preflight_link")
    slow = {tuple(link["nodes"]): link["busbw_gbps"] for link in links}
    assert slow[("node3", "node1")] > 4 * max(slow[("node1", "node2")], slow[("node2", "node3")]), links
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_b_a_slow_node_is_named_by_the_throughput_comparison(cluster, workdir, reference_run):
    # 5% of a core: on a 2-node job the median of its devices lies between the two nodes, so a node
    # is named only when about 3x slower than the other (slow_factor 2 against that median); at 15%
    # a loaded machine (both lanes, lane 2's fault matrix) squeezed node1 until node2 was not (R16)
    faults.degrade_node(cluster, "node2", cpu_percent=5)
    job, evts = _run_naming(_spec(workdir, "pf-cpu"), "node2", "throughput")
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_c_a_node_computing_wrong_results_is_named_by_the_canary(cluster, workdir, reference_run, monkeypatch):
    monkeypatch.setenv(CANARY_FAULT_ENV, "node2")
    job, evts = _run_naming(_spec(workdir, "pf-sdc"), "node2", "canary")
    canaries = {c["node"]: c["digest"] for c in training.supervisor_events(evts, "preflight_canary")}
    assert canaries["node1"] == canaries["node3"] != canaries["node2"]
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_d_the_same_node_going_wrong_mid_run_is_caught_by_the_training_canary(cluster, workdir, reference_run,
                                                                             monkeypatch):
    """node2 computes wrong results from step 6 on: preflight (before step 0) passes, the
    in-training canary at step 6 names it, training resumes from step 4 on the spare."""
    monkeypatch.setenv(CANARY_FAULT_ENV, "node2@6")
    spec = _spec(workdir, "pf-mid", extra=["--sdc-check-every", "3"])
    job = training.submit(spec)
    info = training.wait_finished(job, 240)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    assert [v["status"] for v in training.supervisor_events(evts, "preflight")] == ["passed"]
    assert [(d["cause"], d["action"], d["node"]) for d in training.supervisor_events(evts, "decision")] == [
        ("sdc", "restart", "node2"), ("completed", "complete", None)]
    assert [(e["step"], e["node"]) for e in training.trainer_events(evts, "sdc")] == [(6, "node2")]
    assert training.trainer_events(evts, "resumed")[0]["step"] == 4
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_e_without_a_spare_the_job_requeues_without_the_named_node(cluster, workdir, reference_run, monkeypatch):
    """Two nodes and no spare: node2's canary misses the float64 reference (two devices have no
    majority), so it is named; the job requeues excluding it and trains on node1 and node3."""
    monkeypatch.setenv(CANARY_FAULT_ENV, "node2")
    spec = training.fault_spec(workdir, "pf-requeue", preflight=True)
    job = training.submit(spec)
    info = training.wait_finished(job, 300)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    assert [(v["status"], v["named"]) for v in training.supervisor_events(evts, "preflight")] == [
        ("failed", ["node2"]), ("passed", [])]
    assert [(d["cause"], d["action"], d["node"]) for d in training.supervisor_events(evts, "decision")] == [
        ("preflight", "requeue", "node2"), ("completed", "complete", None)]
    assert "node2" in slurm.show_job(job)["ExcNodeList"]
    assert training.blamed_reason("node2", job).startswith("slurmtools: CRITICAL preflight.canary node=node2 ")
    starts = training.supervisor_events(evts, "start")
    assert [_expand(s["nodes"]) for s in starts] == [["node1", "node2"], ["node1", "node3"]]
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
