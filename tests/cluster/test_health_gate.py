"""Node health gating on the real mini-cluster: prolog drains with our reason, the job runs
elsewhere, a person's drain is never touched, the epilog catches stray processes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmtools.health.fixture_data import write_ib_tree, xid_line
from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def health_config(cluster):
    """Rewrite the cluster's health config for one test; restore it and every node afterwards."""
    path = cluster.health_config
    original = path.read_text()
    training.settle()

    def write(extra_hosts: str) -> None:
        path.write_text(original + "hosts:\n" + extra_hosts)
    yield write
    path.write_text(original)
    for n in slurm.nodes():
        if n.drained:
            slurm.resume_node(n.name)
    wait_for(training.all_idle, 30, "nodes idle")


def two_node_job(out: Path) -> int:
    return training.submit_script(f"#!/bin/bash\n#SBATCH -N2 -o {out}\nsrun hostname | sort\n")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmtools", *args], capture_output=True, text=True, timeout=60)


def faults(tmp: Path):
    tree = write_ib_tree(tmp / "ibroot", 4, faults=["port-down"])  # the fault is on mlx5_3
    log = tmp / "kmsg"
    log.write_text(xid_line(7, 54))
    return {
        "ecc": ('    gpu_probe: "fixture:minicluster-4gpu-ecc-uncorrected"\n',
                "slurmtools: CRITICAL gpu.ecc gpu=3 uncorrected=2 job="),
        "xid54": (f"    kernel_log: {log}\n", "slurmtools: CRITICAL gpu.xid xid=54 action=drain gpu=3 pci=0000:5d:00 job="),
        "ib-port-down": (f"    sysfs_root: {tree}\n", "slurmtools: CRITICAL ib.ports ports=mlx5_3/1 state=DOWN phys_state=Disabled job="),
        "hung-probe": ('    gpu_probe: "fixture:minicluster-4gpu-hang"\n    probe_timeout_s: 1\n',
                       "slurmtools: CRITICAL gpu.count NVML probe: timed out after 1 s job="),
    }


# on every release: one NVML fault and one InfiniBand (sysfs) fault (the prolog's drain is the same
# Slurm path for all four; which finding it reports is release-independent)
@pytest.mark.parametrize("fault", [pytest.param("ecc", marks=pytest.mark.every_release), "xid54",
                                   pytest.param("ib-port-down", marks=pytest.mark.every_release), "hung-probe"])
def test_faulty_node_is_drained_by_its_prolog_and_the_job_runs_elsewhere(health_config, shared_tmp, user_tmp,
                                                                          fault):
    setting, reason = faults(shared_tmp)[fault]
    health_config("  - match: node2\n" + setting)
    out = user_tmp / "job.out"
    job = two_node_job(out)
    info = wait_for(lambda: (lambda i: i if i.finished else None)(slurm.job_state(job)), 90, "job to finish")
    assert info.state == "COMPLETED"
    assert out.read_text().split()[-2:] == ["node1", "node3"]
    node2 = slurm.nodes("node2")[0]
    assert node2.drained and node2.reason == f"{reason}{job}"
    assert [n.name for n in slurm.nodes() if n.drained] == ["node2"]


@pytest.mark.every_release
def test_a_persons_drain_is_left_alone_by_resume_and_auto_resume(health_config):
    health_config("  - match: node3\n    auto_resume_after: 1\n")
    slurm.drain_node("node3", "manual: bad HBM ECC")
    refused = cli("nodes", "resume", "node3")
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("slurmtools: error: node3 was drained by root ('manual: bad HBM ECC'); "
                                      "not ours to resume (use --force)")
    for _ in range(2):
        assert cli("health", "run", "--phase", "periodic", "--node", "node3").returncode == 0
    node3 = slurm.nodes("node3")[0]
    assert node3.drained and node3.reason == "manual: bad HBM ECC"
    listing = cli("nodes")
    assert "node3" in listing.stdout and "manual: bad HBM ECC" in listing.stdout


def test_our_drain_is_auto_resumed_after_clean_periodic_runs(health_config):
    health_config('  - match: node2\n    auto_resume_after: 2\n')
    slurm.drain_node("node2", "slurmtools: CRITICAL gpu.ecc gpu=1 uncorrected=1 job=9")
    first = cli("health", "run", "--phase", "periodic", "--node", "node2")
    assert first.returncode == 0 and slurm.nodes("node2")[0].drained
    second = cli("health", "run", "--phase", "periodic", "--node", "node2")
    assert "resumed after 2 clean runs" in second.stdout
    wait_for(lambda: not slurm.nodes("node2")[0].drained, 10, "node2 resumed")


def test_manual_drain_through_slurmtools_is_resumable_but_not_auto_resumed(health_config):
    health_config("  - match: node1\n    auto_resume_after: 1\n")
    assert cli("nodes", "drain", "node1", "--reason", "swap DIMM B3").returncode == 0
    assert slurm.nodes("node1")[0].reason == "slurmtools: MANUAL admin swap DIMM B3 by=root"
    cli("health", "run", "--phase", "periodic", "--node", "node1")
    assert slurm.nodes("node1")[0].drained
    assert cli("nodes", "resume", "node1").returncode == 0
    wait_for(lambda: not slurm.nodes("node1")[0].drained, 10, "node1 resumed")


