"""Fault tests on the real mini-cluster, each compared with the uninterrupted reference run.

a time-limit warning, b a person's requeue, c node kill mid-step, d node kill during a
checkpoint write, e corrupted newest checkpoint, f a hung rank, g a user bug, h a repeating failure,
k the checkpoint file system full during a save, l a GPU fault (an XID through NVML's event API),
m a hang past the node-memory sweep age, restored from the in-memory snapshot, n a requeue whose
save outlasts Slurm's KillWait. Those with a signal to forward (a, b, n, the cancels) and the
node, host and hang faults of c, f and j run under torchrun; the others under srun (training.fault_spec).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.slurm import drain, commands as slurm
from slurmtools.train import node_sweep
from tests.cluster import training
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster


def _our_jobs():
    out = slurm.run_slurm(["squeue", "-h", "-o", "%i"])
    return [int(x) for x in out.split()]


def attempts(evts):
    return [e["attempt_id"] for e in training.supervisor_events(evts, "start")]


def assert_zero_steps_lost(evts):
    """Every stop-for-requeue at step k is followed by a resume at step k."""
    stops = [e["step"] for e in training.trainer_events(evts, "stopped_for_requeue")]
    resumes = [e["step"] for e in training.trainer_events(evts, "resumed")]
    assert stops and resumes[:len(stops)] == stops, (stops, resumes)


def test_a_time_limit_warning_checkpoints_requeues_and_completes(workdir, reference_run):
    # The warning 30 s ahead. Slurm checks time limits every 30 s and may warn up to 60 s early --
    # or not at all, when it lands during the prolog or the script's start-up (seen in CI: that
    # attempt ended TIMEOUT). The supervisor's own clock warns at the lead's time left when Slurm's
    # did not come (slurmtools.requeue.deadline).
    # This is the suite's one test that waits for Slurm's real time limit. With --time=2 and a 30-s lead
    # the warning lands 30 to 90 s after the start (the clock's at 90 s), so an attempt trains for a
    # minute on average where --time=1 left it 0 to 30 s (1.5-s steps made 10 attempts: 597 s); 20 steps
    # of 5 s and the start-up cannot finish within 90 s, so the first attempt is always warned.
    spec = training.training_spec(workdir, "timelimit", extra=["--step-sleep-s", "5"], time_limit_min=2,
                                  requeue={"warning_lead_s": 30, "checkpoint_grace_s": 20})
    job = training.submit(spec)
    info = training.wait_finished(job, 600)     # attempts of up to ~100 s, each many steps further
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    assert decisions[-1]["cause"] == "completed"
    assert {d["cause"] for d in decisions[:-1]} == {"preempted"} and len(decisions) >= 2
    assert all(not d.get("exclude") for d in decisions)
    assert_zero_steps_lost(evts)
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert training.leftover_trainers(job) == []


def _requeued_after_step_6(spec, timeout_s: float):
    """Submit, requeue the job as a person would once it reached step 6, wait for its completion:
    (job, its events, (cause, counted) of each attempt's end in its ledger)."""
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    training.requeue(job)
    info = training.wait_finished(job, timeout_s)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    ends = ledger.read(control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job)))
    return job, evts, [(e.cause, e.counted) for e in ends if isinstance(e, ledger.AttemptEnd)]


# not on every release: a requeue through Slurm is there in test_c (the supervisor's own) and in the
# notebook's requeue test (a person's, through submitit)
def test_b_requeue_by_a_person_checkpoints_and_resumes(workdir, reference_run):
    # the data loader's worker processes on (the suite's other jobs load in the main process): a
    # resumed loader with workers ends on the same state as the uninterrupted run without them
    spec = training.training_spec(workdir, "preempt", extra=["--step-sleep-s", "0.5"], loader_workers=2)
    job, evts, ends = _requeued_after_step_6(spec, 240)
    # the ledger, the durable record: the supervisor records the preemption once the ranks stopped,
    # and should Slurm's SIGKILL (KillWait after the requeue's SIGTERM) still come first, the next
    # attempt records it from the ranks' stopped marker (R46)
    assert ends == [("preempted", False), ("completed", False)]
    assert_zero_steps_lost(evts)
    assert attempts(evts) == [f"{job}.0", f"{job}.1"]
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert training.leftover_trainers(job) == []


