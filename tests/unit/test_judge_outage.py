"""A node the supervisor's own watch found dead is judged without asking the controller for the
nodes' states (the controller may be down: the fault matrix's outage test waited ~80 s for that
query's retries before deciding). With a warning as well, Slurm's view can change the verdict
(a warned step whose nodes are up was preempted), so it is asked."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Dict, List

import pytest

from slurmtools.common.signals import SignalFlags
from slurmtools.requeue import judge, policy, progress, slurm_view
from slurmtools.spec import RequeueSpec


@pytest.fixture
def asked(monkeypatch) -> List[str]:
    calls: List[str] = []

    def node_states(nodelist: str) -> Dict[str, str]:
        calls.append(nodelist)
        return {"node2": "down"}
    monkeypatch.setattr(slurm_view, "node_states", node_states)
    return calls


def _evidence(tmp_path: Path, flags: SignalFlags) -> policy.Evidence:
    requeue = RequeueSpec()
    config = judge.SupervisorConfig(requeue=requeue, control_dir=tmp_path / "control")
    (tmp_path / "control").mkdir()
    attempt = judge.Attempt(job_id=None, restart=0, attempt_id="7.0", nodelist="node[1-2]")
    watch = judge.Watch(killed_by_us=True, dead_node="node2", dead_detail="node node2: every rank silent")
    inferred = progress.ProgressWatch.start(requeue.progress_checkpoints, requeue.progress_checkpoint_marker,
                                            requeue.progress_log_pattern, tmp_path)
    evidence, _ = judge.evidence(config, attempt, watch, flags, "", None, inferred)
    return evidence


def test_a_node_found_dead_by_the_watch_is_judged_without_the_controller(tmp_path, asked):
    evidence = _evidence(tmp_path, SignalFlags())
    assert asked == [] and evidence.node_states == {}
    diagnosis = policy.classify(evidence)
    assert (diagnosis.cause, diagnosis.node) == (policy.Cause.NODE_FAILURE, "node2")


def test_with_a_warning_too_the_controller_is_asked(tmp_path, asked):
    flags = SignalFlags()
    flags._handler(signal.SIGUSR1, None)      # as the installed handler records the warning
    evidence = _evidence(tmp_path, flags)
    assert asked == ["node[1-2]"] and evidence.node_states == {"node2": "down"}
