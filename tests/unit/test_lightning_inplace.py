"""PyTorch Lightning recovered in place (slurmtools/integrations/lightning_inplace.py), for real: two
gloo ranks of examples/lightning/train.py (DDP on CPU, a sealed checkpoint every 4 steps). Once
step 4's checkpoint is sealed, rank 1's process is killed (no clean-up). Rank 0 does not exit:
Lightning's fit raises the broken group's error, and the rank waits for the next generation. The
test stands for the supervisor (as tests/unit/test_inplace.py does): it hosts the store, writes
generation 1 and starts a replacement rank 1 straight into it. Rank 0 fits again in the same
process with a new Trainer, both resume and train to the end: from the newest sealed checkpoint with
the job's snapshots off, from the step rank 0 keeps in its memory with them on (every step)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtools.common.control_dir import (CHECKPOINT_DIR_ENV, GENERATION_ENV, INPLACE_ENV, SNAPSHOT_EVERY_ENV,
                                           SNAPSHOT_MAX_OVERHEAD_ENV, standalone_env)
from tests.example_output import resumed_at, steps_said
from tests.unit.test_flight_recorder import _free_port
from tests.unit.test_inplace import LEFT, _Said, _wait_until_said

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
from slurmtools.common import generation  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning" / "train.py"
WORLD = 2
STEPS = 12


def _start(tmp_path: Path, rank: int, port: int, **extra_env: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK="0",
               **standalone_env(tmp_path / "control", "7.0", tmp_path / "memory"),
               **{CHECKPOINT_DIR_ENV: str(tmp_path / "ckpt"), INPLACE_ENV: "1"}, **extra_env)
    argv = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--checkpoint-every", "4", "--step-sleep-s", "0.3"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("snapshot_every", ["0", "1"])
def test_a_lost_rank_of_a_lightning_fit_is_replaced_in_place_and_rank_0_fits_again_in_its_process(tmp_path,
                                                                                                snapshot_every):
    (tmp_path / "memory").mkdir()
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = _free_port()
    # a copy every step however slowly the machine runs: the overhead bound (1 % of a 0.3-s step)
    # stretched the interval on a machine at half pace and rank 0 held step 4 when it said step 6
    # (R126); the bound has its own tests (test_lightning_memory, test_snapshot_plan)
    snapshots = {SNAPSHOT_EVERY_ENV: snapshot_every, SNAPSHOT_MAX_OVERHEAD_ENV: "0"}
    first = _start(tmp_path, 0, port, **snapshots)
    lost = _start(tmp_path, 1, port, **snapshots)
    said = _Said(first)
    deadline = time.monotonic() + 180
    # with snapshots on, past step 4's checkpoint: the step rank 0 keeps in memory is the newer
    while not ((tmp_path / "ckpt" / "step_4").is_dir() and (snapshot_every == "0" or "step 6/" in "".join(said.out))):
        assert time.monotonic() < deadline and first.poll() is None, said.text()[-3000:]
        time.sleep(0.05)
    lost.send_signal(signal.SIGKILL)
    lost.communicate(timeout=60)
    # rank 0 leaves its broken group within seconds and waits for the next generation
    assert _wait_until_said({0: said}, LEFT, 60), said.text()[-3000:]
    assert first.poll() is None
    generation.write(tmp_path / "control", generation.Generation(1, WORLD, "127.0.0.1", store.port))
    replacement = _start(tmp_path, 1, port, **{GENERATION_ENV: "1"}, **snapshots)
    out = said.end(240)
    replacement_out, replacement_err = replacement.communicate(timeout=240)
    assert first.returncode == 0, said.text()[-3000:]
    assert replacement.returncode == 0, replacement_err[-3000:]
    err = said.text()
    assert "the process group of generation 0 broke" in err and "joining generation 1 in place" in err
    resumed = resumed_at(out)
    steps = steps_said(out)
    if snapshot_every == "1":
        # rank 0's copy of the last step it said (its line comes after the callback's copy): every
        # step said once, none trained again; no file was left in the node's memory dir
        assert len(resumed) == 1 and resumed[0] >= 6, out
        assert f"resuming from step {resumed[0]}, held in memory by rank 0" in err, err[-3000:]
        assert steps == list(range(1, STEPS + 1)), out
        assert list((tmp_path / "memory").glob("slurmtools-lightning-*")) == []
        return
    assert len(resumed) == 1 and resumed[0] in (4, 8), out
    # rank 0's one process: the steps before the loss, then from the checkpoint (a step's line comes
    # after the callback's save: the loss during step 4's save leaves step 4 unsaid)
    breaks = [index for index in range(1, len(steps)) if steps[index] != steps[index - 1] + 1]
    cut = breaks[0] if breaks else resumed[0]
    assert len(breaks) <= 1 and steps[:cut] == list(range(1, cut + 1)) and cut >= resumed[0] - 1, out
    assert steps[cut:] == list(range(resumed[0] + 1, STEPS + 1)), out
    assert sorted(path.name for path in (tmp_path / "ckpt").iterdir() if path.name.startswith("step_")) \
        == ["step_12", "step_8"]


@pytest.mark.parametrize("environ, node_rank", [
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "2"}, 2),
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "2(x4)"}, 2),
    ({"RANK": "3", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, 3),                 # one rank a node
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2", "SLURM_NTASKS_PER_NODE": "1"}, 2),
])
def test_the_rank_environment_reads_the_ranks_the_launchers_set(monkeypatch, environ, node_rank):
    from slurmtools.integrations.lightning_inplace import RankEnvironment
    for key in ("GROUP_RANK", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    env = RankEnvironment()
    assert (env.global_rank(), env.local_rank(), env.world_size(), env.node_rank()) == \
        (int(environ["RANK"]), int(environ["LOCAL_RANK"]), int(environ["WORLD_SIZE"]), node_rank)
