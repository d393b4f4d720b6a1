"""The mini-cluster is a real Slurm: nodes, GRES, multi-node jobs, accounting, node failure."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults
from slurmtools.minicluster import daemons, netns, node_files
from slurmtools.minicluster.sysrun import run
from slurmtools.slurm import commands as slurm
from tests.cluster import asuser, training
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster


def finished(job_id: int):
    info = slurm.job_state(job_id)
    return info if info.finished else None


@pytest.mark.every_release
def test_three_idle_nodes_with_four_gpus(cluster):
    nodes = slurm.nodes()
    assert [(n.name, n.state, n.gres) for n in nodes] == [
        ("node1", "idle", "gpu:4"), ("node2", "idle", "gpu:4"), ("node3", "idle", "gpu:4")]
    assert mc.format_table(nodes).splitlines()[0].split() == ["NODE", "STATE", "GRES", "REASON"]


def test_every_node_and_the_controller_wait_for_a_late_arp_answer(cluster):
    """A loaded machine answers ARP late: the nodes' and the bridge's broadcast probes are raised
    (slurmtools/minicluster/netns.py), the unicast probes a partition fails on are not."""
    shown = [run(["ip", *(["-n", cluster.netns(node)] if node else []), "ntable", "show", "name", "arp_cache",
                  "dev", "eth0" if node else cluster.bridge]).stdout for node in [*cluster.node_names, ""]]
    assert all(f"ucast_probes 3 mcast_probes {netns.ARP_BROADCAST_PROBES} " in text for text in shown), shown


def test_the_machines_arp_table_holds_a_full_mesh_of_the_nodes(cluster):
    """One ARP table for every namespace: its limits raised for this cluster's full mesh."""
    held = {name: int((netns.NEIGHBOUR_TABLE_DIR / name).read_text()) for name in netns.KERNEL_NEIGHBOUR_DEFAULTS}
    floor = netns.neighbour_table_floor(cluster.nodes)
    assert all(held[name] >= floor[name] for name in floor), (held, floor)


def test_second_up_is_harmless(cluster):
    before = mc.load_record(cluster)["pids"]
    mc.up(cluster, install=False, wait_s=30)
    assert mc.load_record(cluster)["pids"] == before
    assert all(n.state == "idle" for n in slurm.nodes())


@pytest.mark.every_release
def test_two_node_job_hostnames_gpus_and_cross_node_tcp(cluster, user_tmp: Path):
    out = user_tmp / "job.out"
    script = f"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --gpus-per-node=2 -o {out}
set -euo pipefail
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
srun bash -c 'echo "task $SLURM_PROCID host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES"' | sort
# rank 1 listens on the second node; the first node connects to it by name. The project's Python,
# as a user's job runs its own: another release's root has no python3 of its own.
srun -N1 -n1 -w "${{nodes[1]}}" {sys.executable} -c '
import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29555)); s.listen(1); c,a=s.accept(); print("server got", c.recv(64).decode())' &
srun -N1 -n1 -w "${{nodes[0]}}" {sys.executable} -c '
import socket, sys, time
for _ in range(100):
    try:
        s=socket.create_connection((sys.argv[1], 29555), timeout=1); break
    except OSError: time.sleep(0.1)
s.sendall(("hello from " + socket.gethostname()).encode())' "${{nodes[1]}}"
wait
"""
    job = training.submit_script(script)
    info = wait_for(lambda: finished(job), 60, f"job {job} to finish")
    text = out.read_text()
    assert info.state == "COMPLETED", text
    lines = text.splitlines()
    # whichever two nodes Slurm picked (a node still finishing an earlier test's job is skipped)
    hosts = [line.split("host=")[1].split()[0] for line in lines[:2]]
    assert lines[:2] == [f"task 0 host={hosts[0]} gpus=0,1", f"task 1 host={hosts[1]} gpus=0,1"]
    assert hosts[0] != hosts[1] and f"server got hello from {hosts[0]}" in lines
    # The nodes the job ran on, from its own tasks: a node list read when the job ends can be taken
    # while it is COMPLETING, when Slurm (26.05 seen) lists only the batch host still completing.
    from ClusterShell.NodeSet import NodeSet
    nodelist = str(NodeSet.fromlist(hosts))
    # accounting through slurmdbd/MariaDB sees the finished job; sacct lags, and right after
    # the end it may list only the batch host, so wait for the whole record.
    wait_for(lambda: [r for r in slurm.sacct_rows(job) if r["JobID"] == str(job) and r["State"] == "COMPLETED"
                      and r["NodeList"] == nodelist], 30, f"sacct to report COMPLETED on {nodelist}")
    assert slurm.parse_sacct_json(slurm.run_slurm(["sacct", "--json", "-j", str(job)]), job).state == "COMPLETED"


# Slurm's own requeue of a killed node's job (no slurmtools in it): on the other releases a killed
# node is covered by test_faults.py::test_c and test_recovery.py::test_b
def test_killed_node_goes_down_and_requeue_job_reruns_elsewhere(cluster, user_tmp: Path):
    out = user_tmp / "requeue.out"
    script = f"""#!/bin/bash
