"""The light trainer (examples/light/train.py: no torch, the scale test's) for real on this machine:
it resumes from the newest complete checkpoint, reports through TrainingControl, and a bad fault
flag is a one-line usage error."""
from __future__ import annotations

import json
import re
import socket
import time
import os
import subprocess
import sys
from pathlib import Path

from slurmtools.common.control_dir import ATTEMPT_ID_ENV, CHECKPOINT_DIR_ENV, COMPLETE_FILE, CONTROL_DIR_ENV

LIGHT = Path(__file__).resolve().parents[2] / "examples" / "light" / "train.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{CONTROL_DIR_ENV: str(tmp_path / "control"), CHECKPOINT_DIR_ENV: str(tmp_path / "ckpt"),
                              ATTEMPT_ID_ENV: "9.0", "RANK": "0", "WORLD_SIZE": "1"})
    return subprocess.run([sys.executable, str(LIGHT), "--step-s", "0.01", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_it_trains_checkpoints_and_resumes_from_the_newest_complete_checkpoint(tmp_path):
    first = _run(tmp_path, "--steps", "3", "--checkpoint-every", "2")
    assert first.returncode == 0, first.stderr
    assert [json.loads(line) for line in first.stdout.splitlines()] == [
        {"event": "resumed", "step": 0, "attempt_id": "9.0", "world_size": 1},
        {"event": "final", "step": 3, "attempt_id": "9.0"}]
    assert sorted(path.name for path in (tmp_path / "ckpt").iterdir()) == ["step_2"]
    assert json.loads((tmp_path / "control" / COMPLETE_FILE).read_text())["step"] == 3
    again = _run(tmp_path, "--steps", "5", "--checkpoint-every", "2")
    assert [json.loads(line)["step"] for line in again.stdout.splitlines()] == [2, 5]


def test_a_bad_fault_flag_is_one_line(tmp_path):
    bad = _run(tmp_path, "--slow-node", "node5")
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].endswith("argument --slow-node: not HOST:SECONDS: 'node5'")
    bad = _run(tmp_path, "--stop-rank", "x:3")
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].endswith("argument --stop-rank: not RANK:STEP: 'x:3'")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ranks(tmp_path: Path, steps: str, world: int = 3, *extra: str):
    env = dict(os.environ, **{CONTROL_DIR_ENV: str(tmp_path / "control"), ATTEMPT_ID_ENV: "9.0",
                              "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    return [subprocess.Popen([sys.executable, str(LIGHT), "--step-s", "0.05", "--steps", steps, *extra],
                             env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in range(world)]


def test_ranks_end_each_step_together_and_a_lost_rank_fails_every_rank_in_one_line(tmp_path):
    together = _ranks(tmp_path, "4")
    outs = [proc.communicate(timeout=60) for proc in together]
    assert [proc.returncode for proc in together] == [0, 0, 0], outs
    assert json.loads(outs[0][0].splitlines()[-1]) == {"event": "final", "step": 4, "attempt_id": "9.0"}
    lost = _ranks(tmp_path / "lost", "10000")
    time.sleep(3)
    lost[2].kill()
    outs = [proc.communicate(timeout=60) for proc in lost]
    assert [proc.returncode for proc in lost] == [1, 1, -9]
    assert re.fullmatch(r"train\.py: error: rank 0: step \d+: a rank left the step barrier", outs[0][1].strip())
    assert re.fullmatch(r"train\.py: error: rank 1: step \d+: rank 0 left the step barrier", outs[1][1].strip())


def test_a_stopped_rank_stands_still_and_the_others_wait_for_it(tmp_path):
    """--stop-rank 2:3: rank 2 stops its own process (SIGSTOP) after step 3; the others wait in
    the barrier, their keep-alives going on (the silence the supervisor names: watchdog.silent_rank)."""
    import psutil
    ranks = _ranks(tmp_path, "10000", 3, "--stop-rank", "2:3")
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(ranks[2].pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert psutil.Process(ranks[2].pid).status() == psutil.STATUS_STOPPED
        time.sleep(1)
        assert [proc.poll() for proc in ranks] == [None, None, None]
    finally:
        for proc in ranks:
            proc.kill()
        outs = [proc.communicate(timeout=60) for proc in ranks]
    assert outs[2][1].strip() == "train.py: rank 2: stopping this process at step 3 (--stop-rank)"