def _kill_second_node(cluster, job: int) -> str:
    from ClusterShell.NodeSet import NodeSet
    nodes = list(NodeSet(slurm.job_state(job).nodes))
    victim = nodes[1]
    faults.kill_node(cluster, victim)
    return victim


def _restore(cluster, node: str) -> None:
    faults.restart_node(cluster, node)

    def back():
        training.lift_blame_drains()          # the dead node's blame, if the job reported one
        return training.all_idle() or _our_jobs()
    wait_for(back, 60, f"{node} back")


def _kill_node_and_finish(cluster, spec, job: int):
    """Kill the job's second node, wait for the job to end, bring the node back; (events, victim)."""
    victim = _kill_second_node(cluster, job)
    try:
        info = training.wait_finished(job, 300)
    finally:
        _restore(cluster, victim)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    assert training.leftover_trainers(job) == []
    return evts, victim


@pytest.mark.every_release
def test_c_node_killed_mid_step_requeues_without_it_and_resumes(cluster, workdir, reference_run):
    spec = training.training_spec(workdir, "nodekill", extra=["--step-sleep-s", "0.5"])
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    evts, victim = _kill_node_and_finish(cluster, spec, job)
    starts = training.supervisor_events(evts, "start")
    assert len(starts) == 2 and victim not in _expand(starts[1]["nodes"])
    resumed = training.trainer_events(evts, "resumed")
    assert resumed and resumed[0]["step"] in (4, 8)
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    records = (Path(spec.checkpoint_dir) / ".slurmtools" / str(job) / "ledger.jsonl").read_text()
    assert '"cause": "node_failure"' in records


def _expand(nodes: str):
    from ClusterShell.NodeSet import NodeSet
    return list(NodeSet(nodes))