#SBATCH -N2 -w node[1-2] --requeue --open-mode=append -o {out}
echo "start restart=${{SLURM_RESTART_COUNT:-0}} nodes=$SLURM_JOB_NODELIST"
srun bash -c '(while :; do sleep 2 & sleep 0.05; done) & touch "$SLURMTOOLS_NODE_LOCAL_DIR/in-memory-$SLURM_JOB_ID"; echo "memory $(hostname) $SLURMTOOLS_NODE_LOCAL_DIR"; sleep 300'
"""
    # each task forks all the time (as torchrun does while it starts its ranks): a child forked
    # between the kill's listing of the node's processes and the kill of its parent must go too
    # -w pins the first run to node[1-2]; the rerun must avoid the dead node2. Both must be idle first:
    # the previous test's job may still be completing on one of them (its epilog) when this one starts.
    wait_for(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes("node[1-2]")), 60, "node[1-2] idle")
    job = training.submit_script(script)
    wait_for(lambda: slurm.job_state(job).state == "RUNNING" and out.exists() and out.read_text().count("memory") == 2,
             30, "job to run")
    # each node its own memory directory (the cluster's TaskProlog), as /dev/shm is on a real node
    memory = node_files.node_memory_root(cluster)
    assert sorted(line for line in out.read_text().splitlines() if line.startswith("memory")) == [
        f"memory node1 {memory}/node1", f"memory node2 {memory}/node2"]
    assert (memory / "node2" / f"in-memory-{job}").exists()
    time.sleep(1)
    assert faults.kill_node(cluster, "node2")
    assert netns.namespace_pids(cluster, "node2") == []              # nothing outlived its node
    assert list((memory / "node2").iterdir()) == []                   # its RAM went with it
    assert (memory / "node1" / f"in-memory-{job}").exists()
    try:
        wait_for(lambda: any(n.name == "node2" and n.state == "down" for n in slurm.nodes()), 120, "node2 DOWN")
        # -w node[1-2] can no longer be satisfied: drop the pin so Slurm places the rerun.
        asuser.call(slurm.update_job, job, ReqNodeList="", ExcNodeList="node2")     # by its user
        wait_for(lambda: "restart=1" in out.read_text(), 90, "the job to rerun")
        rerun = [ln for ln in out.read_text().splitlines() if "restart=1" in ln][0]
        assert rerun == "start restart=1 nodes=node[1,3]"
    finally:
        training.cancel(job)
        faults.restart_node(cluster, "node2")
        wait_for(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 60, "all nodes idle again")


def test_partition_and_heal_change_link_state(cluster):
    faults.partition_node(cluster, "node3")
    try:
        state = Path(f"/sys/class/net/{cluster.veth('node3')}/operstate").read_text().strip()
        assert state == "down"
        # node3's slurmd port is unreachable while partitioned
        assert not daemons.port_open(cluster.node_addr("node3"), cluster.slurmd_port)
    finally:
        faults.heal_node(cluster, "node3")
    wait_for(lambda: Path(f"/sys/class/net/{cluster.veth('node3')}/operstate").read_text().strip() == "up",
             10, "link up")
    wait_for(lambda: daemons.port_open(cluster.node_addr("node3"), cluster.slurmd_port), 10, "node3 reachable again")


def _hosts_job(out: Path) -> str:
    return f"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 -o {out}
srun bash -c 'echo "$(hostname) $(getent hosts "$(hostname)" | cut -d" " -f1)"' | sort
"""


def _submit_on(layout, script: str) -> int:
    with slurm.using_conf(layout.slurm_conf, layout.client_bin_dir):
        return slurm.submit(script)


