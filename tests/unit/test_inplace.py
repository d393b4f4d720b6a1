"""In-place recovery, the ranks' side (slurmtools/train/inplace.py), for real: four gloo ranks of
the reference trainer with snapshots every 3 steps. Rank 2's process is lost before step 9 (killed,
no clean-up). The others do not exit: each one's broken group raises (also theirs whose collective
waited on a live peer, not on the lost rank: the peers that got the error leave the group at once
and free it, which fails the rest), and they wait for the next generation. The test stands for
the supervisor: it waits until every survivor has left its group, hosts the store the next
generation meets on (as the batch host does), writes generation 1 into the control dir and starts
a replacement rank 2 straight into it. The survivors keep their processes (no new start, no
import); every rank comes back from the newest snapshot in node memory and the run ends with the
uninterrupted run's exact state hash. Without in-place recovery, or without a generation in time,
the rank exits as before."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmtools.common.control_dir import GENERATION_ENV, INPLACE_ENV, SNAPSHOT_MAX_OVERHEAD_ENV, standalone_env
from tests.unit.test_flight_recorder import _free_port

torch = pytest.importorskip("torch")
from slurmtools.train import inplace  # noqa: E402
from slurmtools.common import generation  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"


WORLD = 4
LOST = 2
LEFT = "waiting up to"        # a survivor's line once it has left its broken group


def _start(tmp_path: Path, rank: int, port: int, *args: str, world: int = WORLD, **extra_env: str
           ) -> subprocess.Popen:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
               LOCAL_RANK=str(rank), **standalone_env(tmp_path / "control", "5.0", tmp_path / "memory"),
               **{SNAPSHOT_MAX_OVERHEAD_ENV: "0"}, **extra_env)
    argv = [sys.executable, str(EXAMPLE), "--steps", "12", "--checkpoint-every", "100", "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--loader-workers", "0", "--snapshot-every", "3", *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def reference_hash(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("inplace-reference")
    (base / "memory").mkdir()
    port = _free_port()
    procs = [_start(base, rank, port) for rank in range(WORLD)]
    outs = [proc.communicate(timeout=240) for proc in procs]
    finals = [e for e in _events(outs[0][0]) if e.get("event") == "final"]
    assert finals, outs[0][1][-2000:]
    return finals[0]["state_sha256"]


class _Said:
    """A running process's output, read as it comes by threads of its own (stdout and stderr: a
    communicate() beside them would take some of the lines)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self.out = proc, [], []
        self.threads = [threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True),
                        threading.Thread(target=lambda: self.out.extend(proc.stdout), daemon=True)]
        for thread in self.threads:
            thread.start()

    def text(self) -> str:
        return "".join(list(self.lines))

    def end(self, timeout_s: float) -> str:
        """Its stdout, once it ended and both streams are read to their end."""
        self.proc.wait(timeout=timeout_s)
        for thread in self.threads:
            thread.join(timeout=30)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        return "".join(self.out)