def test_d_node_killed_during_checkpoint_write_ignores_the_partial_one(cluster, workdir, reference_run):
    # the slow-commit hook pauses a blocking save (an async one's shards are written in the background)
    spec = training.fault_spec(workdir, "ckptkill", extra=["--no-async-checkpoint", "--slow-checkpoint-at", "8",
                                                           "--slow-checkpoint-s", "120"])
    job = training.submit(spec)
    staging = Path(spec.checkpoint_dir) / "step_8.tmp"
    wait_for(lambda: staging.is_dir() and (staging / ".metadata").exists(), 120, "the step-8 shards to be written")
    evts, _ = _kill_node_and_finish(cluster, spec, job)
    assert training.trainer_events(evts, "resumed")[0]["step"] == 4
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_e_corrupted_newest_checkpoint_falls_back_to_the_previous(workdir, reference_run):
    first = training.fault_spec(workdir, "corrupt-a", steps=8)
    job = training.submit(first)
    assert training.wait_finished(job, 180).state == "COMPLETED", training.describe(first, job)
    shard = max((Path(first.checkpoint_dir) / "step_8").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    second = training.fault_spec(workdir, "corrupt-b")
    job2 = training.submit(second)
    assert training.wait_finished(job2, 180).state == "COMPLETED", training.describe(second, job2)
    evts = training.events(second, job2)
    # the supervisor checks completeness (names and sizes) only: the ranks' verification of their
    # shares refuses step 8 and they load step 4
    assert training.supervisor_events(evts, "start")[0]["resume_step"] == 8
    assert training.trainer_events(evts, "resumed")[0]["step"] == 4
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert any(p.name.startswith("step_8.bad-") for p in Path(first.checkpoint_dir).iterdir())


HANG_TIMEOUT_S = 15   # a loaded 2-core machine (two lanes) can take 10 s over a step and its checkpoint
HANG_MARGIN_S = 5   # poll interval (0.5 s) + heartbeat write cadence + a loaded 2-core machine


def test_f_hung_rank_is_killed_requeued_and_its_node_excluded(workdir, reference_run):
    spec = training.training_spec(workdir, "hang", extra=["--hang-at-step", "1:6", "--step-sleep-s", "0.2"],
                                  requeue={"hang_timeout_s": HANG_TIMEOUT_S})
    job = training.submit(spec)
    try:
        info = training.wait_finished(job, 300)
        evts = training.events(spec, job)
        assert info.state == "COMPLETED", training.describe(spec, job)
        hang = training.supervisor_events(evts, "hang")
        assert len(hang) == 1 and hang[0]["rank"] == 1 and hang[0]["step"] == 5  # its last announced step
        assert HANG_TIMEOUT_S <= hang[0]["idle_s"] <= HANG_TIMEOUT_S + HANG_MARGIN_S
        node = hang[0]["host"]
        decision = training.supervisor_events(evts, "decision")[0]
        assert (decision["cause"], decision["exclude"], decision["drain"]) == ("hang", node, node)
        starts = training.supervisor_events(evts, "start")
        assert node in _expand(starts[0]["nodes"]) and node not in _expand(starts[1]["nodes"])
        reason = training.blamed_reason(node, job)
        assert reason.startswith("slurmtools: CRITICAL job.hang no heartbeat from rank 1 "), reason
        assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
        assert training.leftover_trainers(job) == []     # the hung rank was killed, not orphaned
    finally:
        for n in slurm.nodes():
            if n.drained and drain.is_ours(n.reason):
                drain.resume(n.name)


def test_g_user_bug_stops_after_one_attempt(workdir):
    spec = training.fault_spec(workdir, "userbug", extra=["--fail-at-step", "0"])
    job = training.submit(spec)
    info = training.wait_finished(job, 120)
    evts = training.events(spec, job)
    assert info.state == "FAILED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    assert [(d["cause"], d["action"]) for d in decisions] == [("user_error", "stop")]
    assert attempts(evts) == [f"{job}.0"]
    assert "slurmtools: STOP after attempt" in training.stderr(spec, job)
    assert "injected failure at step 0" in training.stderr(spec, job)


def test_i_a_second_crash_long_after_the_first_goes_on(workdir, reference_run):
    """A crash at step 6 (checkpoint 4), and on the restart another at step 14 (checkpoints 8 and
    12 between): two separate failures, not the same one twice in a row; the job completes."""
    spec = training.fault_spec(workdir, "twocrash", extra=["--fail-at-step", "6", "--fail-again-at-step", "14",
                                                           "--no-async-checkpoint"])
    job = training.submit(spec)
    info = training.wait_finished(job, 240)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    assert [(d["cause"], d["action"]) for d in decisions] == [("crash", "restart"), ("crash", "restart"),
                                                             ("completed", "complete")]
    assert [d["checkpoint_step"] for d in decisions[:2]] == [4, 12]
    assert [e["step"] for e in training.trainer_events(evts, "resumed")] == [4, 12]
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]


def test_j_the_batch_host_killed_requeues_resumes_and_blames_it(cluster, workdir, reference_run):
    """The batch host (rank 0, the rendezvous, the supervisor) dies: Slurm requeues the batch
    script once it marks the node down; the next run resumes from the newest complete checkpoint
    on the other nodes, and its supervisor blames the dead host (drained by the root path)."""
    spec = training.training_spec(workdir, "hostkill", extra=["--step-sleep-s", "0.5"])
    job = training.submit(spec)
    training.wait_step(spec, job, 6)
    host = _expand(slurm.job_state(job).nodes)[0]
    faults.kill_node(cluster, host)
    try:
        info = training.wait_finished(job, 300)
        reason = training.blamed_reason(host, job)
    finally:
        _restore(cluster, host)
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    starts = training.supervisor_events(evts, "start")
    assert len(starts) == 2 and host not in _expand(starts[1]["nodes"]), starts
    assert training.trainer_events(evts, "resumed")[0]["step"] in (4, 8)
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert reason.startswith(f"slurmtools: CRITICAL job.node_failure node {host} went down under attempt {job}.0,"), \
        reason
    assert training.leftover_trainers(job) == []