def test_a_second_named_cluster_runs_beside_this_one_and_touches_nothing(cluster, user_tmp: Path):
    from slurmtools.errors import MiniClusterError
    from slurmtools.minicluster.layout import MiniClusterLayout
    from tests.conftest import REPO, TEST_SLURM_RELEASE, cluster_up_lock

    # the suite's release (its client commands are first on PATH): another release's root of its own
    other_dir = Path("/var/tmp/slurmtools-side-other")
    with cluster_up_lock():
        side = mc.layout_for_up("side", Path("/var/tmp/slurmtools-side-cluster"), nodes=2, gpus_per_node=0,
                                prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d",
                                slurm_release=TEST_SLURM_RELEASE)
        try:
            mc.up(side, install=False, wait_s=60)
        except BaseException:
            mc.down(side, purge=True)
            raise
    try:
        assert side.slot != cluster.slot and {side.bridge, side.subnet}.isdisjoint({cluster.bridge, cluster.subnet})
        # the same ordinary user submits to each (both clusters' nodes know every account of the machine)
        side_job = asuser.call(_submit_on, side, _hosts_job(user_tmp / "side.out"))
        test_job = asuser.call(_submit_on, cluster, _hosts_job(user_tmp / "test.out"))
        with slurm.using_conf(side.slurm_conf, side.client_bin_dir):
            assert wait_for(lambda: finished(side_job), 60, "the side cluster's job").state == "COMPLETED"
        assert wait_for(lambda: finished(test_job), 60, "the suite cluster's job").state == "COMPLETED"
        # both clusters have a node1 and a node2; each job resolves its own cluster's addresses
        assert (user_tmp / "side.out").read_text().splitlines() == [
            f"node1 {side.subnet_prefix}.11", f"node2 {side.subnet_prefix}.12"]
        assert (user_tmp / "test.out").read_text().splitlines() == [
            f"node1 {cluster.subnet_prefix}.11", f"node2 {cluster.subnet_prefix}.12"]
        listing = mc.format_list().splitlines()
        assert any(line.split()[:2] == ["side", str(side.slot)] and " up " in line for line in listing)
        assert any(line.split()[:2] == [cluster.name, str(cluster.slot)] for line in listing)
        # the name is taken: refused in one line before anything is created
        with pytest.raises(MiniClusterError, match="the name 'side' belongs to the cluster in /var/tmp/slurmtools-side"):
            mc.up(MiniClusterLayout(name="side", slot=side.slot + 1, state_dir=other_dir, nodes=1), install=False)
        assert not other_dir.exists()
    finally:
        mc.down(side, purge=True)
    assert not side.registry_file.exists() and not side.root.exists()
    assert [(n.name, n.state) for n in slurm.nodes()] == [("node1", "idle"), ("node2", "idle"), ("node3", "idle")]


def test_up_refuses_a_port_someone_else_holds_and_changes_nothing(cluster):
    import socket

    from slurmtools.errors import MiniClusterError
    from tests.conftest import REPO, cluster_up_lock

    with cluster_up_lock(), socket.socket() as squatter:
        layout = mc.layout_for_up("porty", Path("/var/tmp/slurmtools-porty-cluster"), nodes=1, gpus_per_node=0,
                                  prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past TIME_WAITs, not past a listener
        squatter.bind(("127.0.0.1", layout.db_port))
        squatter.listen(1)
        with pytest.raises(MiniClusterError, match=f"port {layout.db_port} \\(mariadbd\\) is in use by another program"):
            mc.up(layout, install=False, wait_s=30)
    assert not layout.root.exists() and not layout.registry_file.exists()
    assert not Path(f"/sys/class/net/{layout.bridge}").exists()


def test_down_of_another_name_never_touches_this_cluster(cluster):
    """A `down` of a cluster that never started (no record: any slot, here this cluster's own)
    removes nothing of this one: every interface, namespace and route it could name is its own."""
    from slurmtools.minicluster import netns
    from slurmtools.minicluster.layout import MiniClusterLayout

    ghost = MiniClusterLayout(name="ghost", slot=cluster.slot, state_dir=Path("/var/tmp/slurmtools-ghost-cluster"))
    mc.down(ghost, purge=True)
    assert all(netns.link_exists(cluster.veth(node)) for node in cluster.node_names)
    assert netns.link_exists(cluster.bridge) and netns.subnet_in_use(cluster)
    assert [(n.name, n.state) for n in slurm.nodes()] == [("node1", "idle"), ("node2", "idle"), ("node3", "idle")]
