"""Stale job cgroups of a killed mini-cluster node are removed, live ones and other nodes' kept."""
from __future__ import annotations

from pathlib import Path

from slurmtools.minicluster.jobcgroups import own_job_ids, remove_job_cgroups


def _tree(root: Path) -> None:
    for controller in ("cpuset", "memory"):
        (root / controller / "slurm_node1" / "uid_0" / "job_3" / "step_batch").mkdir(parents=True)
        (root / controller / "slurm_node1" / "uid_0" / "job_4").mkdir(parents=True)
        (root / controller / "slurm_node2" / "uid_0" / "job_5").mkdir(parents=True)
    # a cgroup with a task in it cannot be removed: a regular file stands in for that here
    (root / "cpuset" / "slurm_node1" / "uid_0" / "job_4" / "busy").write_text("1\n")


def test_empty_job_dirs_of_the_node_are_removed_deepest_first(tmp_path: Path) -> None:
    _tree(tmp_path)
    removed = remove_job_cgroups("node1", tmp_path, ("cpuset", "memory"))
    rel = sorted(str(p.relative_to(tmp_path)) for p in removed)
    assert rel == ["cpuset/slurm_node1/uid_0/job_3", "cpuset/slurm_node1/uid_0/job_3/step_batch",
                   "memory/slurm_node1/uid_0", "memory/slurm_node1/uid_0/job_3",
                   "memory/slurm_node1/uid_0/job_3/step_batch", "memory/slurm_node1/uid_0/job_4"]
    assert (tmp_path / "cpuset" / "slurm_node1" / "uid_0" / "job_4" / "busy").exists()
    assert (tmp_path / "memory" / "slurm_node1").is_dir()          # the node's own dir stays without top
    assert (tmp_path / "cpuset" / "slurm_node2" / "uid_0" / "job_5").is_dir()


def test_top_removes_the_node_dir_too_and_a_missing_controller_is_skipped(tmp_path: Path) -> None:
    _tree(tmp_path)
    remove_job_cgroups("node2", tmp_path, ("cpuset", "memory", "freezer"), top=True)
    assert not (tmp_path / "cpuset" / "slurm_node2").exists()
    assert not (tmp_path / "memory" / "slurm_node2").exists()
    assert (tmp_path / "cpuset" / "slurm_node1").is_dir()


def test_the_reboot_program_restarts_slurmd_with_a_boot_clock_near_zero(tmp_path: Path) -> None:
    from slurmtools.minicluster.layout import MiniClusterLayout
    from slurmtools.minicluster.reboot import boottime_offset_s, program_text, restart_argv

    assert boottime_offset_s("monotonic           0         0\nboottime         -100         0\n") == -100.0
    assert boottime_offset_s("monotonic 5 0\n") == 0.0
    layout = MiniClusterLayout(name="t", state_dir=tmp_path / "t")
    assert restart_argv(layout, "node2", 5000.7) == ["unshare", "--time", "--boottime=-5000", "/usr/sbin/slurmd",
                                                     "-N", "node2"]
    assert restart_argv(layout, "node2", 0.5)[2] == "--boottime=0"     # never a negative clock
    assert program_text(layout, "/venv/bin/python").splitlines()[-1] == (
        f"exec /venv/bin/python -m slurmtools.minicluster.reboot {tmp_path}/t t request")


def test_beside_other_clusters_only_this_clusters_job_ids_are_removed(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / "memory" / "slurm_node1" / "uid_0" / "job_100004" / "step_0").mkdir(parents=True)
    removed = remove_job_cgroups("node1", tmp_path, ("cpuset", "memory"), job_ids=range(100001, 200001))
    assert sorted(str(p.relative_to(tmp_path)) for p in removed) == [
        "memory/slurm_node1/uid_0/job_100004", "memory/slurm_node1/uid_0/job_100004/step_0"]
    assert (tmp_path / "memory" / "slurm_node1" / "uid_0" / "job_3" / "step_batch").is_dir()   # another's


def test_a_cluster_without_a_record_removes_no_job_cgroups_beside_others() -> None:
    """Its layout is the default one (slot 0): slot 0's ids are another running cluster's."""
    assert own_job_ids(1, 100000, beside_others=False, recorded=False) is None          # alone: all
    assert own_job_ids(100001, 100000, beside_others=True, recorded=True) == range(100001, 200001)
    assert own_job_ids(1, 100000, beside_others=True, recorded=False) == range(0)


def test_no_job_ids_of_its_own_remove_nothing(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert remove_job_cgroups("node1", tmp_path, ("cpuset", "memory"), job_ids=range(0)) == []
