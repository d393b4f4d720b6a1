"""The mini-cluster's config text, names, ports and hosts file, as pure functions."""
from pathlib import Path

import pytest

from slurmtools.minicluster import conf_text, netns
from slurmtools.minicluster import node_files
from slurmtools.minicluster.layout import BASE_DIR, MiniClusterLayout, whole_node_task_cpus


def layout(**kw) -> MiniClusterLayout:
    base = dict(state_dir=Path("/s"), controller_host="vm", prolog_dir=Path("/r/prolog.d"),
                epilog_dir=Path("/r/epilog.d"))
    base.update(kw)
    return MiniClusterLayout(**base)


def conf_lines(text: str) -> dict:
    return dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#") and
                not ln.startswith(("NodeName", "PartitionName")))


def test_slurm_conf_has_fast_scheduling_and_requeue_settings():
    conf = conf_lines(conf_text.slurm_conf(layout()))
    assert conf["SchedulerParameters"] == ("batch_sched_delay=0,sched_min_interval=0,sched_interval=2,"
                                           "bf_interval=1,nohold_on_prolog_fail")
    assert conf["AuthInfo"] == "cred_expire=10,socket=/s/munge/munge.socket"
    assert (conf["SlurmctldPort"], conf["SlurmdPort"], conf["AccountingStoragePort"]) == ("16817", "16818", "16819")
    assert conf["ClusterName"] == "mini"
    assert conf["PrologFlags"] == "Alloc"
    assert conf["JobRequeue"] == "1"
    assert conf["Prolog"] == "/r/prolog.d/*"
    assert conf["Epilog"] == "/r/epilog.d/*"
    assert conf["SlurmctldHost"] == "vm(10.77.0.1)"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["StateSaveLocation"] == "/s/slurmctld"
    assert conf["SlurmdSpoolDir"] == "/s/slurmd/%n"


def test_node_line_for_three_nodes_with_gpus():
    text = conf_text.slurm_conf(layout())
    node = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert node == ["NodeName=node[1-3] NodeAddr=10.77.0.[11-13] CPUs=4 Sockets=1 CoresPerSocket=4 "
                    "ThreadsPerCore=1 RealMemory=4000 Gres=gpu:4 State=UNKNOWN"]
    assert "PartitionName=gpu Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP" in text


def test_single_node_without_gpus():
    lay = layout(nodes=1, gpus_per_node=0)
    text = conf_text.slurm_conf(lay)
    assert "NodeName=node1 NodeAddr=10.77.0.11 CPUs=4" in text
    assert "Gres=" not in text.split("NodeName=")[1]
    assert conf_text.gres_conf(lay) == "AutoDetect=off\n"


def test_gres_conf_uses_character_device_files():
    assert conf_text.gres_conf(layout(gpus_per_node=2)) == \
        "AutoDetect=off\nNodeName=node[1-3] Name=gpu File=/s/fakegpu/nvidia[0-1]\n"
    assert conf_text.gres_conf(layout(gpus_per_node=1)).endswith("File=/s/fakegpu/nvidia0\n")


def test_slurmdbd_conf_points_at_our_own_database_port():
    text = conf_text.slurmdbd_conf(layout(slot=9), "pw")
    assert "StorageHost=127.0.0.1" in text.splitlines()
    assert "StoragePort=13397" in text.splitlines()
    assert "DbdPort=16909" in text.splitlines() and "AuthInfo=socket=/s/munge/munge.socket" in text.splitlines()
    assert "StoragePass=pw" in text.splitlines()
    # the nodes reach slurmdbd on the bridge (sacct from a node), as a real cluster's do
    assert "DbdAddr=10.77.9.1" in text.splitlines()
    assert "AccountingStorageHost=10.77.9.1" in conf_text.slurm_conf(layout(slot=9)).splitlines()


