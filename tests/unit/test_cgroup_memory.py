"""The snapshot budget is bounded by the job's memory cgroup as well (issue 46): /dev/shm and the
ranks' memory are charged to it alike, so a budget above its headroom is an OOM kill, not a refusal.
The cgroup trees below are the layouts Slurm's cgroup/v1 and cgroup/v2 plugins make."""
from pathlib import Path

from slurmtools.snapshot import cgroup_memory as cm

GB = 10 ** 9


def _tree(root: Path, version: str, levels):
    """levels: (relative path, limit text, usage text), written as that version's files."""
    base = root / "memory" if version == "v1" else root
    limit_name, usage_name = cm.V1_FILES if version == "v1" else cm.V2_FILES
    for relative, limit, usage in levels:
        directory = base / relative if relative else base
        directory.mkdir(parents=True, exist_ok=True)
        (directory / limit_name).write_text(limit + "\n")
        (directory / usage_name).write_text(usage + "\n")


def test_the_memory_controllers_line_names_the_cgroup_on_either_version():
    hybrid = "9:name=systemd:/\n4:memory:/slurm_node1/uid_1000/job_12/step_0/task_0\n0::/\n"
    assert cm.cgroup_of(hybrid) == ("v1", "/slurm_node1/uid_1000/job_12/step_0/task_0")
    assert cm.cgroup_of("0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0\n") == (
        "v2", "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0")
    assert cm.cgroup_of("garbage\n3:cpuset:/\n") is None


def test_the_tightest_level_counts_and_unlimited_levels_do_not(tmp_path):
    _tree(tmp_path, "v2", [("", "max", str(900 * GB)),
                           ("system.slice/slurmstepd.scope/job_12", str(64 * GB), str(24 * GB)),
                           ("system.slice/slurmstepd.scope/job_12/step_0", "max", str(20 * GB))])
    levels = cm.read_levels("v2", "/system.slice/slurmstepd.scope/job_12/step_0", tmp_path)
    assert cm.headroom_bytes(levels) == 40 * GB
    _tree(tmp_path, "v1", [("", "9223372036854771712", str(5 * GB)),
                           ("slurm_n1/uid_1/job_3", str(16 * GB), str(15 * GB))])
    assert cm.headroom_bytes(cm.read_levels("v1", "/slurm_n1/uid_1/job_3/step_0/task_0", tmp_path)) == GB
    assert cm.headroom_bytes([("max", "5", ""), ("9223372036854771712", "0", ""), ("x", "1", "")]) is None
    assert cm.headroom_bytes([("10", "20", "")]) == 0                  # over already: nothing to give


def test_page_cache_the_kernel_drops_first_is_headroom_shared_memory_is_not(tmp_path):
    """A rank that just read a 30-GB checkpoint has it in page cache: usage, but not in the way."""
    _tree(tmp_path, "v2", [("job", str(64 * GB), str(50 * GB))])
    (tmp_path / "job" / "memory.stat").write_text(f"anon {10 * GB}\nfile {40 * GB}\nshmem {8 * GB}\n"
                                                  f"active_file {2 * GB}\ninactive_file {30 * GB}\n")
    assert cm.headroom_bytes(cm.read_levels("v2", "/job", tmp_path)) == 44 * GB
    v1_stat = f"cache {9 * GB}\ninactive_file 5\ntotal_inactive_file {3 * GB}\n"
    assert cm.reclaimable_bytes(v1_stat) == 3 * GB and cm.reclaimable_bytes("inactive_file x\n") == 0


def test_the_process_reads_its_own_cgroup_from_proc(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/slurm_n1/uid_1/job_3/step_0\n")
    _tree(tmp_path, "v1", [("slurm_n1/uid_1/job_3", str(8 * GB), str(3 * GB))])
    assert cm.job_headroom_bytes(tmp_path, proc) == 5 * GB
    assert cm.job_headroom_bytes(tmp_path, tmp_path / "missing") is None
    assert cm.job_headroom_bytes(tmp_path / "elsewhere", proc) is None


def test_a_cgroup_tighter_than_the_spec_bounds_each_ranks_budget_and_says_so():
    share = cm.rank_share_bytes(40 * GB, 8)
    assert share == 4 * GB
    assert cm.snapshot_limit_bytes(8.0, share) == (4 * GB, (
        "snapshots: each rank's share of node memory is 4 GB, not snapshot_memory_gb 8: 80% of what the job's "
        "memory limit (its cgroup) left free on the node at the start, shared by its ranks there"))
    assert cm.snapshot_limit_bytes(2.0, share) == (2 * GB, None)
    assert cm.snapshot_limit_bytes(2.0, cm.rank_share_bytes(None, 8)) == (2 * GB, None)


def test_this_machines_own_cgroup_is_read_without_error():
    headroom = cm.job_headroom_bytes()
    assert headroom is None or headroom >= 0
