"""Pure description of a mini-cluster: paths, names and addresses (the config files made of them:
conf_text.py).

Nothing here touches the system, so every setting is unit-tested as text.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from slurmtools.minicluster import release

# Named clusters, like kind's: each name has its own state dir, slot (subnet, ports), bridge,
# namespaces, munged and MariaDB, so several run side by side and never touch each other.
DEFAULT_NAME = "mini"
NAME_ENV = "SLURMTOOLS_MINICLUSTER_NAME"  # the mini-cluster `slurmtools minicluster` commands act on (default: mini)
DIR_ENV = "SLURMTOOLS_MINICLUSTER_DIR"  # where mini-clusters keep their state
BASE_DIR = Path(os.environ.get(DIR_ENV, "/var/lib/slurmtools/minicluster"))
# live clusters on this machine (tmpfs: gone after a reboot, like the clusters themselves)
REGISTRY_DIR = Path("/run/slurmtools/minicluster")
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")
MAX_SLOTS = 100
JOB_IDS_PER_SLOT = 100_000
# node i has 10.77.<slot>.(10 + i): the /24 holds up to .250 (measured: docs/minicluster.md)
MAX_NODES = 240

# Debian 12 packages the cluster needs (--no-install-recommends is enough: 28 packages, the
# --json plugins included; apt starts no daemon here, policy-rc.d refuses).
REQUIRED_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd",
                     "mariadb-server", "iproute2", "util-linux")


def default_name() -> str:
    return os.environ.get(NAME_ENV) or DEFAULT_NAME


def whole_node_task_cpus(cpus_per_node: int, launcher: str, processes_per_node: int) -> int:
    """CPUs a task asks of a job that takes whole nodes, as production training does: torchrun's
    one task a node all of them, srun's task a process its share (at least one). Slurm's 1 CPU a
    task binds every job process here to CPU 0, each node being this machine (docs/minicluster.md,
    "Every job on CPU 0")."""
    tasks_per_node = processes_per_node if launcher == "srun" else 1
    return max(1, cpus_per_node // max(1, tasks_per_node))


@dataclass(frozen=True)
class MiniClusterLayout:
    """Everything that names a piece of the mini-cluster; derived values are properties.

    `slot` (0..99) numbers the cluster among those on the machine: subnet 10.77.<slot>.0/24 and
    ports 16817 + 10*slot (slurmctld), +1 (slurmd), +2 (slurmdbd), 13307 + 10*slot (MariaDB),
    all below Linux's ephemeral range."""

    name: str = DEFAULT_NAME
    slot: int = 0
    state_dir: Optional[Path] = None          # default BASE_DIR/<name>
    nodes: int = 3
    gpus_per_node: int = 4
    cpus_per_node: int = 4
    mem_per_node_mb: int = 4000
    controller_host: str = "localhost"
    prolog_dir: Path = Path("prolog.d")
    epilog_dir: Path = Path("epilog.d")
    # real per-node cgroups as production runs them (cores, memory, devices); off only on request
    cgroups: bool = True
    partition: str = "gpu"
    # "" runs the machine's own Slurm packages; a release (release.RELEASES) runs from a Debian root
    slurm_release: str = ""
    extra_env: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"cluster name must be 1-8 lower-case letters or digits, starting with a letter; "
                             f"got {self.name!r}")
        if not 0 <= self.slot < MAX_SLOTS:
            raise ValueError(f"slot must be between 0 and {MAX_SLOTS - 1}, got {self.slot}")
        if self.state_dir is None:
            object.__setattr__(self, "state_dir", BASE_DIR / self.name)
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 16:
            raise ValueError(f"gpus_per_node must be between 0 and 16, got {self.gpus_per_node}")
        if self.slurm_release:
            release.check_release(self.slurm_release)
        if re.search(r"[\s'\"\\$`]", str(self.state_dir)):
            raise ValueError(f"state dir must not contain spaces, quotes, $ or backslashes: {str(self.state_dir)!r}")

    @property
    def root(self) -> Path:
        """The state dir (always set after __post_init__)."""
        assert self.state_dir is not None
        return self.state_dir

    # ---- names, addresses, ports -----------------------------------------------
    @property
    def cluster_name(self) -> str:
        return self.name

    @property
    def subnet_prefix(self) -> str:
        return f"10.77.{self.slot}"

    @property
    def first_job_id(self) -> int:
        """Slot N's job ids start at N * JOB_IDS_PER_SLOT + 1 (below Slurm's MaxJobId for every slot)."""
        return self.slot * JOB_IDS_PER_SLOT + 1

    @property
    def subnet(self) -> str:
        return f"{self.subnet_prefix}.0/24"

    @property
    def bridge(self) -> str:
        return f"st-{self.name}"

    @property
    def slurmctld_port(self) -> int:
        return 16817 + 10 * self.slot

    @property
    def slurmd_port(self) -> int:
        return 16818 + 10 * self.slot

    @property
    def slurmdbd_port(self) -> int:
        return 16819 + 10 * self.slot

    @property
    def db_port(self) -> int:
        return 13307 + 10 * self.slot

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
        return f"slurmtools-{self.name}-{node}"

    def veth(self, node: str) -> str:
        """Host-side veth name (kernel limit: 15 characters). Named after the cluster, never its
        slot: whatever else goes wrong, one cluster cannot name another's interface."""
        return f"st{self.name}v{self.node_index(node)}"

    # ---- paths ---------------------------------------------------------------
    @property
    def slurm_root(self) -> Optional[Path]:
        """The Debian root this cluster's Slurm runs from (None: the machine's own packages)."""
        return self.root / "slurm-root" if self.slurm_release else None

    @property
    def bin_dir(self) -> Path:
        """Wrappers of every Slurm client command that run them from slurm_root (put it first on
        PATH); only a cluster with a root has them."""
        return self.root / "bin"

    @property
    def client_bin_dir(self) -> Optional[Path]:
        """Where this cluster's Slurm client commands are (None: the machine's own, on PATH)."""
        return self.bin_dir if self.slurm_root else None

    @property
    def in_root(self) -> Path:
        return self.bin_dir / "in-root"

    def command(self, argv: List[str]) -> List[str]:
        """argv (an absolute path under /usr first) run from this cluster's Slurm root, if any."""
        return [str(self.in_root), *argv] if self.slurm_root else list(argv)

    @property
    def etc_dir(self) -> Path:
        return self.root / "etc"

    @property
    def reboot_program(self) -> Path:
        return self.etc_dir / "reboot-program"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def fake_gpu_dir(self) -> Path:
        return self.root / "fakegpu"

    @property
    def db_dir(self) -> Path:
        return self.root / "mysql"

    @property
    def ctld_state_dir(self) -> Path:
        return self.root / "slurmctld"

    def slurmd_spool_dir(self, node: str) -> Path:
        return self.root / "slurmd" / node

    def slurmd_pidfile(self, node: str) -> Path:
        return self.run_dir / f"slurmd-{node}.pid"

    @property
    def munge_dir(self) -> Path:
        """munged's own socket, key, pid, log and seed (owned by user munge)."""
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def hosts_file(self) -> Path:
        """The nodes' /etc/hosts, bind-mounted in each node's own mount namespace."""
        return self.etc_dir / "hosts"

    @property
    def registry_file(self) -> Path:
        return REGISTRY_DIR / f"{self.name}.json"

    @property
    def record_file(self) -> Path:
        """What `up` started or changed, so `down` undoes exactly that."""
        return self.root / "record.json"

    @property
    def blame_spool(self) -> Path:
        """Where this cluster's jobs drop blame reports (root-owned, mode 1733)."""
        return self.root / "blame"

    @property
    def metrics_inbox(self) -> Path:
        """Root's dir of the job metrics inboxes, one dir per node below it (`%N`): the prolog makes
        each job its own inbox there, owned by the job's user (slurmtools.metricsrelay)."""
        return self.root / "metrics-inbox"

    @property
    def metrics_textfiles(self) -> Path:
        """node_exporter's textfile dirs, one per node below it: the relay writes there, as root."""
        return self.root / "textfiles"

    @property
    def task_prolog(self) -> Path:
        """Every task's TaskProlog: the node's own memory directory (node_files.task_prolog_text)."""
        return self.etc_dir / "task-prolog"

    @property
    def blames_program(self) -> Path:
        """The HealthCheckProgram that handles blames and relays job metrics (node_files.blames_program_text)."""
        return self.etc_dir / "blames-healthcheck"

    @property
    def health_config(self) -> Path:
        """Beside slurm.conf, where `slurmtools health run` looks when Slurm sets SLURM_CONF."""
        return self.etc_dir / "slurmtools-health.yaml"
