"""The mini-cluster's config files as text (slurm.conf, gres.conf, cgroup.conf, slurmdbd.conf), pure
functions of its layout: what each setting is and why is in docs/minicluster.md."""
from __future__ import annotations

from typing import List

from slurmtools.minicluster import release
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.slurm.parse import EXPEDITE_SINCE


def slurm_conf(layout: MiniClusterLayout) -> str:
    """slurm.conf tuned for fast, deterministic tests on a 2-core machine (docs/minicluster.md)."""
    gres = f" Gres=gpu:{layout.gpus_per_node}" if layout.gpus_per_node else ""
    last = 10 + layout.nodes
    addrs = (f"{layout.subnet_prefix}.[11-{last}]" if layout.nodes > 1 else f"{layout.subnet_prefix}.11")
    lines = [
        "# Written by `slurmtools minicluster up`; edits are overwritten.",
        f"ClusterName={layout.cluster_name}",
        "# job ids of their own: every cluster's node2 shares the cgroup dir slurm_node2, and a job_5 that",
        "# ends in one cluster would remove a running job_5's cgroups in another",
        f"FirstJobId={layout.first_job_id}",
        f"SlurmctldHost={layout.controller_host}({layout.controller_addr})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "# requeue delay = cred_expire + 1 s (default 120 s); takes effect only on daemon restart",
        f"AuthInfo=cred_expire=10,socket={layout.munge_socket}",
        f"SlurmctldPort={layout.slurmctld_port}",
        f"SlurmdPort={layout.slurmd_port}",
        f"StateSaveLocation={layout.ctld_state_dir}",
        f"SlurmdSpoolDir={layout.root}/slurmd/%n",
        f"SlurmctldPidFile={layout.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={layout.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log_dir}/slurmctld.log",
        f"SlurmdLogFile={layout.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        *_confinement_lines(layout),
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,"
        "bf_interval=1,nohold_on_prolog_fail",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        # a ping round waits for its slowest node (up to MessageTimeout, 10 s, for a killed one)
        # before it records the others' answers: 10 s let Slurm 24.11 mark every node not
        # responding at once and requeue a job from a healthy one (docs/minicluster.md)
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=10",
        "MinJobAge=300",
        "JobRequeue=1",
        *_release_lines(layout),
        f"Prolog={layout.prolog_dir}/*",
        f"Epilog={layout.epilog_dir}/*",
        f"TaskProlog={layout.task_prolog}",
        "PrologFlags=Alloc",
        "# `scontrol reboot` restarts the node's slurmd in a new time namespace (minicluster/reboot.py);",
        "# a node not back within ResumeTimeout is marked DOWN (reboot timed out)",
        f"RebootProgram={layout.reboot_program}",
        "ResumeTimeout=60",
        "# the blames jobs report (slurmtools/blame), handled as root every 10 s besides every prolog/epilog",
        f"HealthCheckProgram={layout.blames_program}",
        "HealthCheckInterval=10",
        "HealthCheckNodeState=ANY",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "# on the bridge, not 127.0.0.1: the nodes reach slurmdbd as a real cluster's do (sacct from a",
        "# node: the blame path's check of a requeued job's earlier nodes, a job's own sacct)",
        f"AccountingStorageHost={layout.controller_addr}",
        f"AccountingStoragePort={layout.slurmdbd_port}",
        "# the munge socket of slurmctld's connection to slurmdbd (AuthInfo's is not used for it)",
        f"AccountingStoragePass={layout.munge_socket}",
        "AccountingStorageTRES=gres/gpu",
        f"NodeName={layout.nodelist} NodeAddr={addrs} CPUs={layout.cpus_per_node} Sockets=1 "
        f"CoresPerSocket={layout.cpus_per_node} ThreadsPerCore=1 RealMemory={layout.mem_per_node_mb}"
        f"{gres} State=UNKNOWN",
        f"PartitionName={layout.partition} Nodes={layout.nodelist} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _release_lines(layout: MiniClusterLayout) -> List[str]:
    """Settings only some releases know: expedited requeue (sbatch --requeue=expedite) from 25.11."""
    if layout.slurm_release and release.release_tuple(layout.slurm_release) >= EXPEDITE_SINCE:
        return ["SlurmctldParameters=enable_expedited_requeue"]
    return []


def _confinement_lines(layout: MiniClusterLayout) -> List[str]:
    """cgroups: each job is confined to its CPUs (and bound to them), its memory (a step past
    --mem is OOM-killed) and its GPUs' device files; memory is a consumable resource."""
    if not layout.cgroups:
        return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectTypeParameters=CR_CPU"]
    return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity",
            "SelectTypeParameters=CR_CPU_Memory",
            f"DefMemPerCPU={layout.mem_per_node_mb // layout.cpus_per_node}"]


def cgroup_conf(layout: MiniClusterLayout) -> str:
    if not layout.cgroups:
        return "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"
    return ("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\nConstrainCores=yes\nConstrainRAMSpace=yes\n"
            "ConstrainDevices=yes\n")


def gres_conf(layout: MiniClusterLayout) -> str:
    """Fake GPUs must be character devices: file-less or regular-file GRES are dropped in 22.05."""
    if not layout.gpus_per_node:
        return "AutoDetect=off\n"
    last = layout.gpus_per_node - 1
    files = f"nvidia[0-{last}]" if last else "nvidia0"
    return f"AutoDetect=off\nNodeName={layout.nodelist} Name=gpu File={layout.fake_gpu_dir}/{files}\n"


def slurmdbd_conf(layout: MiniClusterLayout, db_password: str) -> str:
    return "\n".join([
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "DbdHost=localhost",
        f"DbdAddr={layout.controller_addr}",
        f"DbdPort={layout.slurmdbd_port}",
        "SlurmUser=root",
        f"PidFile={layout.run_dir}/slurmdbd.pid",
        f"LogFile={layout.log_dir}/slurmdbd.log",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={layout.db_port}",
        "StorageUser=slurm",
        f"StoragePass={db_password}",
        "StorageLoc=slurm_acct_db",
    ]) + "\n"
