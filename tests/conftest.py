"""Shared pytest setup: the real mini-cluster, brought up once per session for `cluster` tests."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from slurmtools.minicluster.layout import MAX_NODES

REPO = Path(__file__).resolve().parent.parent
TEST_STATE_DIR = Path(os.environ.get("SLURMTOOLS_TEST_CLUSTER_DIR", "/var/tmp/slurmtools-test-cluster"))
# The suite's own named cluster: a user's (the demo's `mini`, say) is never touched.
TEST_CLUSTER_NAME = os.environ.get("SLURMTOOLS_TEST_CLUSTER_NAME", "test")
# The Slurm release the cluster tests run against (unset: the machine's own packages); another
# release runs from its Debian root, its client commands first on PATH (scripts/test.sh).
TEST_SLURM_RELEASE = os.environ.get("SLURMTOOLS_TEST_SLURM") or None
# How many nodes the suite's cluster has: 3 for the suite; the fault matrix (marker `matrix`: two
# training nodes and two spares lost at once) needs 5 and the control plane at scale (marker `scale`)
# 130; each runs on a cluster of its own (scripts/test.sh).
_NODES_TEXT = os.environ.get("SLURMTOOLS_TEST_CLUSTER_NODES") or "3"
if not _NODES_TEXT.isdigit() or not 1 <= int(_NODES_TEXT) <= MAX_NODES:
    raise pytest.UsageError(f"SLURMTOOLS_TEST_CLUSTER_NODES: {_NODES_TEXT!r} is not a node count from 1 to {MAX_NODES}")
TEST_CLUSTER_NODES = int(_NODES_TEXT)
# Where the cluster tests' jobs write (made at the session's start, removed at its end): beside the
# state dir, never under pytest's own tmp (/tmp/pytest-of-root is root's alone, and the jobs run as
# the cluster's ordinary user).
TEST_WORK_DIR = Path(f"{TEST_STATE_DIR}-work")
# a size-limited file system every node sees (a tmpfs mounted before the nodes' mount namespaces
# are made, so they share it, as a cluster's nodes share a network file system): storage faults
SMALL_FS_DIR = Path(f"{TEST_STATE_DIR}-small-fs")
SMALL_FS_SIZE = "8m"


# scripts/test.sh runs several clusters' suites side by side; a cluster's slot is chosen when it
# comes up, so two `up`s at once could choose the same one. Every `up` in the tests holds this lock.
UP_LOCK_FILE = Path("/run/slurmtools/test-up.lock")


@contextlib.contextmanager
def cluster_up_lock() -> Iterator[None]:
    """Held while a test chooses a cluster's slot and brings it up (one `up` at a time per machine)."""
    UP_LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(UP_LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5):
    """Poll until predicate() is truthy; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} (last: {value!r})")


def _unmount_small_fs() -> None:
    for _ in range(5):                     # stacked mounts of killed sessions too
        if not os.path.ismount(SMALL_FS_DIR):
            return
        subprocess.run(["umount", "-l", str(SMALL_FS_DIR)], check=False)


def _mount_small_fs() -> None:
    _unmount_small_fs()                    # a killed session's
    SMALL_FS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_FS_SIZE},mode=1777", "tmpfs", str(SMALL_FS_DIR)],
                   check=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator["object"]:
    """A mini-cluster of TEST_CLUSTER_NODES nodes (3 unless set) with 4 fake GPUs per node, named
    for the suite and addressed by SLURM_CONF (inherited by every Slurm command, submitit and the
    jobs); torn down (and checked) at the end. /etc/hosts and /etc/slurm are never changed."""
    from slurmtools.minicluster import cluster as mc

    if os.geteuid() != 0:
        pytest.fail("cluster tests need root (run the README's test command as root)")
    blocked = unreachable_by_others(REPO / ".venv" / "bin" / "python")
    if blocked:
        pytest.fail(f"the checkout is not reachable by other users ({blocked} is closed to them): the cluster "
                    "tests' jobs run as an ordinary user and must read the code, as on a real cluster; "
                    "clone it under a directory others can enter (/srv, /opt, /var/tmp)")
    hosts_before = Path("/etc/hosts").read_text()
    etc_slurm_before = os.path.realpath(mc.ETC_SLURM_CONF)
    mc.down(mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR), purge=True)  # a killed session leaves nothing
    previous_conf, previous_path = os.environ.get("SLURM_CONF"), os.environ["PATH"]
    layout = None
    try:
        with cluster_up_lock():
            layout = mc.layout_for_up(TEST_CLUSTER_NAME, TEST_STATE_DIR, nodes=TEST_CLUSTER_NODES, gpus_per_node=4,
                                      prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d",
                                      slurm_release=TEST_SLURM_RELEASE)
            os.environ["SLURM_CONF"] = str(layout.slurm_conf)
            if layout.client_bin_dir:
                os.environ["PATH"] = f"{layout.client_bin_dir}{os.pathsep}{previous_path}"
            _mount_small_fs()
            mc.up(layout, install=True, wait_s=90)
        _make_work_dir()
        yield layout
    finally:
        import shutil
        shutil.rmtree(TEST_WORK_DIR, ignore_errors=True)
        if layout is None:
            layout = mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR)
        record = mc.load_record(layout)
        started = dict(record.get("pids", {}))
        _keep_logs(layout)
        mc.down(layout, purge=True)
        _unmount_small_fs()
        os.environ["PATH"] = previous_path
        if previous_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous_conf
        from slurmtools.minicluster import daemons, netns
        alive = {name: pid for name, pid in started.items() if daemons.daemon_alive(name, pid)}
        leftovers = [ns for ns in (layout.netns(n) for n in layout.node_names) if netns.netns_exists(ns)]
        changed = [path for path, ok in (("/etc/hosts", Path("/etc/hosts").read_text() == hosts_before),
                                         (str(mc.ETC_SLURM_CONF), os.path.realpath(mc.ETC_SLURM_CONF) == etc_slurm_before))
                   if not ok]
        if alive or leftovers or changed or netns.link_exists(layout.bridge) or layout.registry_file.exists():
            print(f"mini-cluster teardown left: processes={alive} netns={leftovers} changed={changed}",
                  file=sys.stderr)
            raise AssertionError("mini-cluster teardown left processes, namespaces or system changes behind")


def unreachable_by_others(path: Path) -> str:
    """The first directory above path that other users cannot enter (or path itself, when they
    cannot read and run it); "" when they can."""
    import stat
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return str(parent)
    mode = os.stat(path).st_mode
    return "" if mode & stat.S_IROTH and mode & stat.S_IXOTH else str(path)


def _make_work_dir() -> None:
    """TEST_WORK_DIR (root's, 0755) with the job user's HOME in it."""
    import shutil
    from tests.cluster import asuser
    shutil.rmtree(TEST_WORK_DIR, ignore_errors=True)
    TEST_WORK_DIR.mkdir(mode=0o755, parents=True)
    TEST_WORK_DIR.chmod(0o755)
    home = asuser.home()
    home.mkdir(mode=0o755)
    os.chown(home, asuser.user().uid, asuser.user().gid)


def _keep_logs(layout) -> None:
    """The cluster's daemon logs, kept (runs/test-logs/<cluster>/) before `down --purge` removes its
    state: a failure in CI can only be explained from them."""
    import shutil
    keep = REPO / "runs" / "test-logs" / layout.name
    shutil.rmtree(keep, ignore_errors=True)
    if layout.log_dir.is_dir():
        shutil.copytree(layout.log_dir, keep, ignore_dangling_symlinks=True)


@pytest.fixture
def shared_tmp(cluster, request) -> Path:
    """A root-owned scratch dir every node sees (all namespaces share the mount namespace), for
    what an admin writes (health fixtures: the prolog trusts only root-owned files)."""
    from tests.cluster import asuser
    return asuser.root_dir(request.node.name[:40])


@pytest.fixture
def user_tmp(cluster, request) -> Path:
    """A scratch dir the job user owns, every node sees: a job's logs, checkpoints, control files."""
    from tests.cluster import asuser
    return asuser.user_dir(request.node.name[:40])


def _reference(name: str, **over: Any) -> dict:
    from tests.cluster import asuser, training

    workdir = asuser.user_dir(name)
    spec = training.training_spec(workdir, name, preflight=True, **over)     # the healthy cluster passes it
    job = training.submit(spec)
    info = training.wait_finished(job, 180)
    evts = training.events(spec, job)
    finals = training.trainer_events(evts, "final")
    assert info.state == "COMPLETED" and finals, training.describe(spec, job)
    return {"job": job, "spec": spec, "events": evts, "hash": finals[-1]["state_sha256"]}


@pytest.fixture(scope="session")
def reference_run(cluster) -> dict:
    """The uninterrupted run every fault test compares with (same steps, same world size: the
    default 2 nodes x 1 process)."""
    return _reference("reference")


@pytest.fixture(scope="session")
def reference_run_4(cluster) -> dict:
    """The uninterrupted run of 2 nodes x 2 processes, for the tests that need a second rank on a
    node (a node's ranks pulling their replicas, a named rank on the second node)."""
    return _reference("reference4", processes_per_node=2)