def test_epilog_finding_a_stray_gpu_process_drains_the_node(health_config, user_tmp):
    health_config('  - match: node3\n    gpu_probe: "fixture:minicluster-4gpu-stray-process"\n'
                  "    checks: {gpu: {processes: {phases: [epilog]}}}\n")
    job = training.submit_script(f"#!/bin/bash\n#SBATCH -N1 -w node3 -o {user_tmp}/e.out\ntrue\n")
    wait_for(lambda: slurm.nodes("node3")[0].drained, 60, "node3 drained by its epilog")
    assert slurm.nodes("node3")[0].reason == f"slurmtools: CRITICAL gpu.processes gpu=3 pids=4242 after the job job={job}"
    # the drain happens inside the epilog, while the job is still COMPLETING: wait for the end
    final = wait_for(lambda: (lambda info: info if info.finished else None)(slurm.job_state(job)), 30,
                     f"job {job} to finish its epilog")
    assert final.state == "COMPLETED"


def test_config_error_fails_open_and_drains_nothing(health_config, user_tmp):
    health_config("  - match: node1\n    checks: {gpu: {ecc: {corected_warn: 1}}}\n")
    out = user_tmp / "ok.out"
    job = training.submit_script(f"#!/bin/bash\n#SBATCH -N1 -w node1 -o {out}\nhostname\n")
    info = wait_for(lambda: (lambda i: i if i.finished else None)(slurm.job_state(job)), 60, "job to finish")
    assert info.state == "COMPLETED" and out.read_text().strip() == "node1"
    assert not any(n.drained for n in slurm.nodes())
    bad = cli("health", "run", "--phase", "prolog", "--node", "node1", "--no-drain")
    assert bad.returncode == 2 and "did you mean 'corrected_warn'" in bad.stderr and "Traceback" not in bad.stderr


def test_healthy_cluster_running_many_jobs_never_drains(cluster, user_tmp):
    training.settle()
    jobs = [training.submit_script(f"#!/bin/bash\n#SBATCH -N{1 + i % 3} -o {user_tmp}/m{i}.out\nsrun true\n")
            for i in range(12)]
    for job in jobs:
        info = wait_for(lambda: (lambda i: i if i.finished else None)(slurm.job_state(job)), 120, f"job {job}")
        assert info.state == "COMPLETED"
    assert not any(n.drained or n.state == "down" for n in slurm.nodes())


def _node2_report(cluster) -> str:
    node = slurm.nodes("node2")[0]
    log = cluster.log_dir / "slurmd-node2.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else "(no slurmd log)"
    return f"node2 state={node.display_state} flags={node.flags} reason={node.reason!r}\n{tail}"


@pytest.mark.every_release
def test_a_reset_class_xid_reboots_its_node_back_into_service_and_a_second_one_drains(cluster, health_config,
                                                                                       shared_tmp, user_tmp):
    from slurmtools.minicluster import daemons
    (cluster.root / "health" / "node2" / "state.json").unlink(missing_ok=True)   # no earlier reboots counted
    log = shared_tmp / "kmsg"
    log.write_text(xid_line(1007, 79))      # GPU fallen off the bus: the catalogue's action is a restart
    health_config(f"  - match: node2\n    kernel_log: {log}\n    max_reboots_per_day: 1\n")
    slurmd_before = daemons.read_pidfile(cluster.slurmd_pidfile("node2"))
    out = user_tmp / "after-reboot.out"
    job = training.submit_script(f"#!/bin/bash\n#SBATCH -N1 -w node2 -o {out}\nhostname\n")
    # the prolog asks for the reboot and fails; the job is requeued, waits for node2, and runs
    # there once node2 is back, with a clean prolog (the XID was seen before the reboot)
    try:
        info = wait_for(lambda: (lambda i: i if i.finished else None)(slurm.job_state(job)), 150,
                        "job to run on node2 after its reboot")
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{_node2_report(cluster)}")
    assert info.state == "COMPLETED" and out.read_text().strip() == "node2"
    assert daemons.read_pidfile(cluster.slurmd_pidfile("node2")) != slurmd_before    # it was "rebooted"
    wait_for(lambda: (lambda n: n.state == "idle" and not n.drained and "COMPLETING" not in n.flags)(
        slurm.nodes("node2")[0]), 30, "node2 idle after its job's epilog")
    state = (cluster.root / "health" / "node2" / "state.json").read_text()
    assert '"reboot_times": [' in state

    # a second reset-class fault within 24 h: drained for a person, no second reboot
    with open(log, "a") as fh:
        fh.write(xid_line(1008, 79))
    second = cli("health", "run", "--phase", "periodic", "--node", "node2")
    assert second.returncode == 3, second.stderr
    node2 = slurm.nodes("node2")[0]
    assert node2.drained and node2.reason == "slurmtools: CRITICAL gpu.xid xid=79 action=reboot gpu=3 pci=0000:5d:00"
    assert "drained: reset-class fault again after 1 reboot(s) in 24 h" in second.stdout
    assert "REBOOT" not in " ".join(node2.flags)
