"""The reference trainer with in-memory snapshots on, for real (two gloo ranks of the tiny FSDP
model on this machine, one "node": each rank restores its own copy): a crash at step 7 after the
snapshot of step 6, no persistent checkpoint newer; the restart resumes from the snapshot (the
ledger says so) and ends with the uninterrupted run's exact state hash; after silent data
corruption the snapshot is not restored."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import SNAPSHOT_MAX_OVERHEAD_ENV, standalone_env
from slurmtools.snapshot.rules import SNAPSHOTS_SUBDIR, job_key
from tests.unit.test_flight_recorder import _free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"


def _train(tmp_path: Path, name: str, *args: str, attempt: str = "5.0") -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               **standalone_env(tmp_path / name / "control", attempt, tmp_path / "memory"),
               # every 3 steps exactly: the default bound (1% of training time) would space these tiny
               # steps' snapshots out (test_snapshot_gloo.py tests the bound)
               **{SNAPSHOT_MAX_OVERHEAD_ENV: "0"})
    argv = [sys.executable, str(EXAMPLE), "--steps", "10", "--checkpoint-every", "100", "--checkpoint-dir",
            str(tmp_path / name / "ckpt"), "--loader-workers", "0", *args]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [proc.communicate(timeout=240) for proc in procs]
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")], outs


@pytest.fixture(scope="module")
def crashed_once(tmp_path_factory):
    """The uninterrupted run's hash, and a run that crashed at step 7 after the snapshot of step 6
    (its control dir and node memory), made once for the module's tests."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("snapshot-trainer")
    (base / "memory").mkdir()
    reference, _ = _train(base, "reference")
    crashed, outs = _train(base, "job", "--snapshot-every", "3", "--fail-at-step", "7")
    assert "injected failure at step 7" in outs[0][1]
    return [e for e in reference if e.get("event") == "final"][0]["state_sha256"], base


@pytest.fixture
def crashed(crashed_once, tmp_path):
    """A copy of the crashed run's files, this test's own to restart from."""
    reference_hash, base = crashed_once
    shutil.copytree(base / "job", tmp_path / "job", symlinks=True)
    shutil.copytree(base / "memory", tmp_path / "memory", symlinks=True)
    # the snapshots' directory is named by the job and its control dir (snapshot.job_key): the copy's
    for old in (tmp_path / "memory").glob(f"*/{SNAPSHOTS_SUBDIR}/{job_key('5', base / 'job' / 'control')}"):
        old.rename(old.with_name(job_key("5", tmp_path / "job" / "control")))
    return reference_hash, tmp_path


def _restores(tmp_path: Path) -> list:
    return [(event.attempt_id, event.step, event.why) for event in ledger.read(tmp_path / "job" / "control")
            if isinstance(event, ledger.SnapshotRestore)]


def test_a_restart_resumes_from_the_snapshot_with_the_uninterrupted_runs_hash(crashed):
    reference_hash, tmp_path = crashed
    again, outs = _train(tmp_path, "job", "--snapshot-every", "3", attempt="5.0.1")
    resumed = [event for event in again if event.get("event") == "resumed"]
    assert [(event["step"], event["path"]) for event in resumed] == [(6, "in-memory snapshot of step 6")]
    final = [event for event in again if event.get("event") == "final"]
    assert final and final[0]["state_sha256"] == reference_hash
    assert _restores(tmp_path) == [
        ("5.0", None, "no verified snapshot on the living nodes"), ("5.0.1", 6, "snapshot of step 6")]
    assert not list((tmp_path / "memory").glob("*/snapshots/*/*"))      # completed: node memory freed


def test_after_silent_data_corruption_no_snapshot_is_restored(crashed):
    """The attempt ended in SDC (as the supervisor records it): the snapshot of step 6 may hold the
    corruption (the canary checks before every checkpoint, not before every snapshot), so the
    restart does not restore it; with no checkpoint it starts afresh, to the same hash."""
    reference_hash, tmp_path = crashed
    ledger.append(tmp_path / "job" / "control", ledger.AttemptEnd("5.0", 0.0, "sdc", counted=True, action="restart"))
    again, outs = _train(tmp_path, "job", "--snapshot-every", "3", attempt="5.0.1")
    assert not [event for event in again if event.get("event") == "resumed"], outs[0][1][-2000:]
    final = [event for event in again if event.get("event") == "final"]
    assert final and final[0]["state_sha256"] == reference_hash
    assert _restores(tmp_path)[-1] == ("5.0.1", None, "the attempt before ended in silent data corruption: "
                                                       "a snapshot since the last check may hold it")


def test_a_stop_whose_save_is_cut_short_resumes_from_the_snapshot_of_the_stop_step(crashed_once, tmp_path):
    """Slurm's SIGTERM after step 4 (a preemption), snapshots every 100 steps (none due), no
    checkpoint but the final: the ranks keep the step they stop at in node memory, sealed and
    replicated, before the persistent save; that save outlasts KillWait (paused, then SIGKILLed as
    Slurm does). The restart resumes from that snapshot, not from step 0, to the uninterrupted
    hash. Without the snapshot first, the state since the last checkpoint was lost."""
    reference_hash, _ = crashed_once
    (tmp_path / "memory").mkdir()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               **standalone_env(tmp_path / "job" / "control", "5.0", tmp_path / "memory"), **{SNAPSHOT_MAX_OVERHEAD_ENV: "0"})
    argv = [sys.executable, str(EXAMPLE), "--steps", "10", "--checkpoint-every", "100", "--checkpoint-dir",
            str(tmp_path / "job" / "ckpt"), "--loader-workers", "0", "--snapshot-every", "100",
            "--step-sleep-s", "0.3", "--slow-requested-checkpoint", "--slow-checkpoint-s", "120"]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for rank in range(2)]
    seen = []
    try:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:
            if line.startswith("{"):
                seen.append(json.loads(line))
            if seen and seen[-1].get("step") == 4 and "event" not in seen[-1]:
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
            if seen and seen[-1].get("event") == "snapshot_before_save":
                break
    finally:
        for proc in procs:          # KillWait is over: Slurm's SIGKILL, mid-save
            proc.kill()
            proc.communicate(timeout=60)
    stop = [event for event in seen if event.get("event") == "snapshot_before_save"]
    assert len(stop) == 1 and stop[0]["kept"] is True and stop[0]["step"] >= 4, seen
    assert not [event for event in seen if event.get("event") == "checkpoint"]      # cut short
    again, outs = _train(tmp_path, "job", "--snapshot-every", "100", attempt="5.1")
    resumed = [(event["step"], event["path"]) for event in again if event.get("event") == "resumed"]
    assert resumed == [(stop[0]["step"], f"in-memory snapshot of step {stop[0]['step']}")], outs[0][1][-2000:]
    final = [event for event in again if event.get("event") == "final"]
    assert final and final[0]["state_sha256"] == reference_hash