def test_cancel_by_a_person_stops_without_requeue(workdir):
    spec = training.training_spec(workdir, "cancel", extra=["--step-sleep-s", "0.5"])
    job = training.submit(spec)
    training.wait_step(spec, job, 3)
    training.cancel(job)
    info = training.wait_finished(job, 60)
    assert info.state == "CANCELLED"
    # Slurm says CANCELLED at once (24.11 before the batch step has ended): the supervisor records
    # it as soon as the ranks stopped, before srun ends (R48: a record made after srun's end was
    # lost to Slurm's SIGKILL KillWait after the cancel, on a loaded machine); a record that never
    # comes still fails here
    ledger = Path(spec.checkpoint_dir) / ".slurmtools" / str(job) / "ledger.jsonl"
    records = wait_for(lambda: '"cause": "cancelled"' in ledger.read_text() and ledger.read_text(), 60,
                       "the supervisor's record of the cancel")
    assert '"action": "stop"' in records
    assert slurm.job_state(job).restarts == 0
    assert training.leftover_trainers(job) == []


def test_a_graceful_cancel_checkpoints_then_ends_cancelled_without_requeue(workdir):
    from slurmtools import cli
    from tests.cluster import asuser
    spec = training.training_spec(workdir, "graceful", extra=["--step-sleep-s", "0.5", "--checkpoint-every", "1000"])
    job = training.submit(spec)
    training.wait_step(spec, job, 3)
    assert asuser.call(cli.main, ["cancel", "--graceful", str(job)]) == 0      # by its user, as they would
    info = training.wait_finished(job, 120)
    evts = training.events(spec, job)
    assert info.state == "CANCELLED", training.describe(spec, job)
    ends = [e for e in ledger.read(control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job)))
            if isinstance(e, ledger.AttemptEnd)]
    assert [(e.cause, e.counted, e.action, e.reason) for e in ends] == [
        ("cancelled", False, "stop", "cancelled: its user asked it to checkpoint and stop: checkpointed first")]
    stopped = [e["step"] for e in training.trainer_events(evts, "stopped_for_requeue")]
    latest = CheckpointManager(spec.checkpoint_dir).latest()
    assert len(stopped) == 1 and latest is not None and latest.step == stopped[0] >= 3    # the stop step, saved
    assert slurm.job_state(job).restarts == 0
    assert training.leftover_trainers(job) == []


def test_h_repeating_failure_stops_at_the_budget(workdir):
    spec = training.fault_spec(workdir, "repeat", extra=["--fail-at-step", "6", "--faults-on-attempt", "-1"],
                               requeue={"max_restarts": 2, "max_consecutive_failures": 10,
                                        "no_progress_restarts": 10})
    job = training.submit(spec)
    info = training.wait_finished(job, 300)
    evts = training.events(spec, job)
    assert info.state == "FAILED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    # restarts in place (new steps, no requeue) and requeues share the budget
    assert [(d["cause"], d["action"]) for d in decisions] == [("crash", "restart"), ("crash", "restart"),
                                                             ("crash", "stop")]
    assert attempts(evts) == [f"{job}.0", f"{job}.0.1", f"{job}.0.2"]
    assert slurm.job_state(job).restarts == 0
    assert "restart budget spent (2 failures within 6 h)" in decisions[-1]["reason"]
    assert CheckpointManager(spec.checkpoint_dir).latest().step == 4
    assert training.leftover_trainers(job) == []


