"""The reference trainer with in-memory snapshots on, for real (two gloo ranks of the tiny FSDP
model on this machine, one "node": each rank restores its own copy): a crash at step 7 after the
snapshot of step 6, no persistent checkpoint newer; the restart resumes from the snapshot (the
ledger says so) and ends with the uninterrupted run's exact state hash."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtools.requeue import ledger
from tests.unit.test_flight_recorder import _free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"


def _train(tmp_path: Path, name: str, *args: str, attempt: str = "5.0") -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               SLURMTOOLS_CONTROL_DIR=str(tmp_path / name / "control"), SLURMTOOLS_ATTEMPT_ID=attempt,
               SLURMTOOLS_NODE_LOCAL_DIR=str(tmp_path / "memory"), SLURM_JOB_ID="5")
    argv = [sys.executable, str(EXAMPLE), "--steps", "10", "--checkpoint-every", "100", "--checkpoint-dir",
            str(tmp_path / name / "ckpt"), "--loader-workers", "0", *args]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [proc.communicate(timeout=240) for proc in procs]
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")], outs


def test_a_restart_resumes_from_the_snapshot_with_the_uninterrupted_runs_hash(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "memory").mkdir()
    reference, _ = _train(tmp_path, "reference")
    crashed, outs = _train(tmp_path, "job", "--snapshot-every", "3", "--fail-at-step", "7")
    assert "injected failure at step 7" in outs[0][1]
    again, outs = _train(tmp_path, "job", "--snapshot-every", "3", attempt="5.0.1")
    resumed = [event for event in again if event.get("event") == "resumed"]
    assert [(event["step"], event["path"]) for event in resumed] == [(6, "in-memory snapshot of step 6")]
    final = [event for event in again if event.get("event") == "final"]
    assert final and final[0]["state_sha256"] == [e for e in reference if e.get("event") == "final"][0]["state_sha256"]
    restores = [event for event in ledger.read(tmp_path / "job" / "control") if isinstance(event, ledger.SnapshotRestore)]
    assert [(event.attempt_id, event.step, event.why) for event in restores] == [
        ("5.0", None, "no verified snapshot on the living nodes"), ("5.0.1", 6, "snapshot of step 6")]