def test_names_and_addresses():
    lay = layout(nodes=12)
    assert lay.node_names[-1] == "node12"
    assert lay.nodelist == "node[1-12]"
    assert lay.node_addr("node12") == "10.77.0.22"
    assert lay.netns("node2") == "slurmtools-mini-node2"
    assert len(lay.veth("node12")) <= 15
    with pytest.raises(ValueError, match="unknown node 'node13'"):
        lay.node_addr("node13")


@pytest.mark.parametrize("nodes", [0, 241])
def test_node_count_is_bounded(nodes):
    with pytest.raises(ValueError, match="nodes must be between 1 and 240"):
        layout(nodes=nodes)


def test_named_clusters_share_nothing():
    first, second = MiniClusterLayout(name="mini"), MiniClusterLayout(name="test", slot=1)
    assert first.root == BASE_DIR / "mini" and second.root == BASE_DIR / "test"
    for attribute in ("subnet", "bridge", "slurmctld_port", "slurmd_port", "slurmdbd_port", "db_port", "munge_socket",
                      "slurm_conf", "cluster_name", "registry_file", "first_job_id"):
        assert getattr(first, attribute) != getattr(second, attribute), attribute
    # job ids too: the clusters' node2 share Slurm's cgroup dir slurm_node2, where job_<id> must not collide
    assert "\nFirstJobId=1\n" in conf_text.slurm_conf(first) and "\nFirstJobId=100001\n" in conf_text.slurm_conf(second)
    assert MiniClusterLayout(name="last", slot=99).first_job_id + 100_000 < 0x03ff0000     # Slurm's MaxJobId
    assert {first.netns("node1"), first.veth("node1")}.isdisjoint({second.netns("node1"), second.veth("node1")})
    assert second.subnet == "10.77.1.0/24" and second.bridge == "st-test"
    widest = MiniClusterLayout(name="abcdefgh", slot=99, nodes=240)
    assert widest.veth("node240") == "stabcdefghv240" and len(widest.veth("node240")) <= 15 and len(widest.bridge) <= 15
    assert widest.node_addr("node240") == "10.77.99.250" and "NodeAddr=10.77.99.[11-250]" in conf_text.slurm_conf(widest)
    # interface names follow the name, not the slot: a layout with a wrong slot cannot touch another's
    assert MiniClusterLayout(name="test", slot=0).veth("node1") != MiniClusterLayout(name="mini", slot=0).veth("node1")


@pytest.mark.parametrize("name", ["", "Mini", "1st", "toolongname", "a-b", "a b", "../x"])
def test_cluster_names_are_short_and_plain(name):
    with pytest.raises(ValueError, match="cluster name must be 1-8 lower-case letters or digits"):
        MiniClusterLayout(name=name)


def test_nodes_resolve_through_the_clusters_own_hosts_file():
    assert node_files.render_hosts(layout(nodes=2)).splitlines()[1:] == [
        "127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", "10.77.0.1 vm",
        "10.77.0.11 node1", "10.77.0.12 node2"]
    assert layout().hosts_file == Path("/s/etc/hosts")


def test_job_user_ids_skip_every_taken_uid_and_gid() -> None:
    """The job user's id is the first free as both uid and gid, never derived from the slot: a
    stopped demo cluster keeps its user (uid 64100) and the next cluster must not collide with it."""
    from slurmtools.minicluster import jobuser

    assert jobuser._free_id(set(), set()) == jobuser.JOB_UID_BASE
    assert jobuser._free_id({64100, 64102}, {64101}) == 64103


def test_job_user_ids_exhausted_is_one_line_error() -> None:
    from slurmtools.errors import MiniClusterError
    from slurmtools.minicluster import jobuser

    every = set(range(jobuser.JOB_UID_BASE, jobuser.JOB_UID_BASE + jobuser.JOB_UID_COUNT))
    with pytest.raises(MiniClusterError, match="no free uid/gid in 64100..64499"):
        jobuser._free_id(every, set())