def test_k_the_checkpoint_file_system_full_during_a_save_training_goes_on(workdir, reference_run):
    """The checkpoints live on a size-limited file system every node sees (tests.conftest's small
    tmpfs) that something else fills up just before the step-8 save: that save fails with a
    clear event, training goes on, the step-4 checkpoint stays the newest complete one; once the
    space is back the later saves succeed and the job ends with the uninterrupted run's hash."""
    import os
    import shutil

    from tests.cluster import asuser
    from tests.conftest import SMALL_FS_DIR

    ckpt = SMALL_FS_DIR / "fsfull"
    ckpt.mkdir()
    os.chown(ckpt, asuser.user().uid, asuser.user().gid)
    filler = SMALL_FS_DIR / "filler"
    try:
        spec = training.fault_spec(workdir, "fsfull", extra=["--step-sleep-s", "2"], checkpoint_dir=str(ckpt))
        job = training.submit(spec)
        wait_for(lambda: getattr(CheckpointManager(ckpt).latest(), "step", None) == 4, 120,
                 "the step-4 checkpoint (async: committed a step or so later)", interval_s=0.2)
        assert training.max_step(spec, job) < 7, "too late to fill the file system before the step-8 save"
        free = os.statvfs(ckpt)
        filler.write_bytes(b"\0" * max(0, free.f_bavail * free.f_frsize - 200_000))
        wait_for(lambda: training.trainer_events(training.events(spec, job), "checkpoint_failed"), 60,
                 "the step-8 save to fail", interval_s=0.3)
        filler.unlink()
        info = training.wait_finished(job, 240)
        evts = training.events(spec, job)
        assert info.state == "COMPLETED", training.describe(spec, job)
        failed = training.trainer_events(evts, "checkpoint_failed")
        assert [e["step"] for e in failed] == [8] and "No space left on device" in failed[0]["error"]
        assert len(training.supervisor_events(evts, "start")) == 1
        assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
        assert [c.step for c in CheckpointManager(ckpt).complete()] == [20, 16]
    finally:
        filler.unlink(missing_ok=True)
        shutil.rmtree(ckpt, ignore_errors=True)


def test_l_a_gpu_fault_names_its_node_which_is_drained_and_replaced_by_the_spare(workdir, reference_run):
    """XID 79 (fallen off the bus) on the second node's GPU 0 -- NVML's event, through its fixture
    seam named in the spec -- and then that node's rank dies (SIGKILL, as the fault ends a CUDA
    process): the step failed because of the node, not the job. Its local rank 0 saw the event and
    wrote it into the control dir at once; the supervisor blames the node with the XID (drained by
    the root path), the spare takes its place without a requeue, and the run ends with the
    uninterrupted hash. Without the event this is a crash, counted, restarted on the same node."""
    fixture = workdir / "gpu-events.jsonl"
    fixture.write_text("")
    spec = training.fault_spec(workdir, "gpufault", extra=["--step-sleep-s", "0.5"],
                               requeue={"spare_nodes": 1}, distributed={"gpu_events": f"fixture:{fixture}"})
    job = training.submit(spec)
    training.wait_step(spec, job, 5)
    started = training.supervisor_events(training.events(spec, job), "start")
    victim = _expand(started[0]["nodes"])[1]
    with open(fixture, "a") as out:
        out.write(json.dumps({"host": victim, "gpu": 0, "xid": 79}) + "\n")
    record = control_dir_for(spec.checkpoint_dir, spec.output_dir, str(job)) / "gpu-events" / f"node-{victim}.json"
    wait_for(record.exists, 30, f"{victim}'s XID in the control dir")
    assert training.kill_ranks_on(job, victim)
    try:
        info = training.wait_finished(job, 300)
        reason = training.blamed_reason(victim, job)
    finally:
        training.lift_blame_drains()
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    assert [(d["cause"], d["action"], d["node"]) for d in decisions] == [
        ("gpu_fatal", "restart", victim), ("completed", "complete", None)]
    starts = training.supervisor_events(evts, "start")
    assert len(starts) == 2 and victim not in _expand(starts[1]["nodes"]), starts
    assert reason.startswith(f"slurmtools: CRITICAL job.gpu_fatal xid=79 on GPU 0 of {victim} (reboot-class"), reason
    assert slurm.job_state(job).restarts == 0
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert training.leftover_trainers(job) == []


