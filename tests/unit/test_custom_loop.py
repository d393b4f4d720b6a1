"""examples/custom_loop, the user guide's custom loop with TrainingControl (docs/trainers.md shows
its lines from this file), run for real: two gloo ranks. A checkpoint request (the supervisor's
marker, as Slurm's warning makes it) stops both ranks at the same step after a sealed checkpoint;
the next run resumes from that checkpoint and trains to the end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from slurmtools.checkpoint import CheckpointManager
from slurmtools.common.control_dir import COMPLETE_FILE, REQUEST_FILE, STOPPED_FILE, standalone_env
from tests.unit.test_flight_recorder import _free_port

pytest.importorskip("torch")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_loop" / "train.py"
STEPS = 20


def _run(tmp_path: Path) -> List[Tuple[int, str, str]]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               **standalone_env(tmp_path / "control", "7.0", tmp_path / "memory"))
    argv = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--checkpoint-every", "100",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--step-sleep-s", "0.1"]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs)]


def test_the_custom_loop_stops_at_a_requested_checkpoint_and_resumes_from_it(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / REQUEST_FILE).write_text("{}")
    first = _run(tmp_path)
    assert [rc for rc, _, _ in first] == [0, 0], first[0][2][-2000:] + first[1][2][-2000:]
    stopped = json.loads((tmp_path / "control" / STOPPED_FILE).read_text())["step"]
    assert 1 <= stopped < STEPS and not (tmp_path / "control" / COMPLETE_FILE).exists()
    latest = CheckpointManager(tmp_path / "ckpt").latest()
    assert latest is not None and latest.step == stopped      # sealed before the ranks stopped
    (tmp_path / "control" / REQUEST_FILE).unlink()
    second = _run(tmp_path)
    assert [rc for rc, _, _ in second] == [0, 0], second[0][2][-2000:] + second[1][2][-2000:]
    assert second[0][1] == f"trained {STEPS} steps on 2 ranks\n"
    assert json.loads((tmp_path / "control" / COMPLETE_FILE).read_text())["step"] == STEPS
    assert [c.step for c in CheckpointManager(tmp_path / "ckpt").complete()] == [STEPS, stopped]