def test_each_node_gets_its_own_memory_directory_through_the_task_prolog():
    lay = layout(nodes=2)
    assert f"TaskProlog={lay.etc_dir}/task-prolog" in conf_text.slurm_conf(lay).splitlines()
    assert node_files.node_memory_root(lay) == Path(f"/dev/shm/slurmtools-minicluster-{lay.name}")
    assert node_files.task_prolog_text(lay).splitlines()[-1] == (
        f'echo "export SLURMTOOLS_NODE_LOCAL_DIR=/dev/shm/slurmtools-minicluster-{lay.name}/$(hostname)"')


def test_a_daemon_is_alive_only_as_its_own_program_not_as_a_pid_reused_by_another():
    """pid numbers wrap (pid_max 32768): a stopped slurmd's pid soon belongs to another process."""
    import subprocess
    from slurmtools.minicluster import daemons
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert daemons.daemon_alive("sleep", sleeper.pid)
        assert not daemons.daemon_alive("slurmd-node66", sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not daemons.daemon_alive("sleep", sleeper.pid)


def test_a_pid_is_stopped_only_while_it_is_this_clusters_daemon(tmp_path):
    """R131: a 128-node cluster going down sent SIGTERM to the pid its killed node's slurmd had had,
    by then another lane's srun. A daemon is stopped only while its program is that daemon and its
    command line or environment names this cluster's state dir (a Slurm daemon's SLURM_CONF)."""
    import os
    import subprocess
    from slurmtools.minicluster import daemons
    ours, other = layout(state_dir=tmp_path / "t"), layout(state_dir=tmp_path / "t-work")
    daemon = subprocess.Popen(["sleep", "30"], env=dict(os.environ, SLURM_CONF=str(ours.slurm_conf)))
    reused = subprocess.Popen(["sleep", "30"], env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    stranger = subprocess.Popen(["sleep", "30"], env=dict(os.environ, SLURM_CONF=str(other.slurm_conf)))
    try:
        assert daemons.is_ours(ours, "sleep", daemon.pid)
        assert not daemons.is_ours(ours, "slurmd-node1", daemon.pid)        # not that daemon's program
        assert not daemons.is_ours(other, "sleep", daemon.pid)             # a dir whose name is a prefix
        assert not daemons.is_ours(ours, "sleep", stranger.pid)            # another cluster's
        assert not daemons.is_ours(ours, "sleep", reused.pid)              # nobody's daemon
        daemons.stop_daemon(ours, "sleep", stranger.pid, timeout_s=1)
        daemons.stop_daemon(ours, "sleep", reused.pid, timeout_s=1)
        daemons.stop_daemon(ours, "slurmd-node1", daemon.pid, timeout_s=1)
        assert (stranger.poll(), reused.poll(), daemon.poll()) == (None, None, None)   # none was ours
        daemons.stop_daemon(ours, "sleep", daemon.pid, timeout_s=5)
        assert daemon.wait(timeout=5) == -15                               # ours: SIGTERM
    finally:
        for proc in (daemon, reused, stranger):
            proc.kill()
            proc.wait()
    assert not daemons.is_ours(ours, "sleep", daemon.pid)


def test_a_daemon_named_by_its_command_line_is_ours(tmp_path):
    """MariaDB and munged carry the cluster's dir on their command line (--datadir, --socket)."""
    import subprocess
    import sys
    import time
    from slurmtools.minicluster import daemons
    ours = layout(state_dir=tmp_path / "t")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", f"--socket={ours.munge_socket}"])
    try:
        deadline = time.monotonic() + 10
        while f"--socket={ours.munge_socket}".encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        assert daemons.is_ours(ours, comm, proc.pid)
        assert not daemons.is_ours(layout(state_dir=tmp_path / "u"), comm, proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_up_says_what_it_begins_before_apt_runs(monkeypatch, tmp_path):
    """`minicluster up` once printed nothing for minutes while apt ran: the first phase is said first."""
    from slurmtools.minicluster import cluster

    class AptStarted(Exception):
        pass

    def apt(packages):
        raise AptStarted()

    monkeypatch.setattr(cluster, "require_root", lambda: None)
    monkeypatch.setattr(cluster, "install_packages", apt)
    lines = []
    with pytest.raises(AptStarted):
        cluster.up(MiniClusterLayout(name="t", state_dir=tmp_path), progress=lines.append)
    assert lines == ["checking the packages (apt-get installs what is missing: minutes the first time)"]


def test_status_rows_are_what_the_table_and_its_json_show():
    from slurmtools.minicluster import cluster
    from slurmtools.slurm.parse import NodeInfo
    nodes = [NodeInfo("node1", "idle", (), "", "", "", "gpu:4"),
             NodeInfo("node2", "idle", ("DRAIN",), "slurmtools gpu.ecc", "root", "", "gpu:4")]
    rows = cluster.node_rows(nodes)
    assert [row["node"] for row in rows] == ["node1", "node2"] and rows[1]["reason"] == "slurmtools gpu.ecc"
    assert rows[0]["reason"] == "" and rows[1]["state"] == nodes[1].display_state
    table = cluster.format_table(nodes).splitlines()
    assert table[0].split() == ["NODE", "STATE", "GRES", "REASON"] and table[1].split()[-1] == "-"
    assert table[2].endswith("slurmtools gpu.ecc")


@pytest.mark.parametrize("nodes, probe_s, deadline_s", [(3, 3, 5), (12, 3, 5), (20, 5, 7), (130, 32, 34)])
def test_the_rehearsals_probe_time_box_grows_with_the_nodes_sharing_its_cores(nodes, probe_s, deadline_s):
    """130 nodes' epilogs at once on 2 cores: a 3-s probe timed out and drained healthy nodes (R87)."""
    from slurmtools.health import config

    parsed = config.parse_config(node_files.render_health_config(layout(nodes=nodes)), "health.yaml")
    settings = parsed.for_host("node1")
    assert (settings.probe_timeout_s, settings.deadline_s) == (probe_s, deadline_s)


@pytest.mark.parametrize("cpus, launcher, processes, expected", [
    (2, "torchrun", 1, 2), (2, "torchrun", 4, 2),      # torchrun: one task a node, every CPU
    (2, "srun", 1, 2), (2, "srun", 2, 1), (8, "srun", 2, 4),
    (2, "srun", 4, 1),                                 # more processes than CPUs: one each, shared
])
def test_a_job_takes_whole_nodes(cpus, launcher, processes, expected):
    assert whole_node_task_cpus(cpus, launcher, processes) == expected


def test_the_arp_table_floor_holds_a_full_mesh_below_the_threshold_where_entries_are_collected():
    for nodes in (3, 33, 130, 240):
        floor = netns.neighbour_table_floor(nodes)
        assert floor["gc_thresh1"] >= nodes * nodes + nodes + 128
        assert floor["gc_thresh1"] < floor["gc_thresh2"] < floor["gc_thresh3"]
    assert netns.neighbour_table_floor(33) == {"gc_thresh1": 1250, "gc_thresh2": 2756, "gc_thresh3": 5512}


def test_the_arp_table_is_raised_never_lowered(tmp_path):
    (tmp_path / "gc_thresh1").write_text("128\n")
    (tmp_path / "gc_thresh2").write_text("512\n")
    (tmp_path / "gc_thresh3").write_text("900000\n")          # an admin's own, higher
    netns.raise_neighbour_table(33, tmp_path, tmp_path / "run" / "neighbour-table.lock")
    assert [(tmp_path / name).read_text() for name in ("gc_thresh1", "gc_thresh2", "gc_thresh3")] == [
        "1250\n", "2756\n", "900000\n"]