def test_m_a_hang_past_the_node_memory_sweep_age_restores_from_the_snapshot(workdir, reference_run, monkeypatch):
    """Snapshots every step and no checkpoint before the end; rank 1 hangs before step 6 and is found
    after HANG_TIMEOUT_S, far past the node-memory sweep age set for this job (1 s: the rule, not
    the default 600 s, is what is tested; SLURMTOOLS_NODE_SWEEP_AFTER_S). The restart on the spare
    sweeps node memory as every launch does; the snapshots are a live job's and stay (a sweep by
    age alone took `snapshots/` with them and the run began again at step 0), and the run resumes
    from the newest one, rank 1's state pulled from its replica, ending with the uninterrupted hash."""
    monkeypatch.setenv(node_sweep.SWEEP_AFTER_ENV, "1")
    spec = training.fault_spec(workdir, "hangsnap",
                               extra=["--hang-at-step", "1:6", "--step-sleep-s", "0.2", "--checkpoint-every", "100"],
                               requeue={"hang_timeout_s": HANG_TIMEOUT_S, "spare_nodes": 1},
                               distributed=training.SNAPSHOTS_EVERY_STEP)
    job = training.submit(spec)
    try:
        info = training.wait_finished(job, 300)
    finally:
        training.lift_blame_drains()
    evts = training.events(spec, job)
    assert info.state == "COMPLETED", training.describe(spec, job)
    decisions = training.supervisor_events(evts, "decision")
    assert [(d["cause"], d["action"]) for d in decisions] == [("hang", "restart"), ("completed", "complete")]
    assert training.supervisor_events(evts, "hang")[0]["idle_s"] >= HANG_TIMEOUT_S > 1
    resumed = training.trainer_events(evts, "resumed")
    assert len(resumed) == 1 and resumed[0]["step"] >= 4, resumed
    assert resumed[0]["path"] == f"in-memory snapshot of step {resumed[0]['step']}, ranks 1 pulled from their replicas"
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert training.leftover_trainers(job) == []


def test_n_a_requeue_whose_save_outlasts_killwait_is_a_preemption_resumed_from_the_stop_steps_snapshot(
        workdir, reference_run):
    """A person's requeue after step 6 while the requested save takes 30 s longer than it should,
    past Slurm's KillWait (10 s here, 30 s by default; a save of hundreds of GB at scale): Slurm
    SIGKILLs the batch script and the ranks mid-save. The SIGTERM was recorded in the control dir
    the moment it came, before any save, so the next run records that attempt as preempted, not
    counted (without the record: a counted crash, and two of them with no newer checkpoint stopped
    the job). Before the save the ranks kept the step they stopped at in node memory (snapshots on,
    none due: every 100 steps), so the next run, on the same two nodes (pinned), resumes from that
    snapshot, not from the older checkpoint, to the uninterrupted run's hash."""
    spec = training.training_spec(workdir, "slowterm", extra=["--step-sleep-s", "0.5", "--slow-requested-checkpoint"],
                                  nodelist="node[1-2]",
                                  distributed=dict(training.SNAPSHOTS_EVERY_STEP, snapshot_every_steps=100))
    job, evts, ends = _requeued_after_step_6(spec, 300)
    assert ends == [("preempted", False), ("completed", False)]
    assert training.trainer_events(evts, "stopped_for_requeue") == []        # killed inside its save
    kept = training.trainer_events(evts, "snapshot_before_save")
    assert len(kept) == 1 and kept[0]["kept"] is True and kept[0]["step"] >= 6, kept
    resumed = training.trainer_events(evts, "resumed")
    assert [(r["step"], r["path"]) for r in resumed] == [
        (kept[0]["step"], f"in-memory snapshot of step {kept[0]['step']}")], resumed
    assert slurm.job_state(job).restarts == 1
    assert training.trainer_events(evts, "final")[-1]["state_sha256"] == reference_run["hash"]
    assert training.leftover_trainers(job) == []
