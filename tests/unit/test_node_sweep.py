"""Node memory is swept only of directories provably no live job's: never by age alone for a
Slurm job (a hang past 10 minutes, a requeued job waiting in the queue, a long snapshot interval),
never `snapshots/` by the heartbeat sweep, nothing when Slurm cannot be asked."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmtools.snapshot.rules import SNAPSHOTS_SUBDIR, job_key
from slurmtools.snapshot.store import SnapshotStore
from slurmtools.train import node_beat, node_sweep

DIGEST = "0123456789abcdef"
NOW = 1_000_000.0
OLD, NEW = NOW - 601.0, NOW - 5.0


@pytest.mark.parametrize("name, newest, live, removed", [
    (f"17.0-{DIGEST}", OLD, frozenset(), True),              # old, its job gone from Slurm
    (f"17.0.3-{DIGEST}", OLD, frozenset({9}), True),
    (f"17.0-{DIGEST}", OLD, frozenset({17}), False),         # old, but Slurm still lists the job (hung, requeued)
    (f"17.0-{DIGEST}", OLD, None, False),                    # Slurm could not be asked: nothing of a job's goes
    (f"17.0-{DIGEST}", NEW, frozenset(), False),             # written lately
    (f"local.0-{DIGEST}", OLD, None, True),                  # a run outside Slurm: by age
    (f"local.0-{DIGEST}", NEW, None, False),
    (SNAPSHOTS_SUBDIR, OLD, frozenset(), False),             # not a launch directory: never this sweep's
    (f"17.0-{DIGEST}x", OLD, frozenset(), False),
    ("017.0-zz", OLD, frozenset(), False),
])
def test_a_launch_directory_goes_only_when_old_and_its_job_is_gone(name, newest, live, removed):
    assert node_sweep.removable({name: newest}, node_sweep.ATTEMPT_DIR, "9.0-" + DIGEST, NOW, 600.0,
                                live) == ([name] if removed else [])


def test_the_launchs_own_directory_is_kept_and_slurm_is_asked_only_for_an_old_jobs_directory():
    keep = f"9.0-{DIGEST}"
    assert node_sweep.removable({keep: OLD}, node_sweep.ATTEMPT_DIR, keep, NOW, 600.0, frozenset()) == []
    assert not node_sweep.needs_slurm({keep: OLD, f"local.0-{DIGEST}": OLD, f"3.0-{DIGEST}": NEW},
                                      node_sweep.ATTEMPT_DIR, keep, NOW, 600.0)
    assert node_sweep.needs_slurm({f"3.0-{DIGEST}": OLD}, node_sweep.ATTEMPT_DIR, keep, NOW, 600.0)


def test_job_keys_are_the_snapshot_sweeps_shape():
    key = job_key("42", Path("/ckpt/.slurmtools/42"))
    assert node_sweep.job_of(key, node_sweep.JOB_KEY_DIR) == "42"
    assert node_sweep.job_of(job_key(node_sweep.LOCAL_JOB_ID, Path("/x")), node_sweep.JOB_KEY_DIR) == "local"
    assert node_sweep.job_of(f"42.0-{DIGEST}", node_sweep.JOB_KEY_DIR) is None


def _age(path: Path, when: float) -> None:
    for item in [path, *path.rglob("*")]:
        os.utime(item, (when, when), follow_symlinks=False)


def _launch_dir(user_root: Path, attempt: str, host: str = "n1") -> Path:
    path = user_root / f"{attempt}-{DIGEST}" / host
    path.mkdir(parents=True)
    (path / "0.json").write_text("{}")
    return path


def test_the_heartbeat_sweep_leaves_snapshots_and_live_jobs_and_removes_what_ended(tmp_path):
    root = node_beat.user_root(tmp_path, os.geteuid())
    snapshots = root / SNAPSHOTS_SUBDIR / job_key("17", tmp_path / "ctl")
    (snapshots / "rank0" / "step_10").mkdir(parents=True)
    hung = _launch_dir(root, "17.0")            # job 17: hung past 10 minutes, still in Slurm
    ended = _launch_dir(root, "18.0")           # job 18: gone
    local = _launch_dir(root, "local.0")
    for path in (root / SNAPSHOTS_SUBDIR, hung.parent, ended.parent, local.parent):
        _age(path, NOW - 3600)
    mine = _launch_dir(root, "17.0.1")
    asked = []

    def live():
        asked.append(True)
        return frozenset({17})
    gone = node_beat.sweep_stale(mine, NOW, 600.0, live)
    assert gone == [f"18.0-{DIGEST}", f"local.0-{DIGEST}"] and asked == [True]
    assert snapshots.is_dir() and hung.is_dir() and mine.is_dir()
    assert not ended.exists() and not local.exists()
    # Slurm cannot be asked: the old launch of job 17 stays all the same
    assert node_beat.sweep_stale(mine, NOW, 600.0, lambda: None) == [] and hung.is_dir()


def test_slurm_is_not_asked_when_nothing_is_old(tmp_path):
    root = node_beat.user_root(tmp_path, os.geteuid())
    other = _launch_dir(root, "5.0")
    mine = _launch_dir(root, "6.0")

    def never():
        raise AssertionError("squeue asked with nothing old to sweep")
    assert node_beat.sweep_stale(mine, other.stat().st_mtime + 1, 600.0, never) == []


def test_the_snapshot_sweep_keeps_a_requeued_jobs_snapshots_waiting_in_the_queue(tmp_path):
    waiting = SnapshotStore(tmp_path, job_key("41", tmp_path / "a"), "n1", bytes(32))
    waiting.save_own(0, 5, {"state.pt": b"x"})
    ended = SnapshotStore(tmp_path, job_key("40", tmp_path / "b"), "n1", bytes(32))
    ended.save_own(0, 5, {"state.pt": b"x"})
    for store in (waiting, ended):
        _age(store.root, NOW - 25 * 3600)
    new = SnapshotStore(tmp_path, job_key("43", tmp_path / "c"), "n1", bytes(32))
    new.save_own(0, 1, {"state.pt": b"x"})
    assert new.sweep_stale(NOW, live_jobs=lambda: frozenset({41, 43})) == [ended.root.name]
    assert waiting.inventory() and not ended.root.exists()


def test_this_users_live_jobs_is_none_without_slurm(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert node_sweep.this_users_live_jobs() is None


def test_the_sweep_age_is_the_sites_when_set_and_anything_else_is_one_line_naming_the_variable():
    from slurmtools.errors import UsageError
    from slurmtools.train.node_sweep import SWEEP_AFTER_ENV, stale_after_s
    assert stale_after_s({}, 600.0) == 600.0
    assert stale_after_s({SWEEP_AFTER_ENV: " "}, 600.0) == 600.0
    assert stale_after_s({SWEEP_AFTER_ENV: "2.5"}, 600.0) == 2.5
    for bad in ("x", "0", "-1", "inf", "nan", "10s"):
        with pytest.raises(UsageError) as caught:
            stale_after_s({SWEEP_AFTER_ENV: bad}, 600.0)
        assert str(caught.value) == f"{SWEEP_AFTER_ENV}={bad!r}: expected a number of seconds above 0"
