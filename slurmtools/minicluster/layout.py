"""Pure description of a mini-cluster: paths, names, addresses and the config files' text.

Nothing here touches the system, so every setting is unit-tested as text.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

DEFAULT_STATE_DIR = Path(os.environ.get("SLURMTOOLS_MINICLUSTER_DIR", "/var/lib/slurmtools/minicluster"))
HOSTS_BEGIN = "# BEGIN slurmtools-minicluster"
HOSTS_END = "# END slurmtools-minicluster"
MAX_NODES = 32

# Debian 12 packages the cluster needs (--no-install-recommends is enough: 28 packages, the
# --json plugins included; apt starts no daemon here, policy-rc.d refuses).
REQUIRED_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd",
                     "mariadb-server", "iproute2", "util-linux")


@dataclass(frozen=True)
class MiniClusterLayout:
    """Everything that names a piece of the mini-cluster; derived values are properties."""

    state_dir: Path = DEFAULT_STATE_DIR
    nodes: int = 3
    gpus_per_node: int = 4
    cpus_per_node: int = 4
    mem_per_node_mb: int = 4000
    controller_host: str = "localhost"
    prolog_dir: Path = Path("prolog.d")
    epilog_dir: Path = Path("epilog.d")
    subnet_prefix: str = "10.77.0"
    bridge: str = "st-br0"
    db_port: int = 3307
    cluster_name: str = "mini"
    partition: str = "gpu"
    extra_env: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 16:
            raise ValueError(f"gpus_per_node must be between 0 and 16, got {self.gpus_per_node}")

    # ---- names and addresses -------------------------------------------------
    @property
    def node_names(self) -> List[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def nodelist(self) -> str:
        return f"node[1-{self.nodes}]" if self.nodes > 1 else "node1"

    @property
    def controller_addr(self) -> str:
        return f"{self.subnet_prefix}.1"

    def node_addr(self, node: str) -> str:
        return f"{self.subnet_prefix}.{10 + self.node_index(node)}"

    def node_index(self, node: str) -> int:
        if node not in self.node_names:
            raise ValueError(f"unknown node {node!r}; this mini-cluster has {self.nodelist}")
        return int(node[len("node"):])

    def netns(self, node: str) -> str:
        """Network namespace name; prefixed so it never collides with an admin's own."""
        self.node_index(node)
        return f"slurmtools-{node}"

    def veth(self, node: str) -> str:
        """Host-side veth name (kernel limit: 15 characters)."""
        return f"st-veth{self.node_index(node)}"

    # ---- paths ---------------------------------------------------------------
    @property
    def etc_dir(self) -> Path:
        return self.state_dir / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def fake_gpu_dir(self) -> Path:
        return self.state_dir / "fakegpu"

    @property
    def db_dir(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def ctld_state_dir(self) -> Path:
        return self.state_dir / "slurmctld"

    def slurmd_spool_dir(self, node: str) -> Path:
        return self.state_dir / "slurmd" / node

    def slurmd_pidfile(self, node: str) -> Path:
        return self.run_dir / f"slurmd-{node}.pid"

    @property
    def record_file(self) -> Path:
        """What `up` started or changed, so `down` undoes exactly that."""
        return self.state_dir / "record.json"

    # ---- config text ---------------------------------------------------------
    def render_slurm_conf(self) -> str:
        """slurm.conf tuned for fast, deterministic tests on a 2-core machine (docs/minicluster.md)."""
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        last = 10 + self.nodes
        addrs = (f"{self.subnet_prefix}.[11-{last}]" if self.nodes > 1 else f"{self.subnet_prefix}.11")
        lines = [
            "# Written by `slurmtools minicluster up`; edits are overwritten.",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.controller_host}({self.controller_addr})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "# requeue delay = cred_expire + 1 s (default 120 s); takes effect only on daemon restart",
            "AuthInfo=cred_expire=10",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            f"StateSaveLocation={self.ctld_state_dir}",
            f"SlurmdSpoolDir={self.state_dir}/slurmd/%n",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,"
            "bf_interval=1,nohold_on_prolog_fail",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "KillWait=10",
            "MinJobAge=300",
            "JobRequeue=1",
            f"Prolog={self.prolog_dir}/*",
            f"Epilog={self.epilog_dir}/*",
            "PrologFlags=Alloc",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            "AccountingStoragePort=6819",
            "AccountingStorageTRES=gres/gpu",
            f"NodeName={self.nodelist} NodeAddr={addrs} CPUs={self.cpus_per_node} Sockets=1 "
            f"CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 RealMemory={self.mem_per_node_mb}"
            f"{gres} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.nodelist} Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def render_gres_conf(self) -> str:
        """Fake GPUs must be character devices: file-less or regular-file GRES are dropped in 22.05."""
        if not self.gpus_per_node:
            return "AutoDetect=off\n"
        last = self.gpus_per_node - 1
        files = f"nvidia[0-{last}]" if last else "nvidia0"
        return f"AutoDetect=off\nNodeName={self.nodelist} Name=gpu File={self.fake_gpu_dir}/{files}\n"

    def render_slurmdbd_conf(self, db_password: str) -> str:
        return "\n".join([
            "AuthType=auth/munge",
            "DbdHost=localhost",
            "DbdPort=6819",
            "SlurmUser=root",
            f"PidFile={self.run_dir}/slurmdbd.pid",
            f"LogFile={self.log_dir}/slurmdbd.log",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}",
            "StorageUser=slurm",
            f"StoragePass={db_password}",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    @property
    def health_config(self) -> Path:
        """Beside slurm.conf, where `slurmtools health run` looks when Slurm sets SLURM_CONF."""
        return self.etc_dir / "slurmtools-health.yaml"

    def render_health_config(self) -> str:
        """The fake nodes' GPUs come from a built-in fixture, named explicitly: a rehearsal cluster."""
        return "\n".join([
            "# Written by `slurmtools minicluster up` (kept when it exists). Rehearsal settings: the",
            "# fake GPUs are served by a built-in NVML fixture, selected explicitly here.",
            "defaults:",
            '  gpu_probe: "fixture:minicluster-4gpu"' if self.gpus_per_node else "  gpu_probe: none",
            "  kernel_log: null",
            f"  state_dir: {self.state_dir}/health",
            "  probe_timeout_s: 3",
            "  deadline_s: 5",
            "  syslog: false",
            "  checks:",
            f"    gpu: {{count: {{expected: {self.gpus_per_node}}}}}",
            "    system: {memory: {min_available_gb: 0.5}, disk: {paths: [/tmp], min_free_gb: 0.5}}",
        ]) + "\n"

    def render_hosts_block(self) -> str:
        lines = [HOSTS_BEGIN]
        lines += [f"{self.node_addr(n)} {n}" for n in self.node_names]
        lines.append(HOSTS_END)
        return "\n".join(lines) + "\n"


def strip_hosts_block(hosts_text: str) -> str:
    """Remove our delimited block from /etc/hosts text, leaving every other line as it was."""
    out: List[str] = []
    inside = False
    for line in hosts_text.splitlines(keepends=True):
        if line.strip() == HOSTS_BEGIN:
            inside = True
            continue
        if inside and line.strip() == HOSTS_END:
            inside = False
            continue
        if not inside:
            out.append(line)
    return "".join(out)


def with_hosts_block(hosts_text: str, block: str) -> str:
    """/etc/hosts text with exactly one copy of our block at the end."""
    base = strip_hosts_block(hosts_text)
    if base and not base.endswith("\n"):
        base += "\n"
    return base + block
