"""The reference trainer beats from its start: a rank that waits for its group (its peers not
there yet, or a replacement started in place while its generation forms) is alive to the
supervisor, and a node whose ranks wait is never taken for a dead one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtools.common.control_dir import COLLECTIVE_TIMEOUT_ENV, CONTROL_DIR_ENV, HEARTBEAT_DIR
from tests.conftest import REPO
from tests.unit.test_flight_recorder import _free_port

TRAIN = REPO / "examples" / "tiny_fsdp" / "train.py"
JOIN_TIMEOUT_S = 60


def test_a_rank_whose_peers_never_come_beats_in_its_joining_phase(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("SLURM", "SLURMTOOLS_", "LOCAL_RANK", "TORCHELASTIC"))}
    env.update({CONTROL_DIR_ENV: str(tmp_path), COLLECTIVE_TIMEOUT_ENV: str(JOIN_TIMEOUT_S), "RANK": "1",
                "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    beat = tmp_path / HEARTBEAT_DIR / "1.json"
    rank = subprocess.Popen([sys.executable, str(TRAIN), "--steps", "2"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        began = time.time()
        while not beat.exists() and rank.poll() is None and time.time() - began < JOIN_TIMEOUT_S - 10:
            time.sleep(0.2)
        assert rank.poll() is None, rank.communicate()[1]
        assert beat.exists(), "no heartbeat while the rank waited for its group"
        first = later = json.loads(beat.read_text())
        waited = time.time()                     # the keep-alive thread's interval is 1 s
        while later["alive"] <= first["alive"] and rank.poll() is None and time.time() - waited < 30:
            time.sleep(0.2)
            later = json.loads(beat.read_text())
    finally:
        rank.kill()
        rank.communicate()
    assert (first["rank"], first["step"], first["phase"]) == (1, 0, "joining")
    assert first["phase_until"] - first["phase_t"] == pytest.approx(JOIN_TIMEOUT_S, abs=0.01)
    assert later["phase"] == "joining" and later["alive"] > first["alive"]      # still waiting, still alive
