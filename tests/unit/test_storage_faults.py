"""Storage faults, for real: checkpoints on a size-limited tmpfs that fills up during a save (two
gloo ranks running the reference trainer), and a checkpoint file that cannot be read on resume."""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from slurmtools.checkpoint import manager as checkpoint, resume as checkpoint_resume  # noqa: E402
from slurmtools.checkpoint.manager import CheckpointManager  # noqa: E402
from slurmtools.common.control_dir import EXPECTED_CHECKPOINT_ENV  # noqa: E402
from slurmtools.errors import CheckpointError  # noqa: E402
from tests.unit.ranks import rank_argv

RANK_SCRIPT = """
import datetime, json, sys, threading, torch.distributed as dist
from pathlib import Path
from slurmtools.errors import CheckpointError
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
events = []
log = lambda record: events.append(record if "event" in record else {"event": "step", "step": record["step"]})
mode, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
cfg = TrainConfig(steps=12, checkpoint_every=4, checkpoint_dir=ckpt, on_save_error=mode, loader_workers=0)
try:
    train(cfg, TrainingControl(rank=dist.get_rank()), log)
except CheckpointError as exc:
    events.append({"event": "stopped", "error": str(exc)})
# the trainer that raised let its checkpointer's threads go (not left to a collection at exit)
left = [thread.name for thread in threading.enumerate() if thread.name.startswith("checkpoint-seal")]
assert not left, f"threads left after the trainer raised: {left}"
if dist.get_rank() == 0:
    out.write_text(json.dumps(events))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs that holds one checkpoint of the reference trainer (~1.6 MB) but not two."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a size-limited tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2500k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _train(tmp_path: Path, mode: str, ckpt: Path) -> list:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    env.pop("SLURMTOOLS_CONTROL_DIR", None)
    out = tmp_path / f"events-{mode}.json"
    with (tmp_path / "ranks.err").open("w") as err:
        procs = [subprocess.Popen(rank_argv(RANK_SCRIPT, mode, str(ckpt), str(out), fsdp=True),
                                  env=dict(env, RANK=str(rank)), stdout=subprocess.DEVNULL, stderr=err)
                 for rank in range(2)]
        codes = [proc.wait(timeout=240) for proc in procs]
    assert codes == [0, 0], (tmp_path / "ranks.err").read_text()[-3000:]
    return json.loads(out.read_text())


def test_a_full_file_system_fails_the_save_training_goes_on_and_the_last_complete_checkpoint_stays(
        tmp_path, small_fs):
    """The periodic (async) save of step 8 fails: training goes on; the final (blocking) save of
    step 12 fails too: training stops with the reason."""
    events = _train(tmp_path, "continue", small_fs)
    failed = [e for e in events if e["event"] == "checkpoint_failed"]
    assert [e["step"] for e in failed] == [8, 12], events
    assert all("No space left on device" in e["error"] and "\n" not in e["error"] for e in failed)
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 13))   # 9..12 trained after it
    assert events[-1] == {"event": "stopped", "error": failed[1]["error"]}
    assert failed[1]["error"].startswith("checkpoint of step 12 not saved: rank ")
    newest = CheckpointManager(small_fs).latest()
    assert newest is not None and newest.step == 4                       # the only one that fit, kept
    assert not [p.name for p in small_fs.iterdir() if p.name.endswith(".tmp")]   # no half-written staging


def test_with_on_save_error_stop_the_first_failed_save_stops_every_rank_with_the_reason(tmp_path, small_fs):
    events = _train(tmp_path, "stop", small_fs)
    reported = [(e["event"], e.get("step")) for e in events if e["event"] not in ("checkpoint", "step")]
    assert reported == [("checkpoint_failed", 8), ("stopped", None)], events
    assert "on_save_error: stop" in events[-1]["error"]
    assert CheckpointManager(small_fs).latest().step == 4


def _two_checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root)
    for step in (2, 4):
        manager.save(step, lambda d: (d / "w.bin").write_bytes(b"x" * 10))
    return root, manager


def _failing_reads(monkeypatch, errno_value: int, times: int) -> list:
    """step_4's reads fail with errno_value the first `times` times (then succeed); the failures seen."""
    real = checkpoint.file_digest
    seen: list = []

    def failing_disk(path: Path, algorithm: str = "xxh3_128") -> str:
        if path.parent.name == "step_4" and len(seen) < times:
            seen.append(path.name)
            raise OSError(errno_value, os.strerror(errno_value))
        return real(path, algorithm)
    monkeypatch.setattr(checkpoint, "file_digest", failing_disk)
    return seen


def _quarantined(root: Path) -> list:
    return [p.name.split(".bad-")[0] for p in root.iterdir() if ".bad-" in p.name]


def test_a_transient_read_error_on_resume_is_read_again_not_taken_for_a_corrupt_checkpoint(tmp_path, monkeypatch):
    root, manager = _two_checkpoints(tmp_path)
    seen = _failing_reads(monkeypatch, errno.EIO, 2)        # a storage target failing over, then back
    slept: list = []
    refused: list = []
    assert checkpoint_resume.verified_latest(manager, refused, sleep=slept.append) == str(root / "step_4")
    assert seen == ["w.bin", "w.bin"] and slept == list(checkpoint_resume.READ_RETRY_DELAYS_S[:2])
    assert refused == [] and _quarantined(root) == []