def _wait_until_said(said: dict, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not all(text in s.text() for s in said.values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_lost_rank_is_replaced_in_place_and_the_survivors_keep_their_processes(tmp_path, reference_hash):
    (tmp_path / "memory").mkdir()
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = _free_port()
    procs = {rank: _start(tmp_path, rank, port, "--kill-rank-at", f"{LOST}:8", **{INPLACE_ENV: "1"})
             for rank in range(WORLD)}
    lost = procs.pop(LOST)
    _, lost_err = lost.communicate(timeout=240)
    assert lost.returncode == 9 and "injected loss of this process at step 8" in lost_err
    # every survivor leaves its group within seconds, not at the collective timeout
    said = {rank: _Said(proc) for rank, proc in procs.items()}
    assert _wait_until_said(said, LEFT, 30), {rank: s.text()[-1500:] for rank, s in said.items()}
    assert all(proc.poll() is None for proc in procs.values())       # waiting, not gone
    generation.write(tmp_path / "control", generation.Generation(1, WORLD, "127.0.0.1", store.port))
    replacement = _start(tmp_path, LOST, port, **{INPLACE_ENV: "1", GENERATION_ENV: "1"})
    outs = {rank: said[rank].end(240) for rank in procs}
    replacement_out, replacement_err = replacement.communicate(timeout=240)
    for rank, proc in procs.items():
        assert proc.returncode == 0, said[rank].text()[-3000:]
    assert replacement.returncode == 0, replacement_err[-3000:]
    out, err = outs[0], said[0].text()
    assert "the process group of generation 0 broke" in err and "joining generation 1 in place" in err
    events = _events(out)                           # one process's output: the steps before and after
    steps = [e["step"] for e in events if "step" in e and "event" not in e]
    resumed = [e for e in events if e.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] in (3, 6), resumed
    assert resumed[0]["path"] == f"in-memory snapshot of step {resumed[0]['step']}"
    assert steps[:8] == list(range(1, 9)) and steps[8:] == list(range(resumed[0]["step"] + 1, 13))
    final = [e for e in events if e.get("event") == "final"]
    assert final and final[0]["state_sha256"] == reference_hash


def test_without_in_place_recovery_the_survivor_exits_as_before(tmp_path):
    (tmp_path / "memory").mkdir()
    port = _free_port()
    procs = [_start(tmp_path, rank, port, "--kill-rank-at", "1:4", world=2) for rank in range(2)]
    outs = [proc.communicate(timeout=240) for proc in procs]
    assert procs[1].returncode == 9 and procs[0].returncode != 0
    assert "joining generation" not in outs[0][1]


@pytest.fixture
def control(tmp_path, monkeypatch) -> Path:
    """A control dir of a job with in-place recovery on, no generation written yet."""
    monkeypatch.setenv(INPLACE_ENV, "1")
    monkeypatch.delenv(GENERATION_ENV, raising=False)
    (tmp_path / "control").mkdir()
    return tmp_path / "control"


def test_a_generation_that_does_not_come_in_time_is_the_relaunch(control):
    def broken() -> None:
        raise RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="reset by peer"):
        inplace.run(broken, control, 0, "gloo", 10.0, wait_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5


def test_a_trainers_own_error_fails_at_once_without_waiting_for_a_generation(control):
    """Only a broken group waits: a bug of the trainer's raises at once, not after REFORM_WAIT_S."""
    def buggy() -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        inplace.run(buggy, control, 0, "gloo", 10.0, wait_s=30.0)
    assert time.monotonic() - started < 1
    assert inplace.group_broke(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    assert inplace.group_broke(torch.distributed.DistStoreError("wait timeout"))
    assert not inplace.group_broke(ValueError("gloo"))


def test_a_generation_file_is_read_whole_or_not_at_all(tmp_path, capsys):
    generation.write(tmp_path, generation.Generation(2, 4, "node9", 29500))
    assert generation.read(tmp_path) == generation.Generation(2, 4, "node9", 29500)
    for bad in ('{"number": 0, "world": 4, "store_host": "n", "store_port": 1}', '{"number": 1}', "[1]", "{"):
        (tmp_path / "generation.json").write_text(bad)
        assert generation.read(tmp_path) is None
        assert "is no generation" in capsys.readouterr().err
    assert generation.wait_for_next(tmp_path, 0, 0.2) is None
    with pytest.raises(Exception, match="must be a generation number"):
        generation.current({GENERATION_ENV: "x"})


def test_a_replacement_needs_the_generation_it_was_started_into(tmp_path):
    generation.write(tmp_path, generation.Generation(1, 2, "127.0.0.1", 1))
    with pytest.raises(Exception, match="started into generation 2, but the control dir's generation.json names 1"):
        inplace.start("gloo", 5.0, tmp_path, {GENERATION_ENV: "2", "RANK": "1"})


def test_the_watcher_breaks_the_group_once_per_generation_and_never_while_the_rank_leaves(tmp_path, monkeypatch):
    """The supervisor's word is what breaks a group a lost node never answers for (NCCL's abort;
    gloo's connections shut): once per newer generation, not for the generation the process runs
    in, and not while the process itself leaves or joins a group."""
    group = inplace.Group()
    broken: list = []
    monkeypatch.setattr(group, "break_off", lambda: broken.append(1))
    monkeypatch.setenv(GENERATION_ENV, "0")
    assert not group.check(tmp_path)                         # no generation named
    generation.write(tmp_path, generation.Generation(1, 4, "127.0.0.1", 1))
    group.set_leaving(True)
    assert not group.check(tmp_path)                         # the rank leaves on its own
    group.set_leaving(False)
    assert group.check(tmp_path) and not group.check(tmp_path)
    assert len(broken) == 1
    monkeypatch.setenv(GENERATION_ENV, "1")                  # joined generation 1
    assert not group.check(tmp_path)
    generation.write(tmp_path, generation.Generation(2, 4, "127.0.0.1", 1))
    assert group.check(tmp_path) and len(broken) == 2
