"""After the job gave a dead node back (it shrank), a requeue Slurm starts itself (a preemption,
an admin's requeue, the batch host dying) keeps the shrunk node count: the run went on with fewer
training nodes and its snapshots no longer matched. The job's count at its first run (recorded in
the control dir) keeps the training nodes; a shrunk allocation that cannot hold them requeues
itself asking its full count again, not counted."""
from __future__ import annotations

import signal

from slurmtools.common.signals import SignalFlags
from slurmtools.requeue import actions, step
from slurmtools.requeue.topology import shrunk_below_training, topology_of
from slurmtools.slurm import commands as slurm
from slurmtools.spec import RequeueSpec

NODES = [f"node{n}" for n in range(1, 6)]


def test_training_nodes_come_from_the_jobs_asked_count_not_a_shrunk_allocation():
    spares = RequeueSpec(spare_nodes=2)
    full = topology_of(NODES + ["node6"], spares, job_nodes=6)
    assert full.train_nodes == 4 and full.pick(()) == NODES[:4]
    shrunk = topology_of(NODES, spares, job_nodes=6)                 # one dead node given back
    assert shrunk.train_nodes == 4 and shrunk.spares(()) == ["node5"]  # one spare fewer, as many training nodes
    assert not shrunk_below_training(shrunk, 6)
    gone = topology_of(NODES[:3], spares, job_nodes=6)               # both spares used, a third node given back
    assert gone.pick(()) is None and shrunk_below_training(gone, 6)
    # without the count (an older script): the allocation's size, as before
    assert topology_of(NODES[:3], spares).train_nodes == 1


def test_min_nodes_lets_a_shrunk_allocation_train_on_fewer():
    allowed = topology_of(NODES[:3], RequeueSpec(spare_nodes=1, min_nodes=2), job_nodes=5)
    assert allowed.pick(()) == NODES[:3] and not shrunk_below_training(allowed, 5)


def test_regrow_requeues_asking_the_full_count_and_waits_for_slurm(monkeypatch):
    asked = []
    monkeypatch.setattr(slurm, "requeue_excluding", lambda job_id, fields: asked.append((job_id, dict(fields))))
    flags = SignalFlags()
    flags._handler(signal.SIGTERM, None)                # Slurm ends the run at once
    assert actions.regrow(7, "7.1", 6, flags) == 0
    assert asked == [(7, {"NumNodes": "6"})]


def test_a_refused_regrow_is_one_line_and_exit_1(monkeypatch, capsys):
    def refuse(job_id, fields):
        raise slurm.SlurmCommandError(["scontrol"], 1, "Access/permission denied")
    monkeypatch.setattr(slurm, "requeue_excluding", refuse)
    assert actions.regrow(7, "7.1", 6, SignalFlags()) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slurmtools: requeue of job 7 for its 6 nodes failed:")


def test_the_first_run_records_the_jobs_node_count_and_later_runs_read_it(tmp_path):
    control = tmp_path / ".slurmtools" / "7"
    assert step.job_nodes(control, 130, first_run=True) == 130
    assert step.job_nodes(control, 129, first_run=False) == 130          # Slurm's requeue kept the shrunk 129
    (control / "job-nodes").write_text('{"nodes": true}')
    assert step.job_nodes(control, 129, first_run=False) == 0           # unknown: the allocation decides, as before
    assert step.job_nodes(tmp_path / "none", 129, first_run=False) == 0