def test_storage_unreadable_past_the_retries_fails_the_resume_and_leaves_the_checkpoint(tmp_path, monkeypatch):
    root, manager = _two_checkpoints(tmp_path)
    _failing_reads(monkeypatch, errno.ESTALE, 100)
    slept: list = []
    with pytest.raises(checkpoint_resume.StorageUnavailable, match=r"step_4: storage error: cannot read w.bin "
                                                                  r"\(\[Errno 116\] Stale file handle\), still after 5 "
                                                                  r"retries over 30 s: the storage failed"):
        checkpoint_resume.verified_latest(manager, sleep=slept.append)
    assert slept == list(checkpoint_resume.READ_RETRY_DELAYS_S)
    assert _quarantined(root) == [] and (root / "step_4").is_dir()     # never an older one, never step 0


def test_a_file_unreadable_for_good_is_passed_over_and_only_a_digest_mismatch_is_quarantined(tmp_path, monkeypatch):
    root, manager = _two_checkpoints(tmp_path)
    _failing_reads(monkeypatch, errno.EACCES, 100)
    refused: list = []
    assert checkpoint_resume.verified_latest(manager, refused, sleep=lambda s: None) == str(root / "step_2")
    assert refused == [(str(root / "step_4"), "cannot read w.bin ([Errno 13] Permission denied)")]
    assert _quarantined(root) == []
    monkeypatch.undo()
    (root / "step_4" / "w.bin").write_bytes(b"y" * 10)      # a flipped byte: the digest does not match
    refused = []
    assert checkpoint_resume.verified_latest(manager, refused) == str(root / "step_2")
    assert refused == [(str(root / "step_4"), "checksum mismatch in w.bin")] and _quarantined(root) == ["step_4"]


def test_a_job_whose_ledger_shows_a_checkpoint_never_starts_again_from_step_0():
    refused = [("/ckpt/step_8", "checksum mismatch in w.bin")]
    with pytest.raises(CheckpointError, match=r"^no checkpoint verifies although this job checkpointed step 8 "
                                              r"before \(step_8: checksum mismatch in w.bin\): not starting again "
                                              r"from step 0$"):
        checkpoint_resume.refuse_fresh_start(refused, {EXPECTED_CHECKPOINT_ENV: "8"})
    checkpoint_resume.refuse_fresh_start([], {})                 # a first run: step 0 is right
    checkpoint_resume.refuse_fresh_start([], {EXPECTED_CHECKPOINT_ENV: "x"})


def test_the_example_trainer_stopped_by_a_failed_save_ends_in_one_line_per_rank_not_a_traceback(tmp_path, small_fs):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    env.pop("SLURMTOOLS_CONTROL_DIR", None)
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"
    # an atexit abort stands in for torch's C++ teardown aborting at exit (a gloo group FSDP2 keeps
    # alive, its peer gone): the rank leaves with its one-line error and status 1 without it
    argv = [sys.executable, "-c", "import atexit, os, runpy, sys; atexit.register(os.abort); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            str(example), "--steps", "12", "--checkpoint-every", "4", "--checkpoint-dir",
            str(small_fs), "--on-save-error", "stop", "--loader-workers", "0"]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    results = [proc.communicate(timeout=240) for proc in procs]
    assert [proc.returncode for proc in procs] == [1, 1], [err[-2000:] for _, err in results]
    for rank, (_, err) in enumerate(results):
        assert "Traceback" not in err, err[-3000:]
        assert err.strip().splitlines()[-1] == (f"train.py: error: rank {rank}: a periodic checkpoint was not saved "
                                                "(on_save_error: stop); see the checkpoint_failed event")
    assert CheckpointManager(small_fs).latest().step == 4


def test_the_supervisor_tells_the_ranks_the_newest_checkpoint_its_ledger_records():
    from slurmtools.common import ledger
    checkpointed_step = ledger.newest_checkpoint_step
    assert checkpointed_step([]) is None
    assert checkpointed_step([ledger.AttemptStart("7.0", 1.0), ledger.AttemptEnd("7.0", 2.0, "crash")]) is None
    assert checkpointed_step([ledger.AttemptStart("7.0", 1.0), ledger.AttemptEnd("7.0", 2.0, "crash", checkpoint_step=8),
                              ledger.AttemptStart("7.0.1", 3.0, resume_step=4)]) == 8


PHASE_SCRIPT = """
import json, sys, torch.distributed as dist
from slurmtools.checkpoint import torch_dcp as checkpoint_torch
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
control = TrainingControl(rank=0)
seen = []
real = checkpoint_torch.AsyncCheckpointer.save
def save(self, *args, **kwargs):
    seen.append(control._phase[0] if control._phase else None)
    return real(self, *args, **kwargs)
checkpoint_torch.AsyncCheckpointer.save = save
train(TrainConfig(steps=8, checkpoint_every=4, checkpoint_dir=sys.argv[1], loader_workers=0), control, lambda r: None)
dist.destroy_process_group()
print(json.dumps(seen))
"""


def test_an_async_save_waiting_for_the_previous_one_is_work_not_a_hang(tmp_path):
    """AsyncCheckpointer.save waits for the save before it first: on a slow store that wait was
    outside the saving phase, judged a hang and the save killed, again and again."""
    from tests.unit.test_flight_recorder import _free_port
    out = subprocess.run(rank_argv(PHASE_SCRIPT, str(tmp_path / "ckpt"), str(_free_port()), fsdp=True),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["saving"]
