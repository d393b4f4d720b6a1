"""Health config: /etc/slurmtools/health.yaml (commented example in etc/health.yaml).

    defaults: {<settings>}                  # every node
    hosts:                                  # in order; later sections win
      - match: "gpu[001-064]"               # a hostlist pattern (ClusterShell NodeSet)
        <settings>

Settings and every check's parameters are documented dataclasses validated by the same
rules as job specs (errors name file:line and key, with a did-you-mean). As root, a config
that is not root-owned or is group/world-writable is refused: it decides which nodes drain.
"""
from __future__ import annotations

import copy
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurmtools.blame.config import BlameSettings
from slurmtools.common import xid as xid_policy
from slurmtools.common.schema import attach_line, build, check_hostlist, check_limits, doc, err, load_yaml_with_lines
from slurmtools.errors import ConfigError, SpecError
from slurmtools.metricsrelay.config import JobMetricsSettings

# passive phases read counters and states within seconds; `active` runs diagnostics that load
# the node for minutes (DCGM diag, nccl-tests, perftest): idle nodes only, never in a prolog
PASSIVE_PHASES = ("prolog", "epilog", "periodic")
PHASES = PASSIVE_PHASES + ("active",)
from slurmtools.health.config_file import find_config_path, read_trusted


def _phases(*names: str) -> Any:
    return doc("Phases that run this check: prolog, epilog, periodic, active.", default_factory=lambda: list(names))


@dataclass(frozen=True)
class CheckParams:
    enabled: bool = doc("Run this check.", True)
    phases: List[str] = _phases(*PASSIVE_PHASES)

    def __post_init__(self) -> None:
        check_limits(self, ())
        for phase in self.phases:
            if phase not in PHASES:
                raise err(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}", ("phases",))


@dataclass(frozen=True)
class GpuCount(CheckParams):
    expected: Optional[int] = doc("GPUs this node must have (unset: any number).", None, min=0, max=64)


@dataclass(frozen=True)
class GpuEcc(CheckParams):
    corrected_warn: int = doc("Corrected volatile ECC errors above which a GPU is WARN.", 1000, min=0)


@dataclass(frozen=True)
class GpuMemory(CheckParams):
    """Retired pages pending and row remapping pending/failed: all CRITICAL."""


@dataclass(frozen=True)
class GpuXid(CheckParams):
    """Each XID's action comes from NVIDIA's XID catalogue (slurmtools/common/xid.py): drain (CRITICAL),
    reboot (CRITICAL, the node is rebooted and returns by itself), restart_app (WARN: the job's
    fault) or ignore (OK)."""

    actions: Dict[int, str] = doc("Per-code overrides of the catalogue's action, e.g. {79: drain, 94: ignore}; "
                                  "actions: drain, reboot, restart_app, ignore.", default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = xid_policy.check_overrides(self.actions.items())
        if problem:
            raise err(problem, ("actions",))


@dataclass(frozen=True)
class GpuThermal(CheckParams):
    temperature_warn_c: int = doc("GPU temperature at or above which the GPU is WARN.", 87, min=30, max=130)
    critical_reasons: List[str] = doc("Clock-event reasons that are CRITICAL.",
                                      default_factory=lambda: ["hw_slowdown", "hw_thermal_slowdown",
                                                               "hw_power_brake_slowdown"])
    warn_reasons: List[str] = doc("Clock-event reasons that are WARN.",
                                  default_factory=lambda: ["sw_thermal_slowdown"])


@dataclass(frozen=True)
class GpuPcie(CheckParams):
    expected_width: Optional[int] = doc("PCIe link width each GPU must run at (e.g. 16).", None, min=1, max=32)
    expected_gen: Optional[int] = doc("PCIe generation each GPU must support (max gen; the current gen "
                                      "drops at idle to save power, so it is not compared).", None, min=1, max=7)


@dataclass(frozen=True)
class GpuNvlink(CheckParams):
    expected_active: Optional[int] = doc("Active NVLinks per GPU (18 on H100/H200 SXM; unset: every "
                                         "reported link must be active).", None, min=0, max=36)
    errors_warn: int = doc("Growth of a link's replay/recovery/CRC counters since the last run that is WARN.",
                           100, min=0)


@dataclass(frozen=True)
class GpuProcesses(CheckParams):
    phases: List[str] = _phases("prolog", "epilog")


@dataclass(frozen=True)
class GpuChecks:
    count: GpuCount = doc("Expected GPU count.", default_factory=GpuCount)
    ecc: GpuEcc = doc("Volatile ECC errors.", default_factory=GpuEcc)
    memory: GpuMemory = doc("Retired pages and row remapping.", default_factory=GpuMemory)
    xid: GpuXid = doc("XID events from the kernel log.", default_factory=GpuXid)
    thermal: GpuThermal = doc("Temperature and clock-event (throttle) reasons.", default_factory=GpuThermal)
    pcie: GpuPcie = doc("PCIe link width and generation.", default_factory=GpuPcie)
    nvlink: GpuNvlink = doc("NVLink state and error counters.", default_factory=GpuNvlink)
    processes: GpuProcesses = doc("Compute processes left on a GPU.", default_factory=GpuProcesses)


@dataclass(frozen=True)
class IbPorts(CheckParams):
    expected_ports: Optional[int] = doc("Ports (over all HCAs) that must be ACTIVE/LinkUp (unset: every port "
                                        "present must be).", None, min=0, max=256)
    min_rate_gbps: Optional[float] = doc("Lowest acceptable link rate, e.g. 400 for NDR.", None, min=0.0)
    link_layer: Optional[str] = doc("Required link layer.", None, choices=("InfiniBand", "Ethernet"))
    ignore_hcas: List[str] = doc("HCAs not checked (e.g. a management NIC's mlx5_bond_0).", default_factory=list)
    expected_hcas: List[str] = doc("HCA names this node must have, e.g. [mlx5_0, ..., mlx5_7] (empty: any).",
                                   default_factory=list)
    hca_pci_slots: Dict[str, str] = doc("HCA name -> the PCI address it must be bound to, e.g. "
                                        "{mlx5_0: '0000:1a:00.0'} (a renumbered or moved HCA is CRITICAL).",
                                        default_factory=dict)
    fw_ver: Optional[str] = doc("Firmware version every HCA must run, e.g. 28.39.1002 (unset: not checked).", None)
    check_netdev: bool = doc("Check the operstate of each port's IPoIB/RoCE network interface.", True)
    init_grace_s: float = doc("A port in INIT (the subnet manager has not configured it yet) is WARN for this "
                              "long, then CRITICAL.", 300.0, min=0.0, max=86400.0)


@dataclass(frozen=True)
class IbCounters(CheckParams):
    critical_on_increase: List[str] = doc("Counters whose any increase is CRITICAL.", default_factory=lambda: [
        "excessive_buffer_overrun_errors", "local_link_integrity_errors"])
    warn_increase: int = doc("Growth per hour of symbol_error / port_rcv_errors that is WARN.", 10, min=1)
    critical_increase: int = doc("Growth per hour of those counters that is CRITICAL.", 1000, min=1)


@dataclass(frozen=True)
class IbFlap(CheckParams):
    critical_per_hour: int = doc("Link flaps (link_downed / link_error_recovery growth and mlx5 port-change "
                                 "kernel messages) per hour above which the node is CRITICAL; any flap is WARN.",
                                 3, min=1, max=100000)


@dataclass(frozen=True)
class IbChecks:
    ports: IbPorts = doc("HCA ports: count, state, physical state, rate, link layer.", default_factory=IbPorts)
    counters: IbCounters = doc("Error counter growth per hour since the previous run.", default_factory=IbCounters)
    flap: IbFlap = doc("Link flaps since the previous run.", default_factory=IbFlap)


@dataclass(frozen=True)
class SysMemory(CheckParams):
    min_available_gb: float = doc("Available memory below this is CRITICAL.", 1.0, min=0.0)


@dataclass(frozen=True)
class SysDisk(CheckParams):
    paths: List[str] = doc("Paths whose filesystems must have free space.", default_factory=lambda: ["/tmp"])
    min_free_gb: float = doc("Free space below this is CRITICAL.", 1.0, min=0.0)


@dataclass(frozen=True)
class SysMounts(CheckParams):
    required: List[str] = doc("Mount points that must be mounted (e.g. /shared).", default_factory=list)


@dataclass(frozen=True)
class SysProcesses(CheckParams):
    required: List[str] = doc("Process names that must be running (e.g. nvidia-persistenced).", default_factory=list)


@dataclass(frozen=True)
class SystemChecks:
    memory: SysMemory = doc("Available memory.", default_factory=SysMemory)
    disk: SysDisk = doc("Free disk space.", default_factory=SysDisk)
    mounts: SysMounts = doc("Required mounts.", default_factory=SysMounts)
    processes: SysProcesses = doc("Required processes / services.", default_factory=SysProcesses)


@dataclass(frozen=True)
class ActiveDcgmDiag(CheckParams):
    phases: List[str] = _phases("active")
    command: str = doc("The dcgmi program (a name on PATH or an absolute path).", "dcgmi")
    level: int = doc("Suite: 1 quick (seconds), 2 medium (~2 min), 3 long (~15 min), 4 extended.", 2, min=1, max=4)
    timeout_s: float = doc("Time box of the diagnostic.", 900.0, min=1.0, max=86400.0)


@dataclass(frozen=True)
class ActiveNcclAllReduce(CheckParams):
    phases: List[str] = _phases("active")
    command: str = doc("nccl-tests' all_reduce_perf (a name on PATH or an absolute path).", "all_reduce_perf")
    arguments: List[str] = doc("Its arguments: every GPU of the node, 8 B to 8 GB, data checked (-c 1).",
                               default_factory=lambda: ["-b", "8", "-e", "8G", "-f", "2", "-g", "8", "-c", "1"])
    min_busbw_gbps: Optional[float] = doc("Bus bandwidth (GB/s) at the largest size below which the node is "
                                          "CRITICAL (unset: only wrong results are).", None, min=0.0)
    timeout_s: float = doc("Time box of the test.", 600.0, min=1.0, max=86400.0)


@dataclass(frozen=True)
class ActiveIbWriteBw(CheckParams):
    phases: List[str] = _phases("active")
    command: str = doc("perftest's ib_write_bw (a name on PATH or an absolute path).", "ib_write_bw")
    devices: List[str] = doc("HCAs to test in loopback (server and client on this node); empty: every HCA "
                             "under the sysfs root.", default_factory=list)
    size_bytes: int = doc("Message size.", 1048576, min=1, max=1 << 30)
    min_bw_gbps: Optional[float] = doc("Average bandwidth (Gb/s) below which the node is CRITICAL (unset: "
                                       "report only).", None, min=0.0)
    timeout_s: float = doc("Time box of each device's test.", 60.0, min=1.0, max=3600.0)


@dataclass(frozen=True)
class ActiveChecks:
    dcgm_diag: ActiveDcgmDiag = doc("`dcgmi diag --run LEVEL --json`.", default_factory=ActiveDcgmDiag)
    nccl_allreduce: ActiveNcclAllReduce = doc("nccl-tests all_reduce_perf on the node's GPUs.",
                                              default_factory=ActiveNcclAllReduce)
    ib_write_bw: ActiveIbWriteBw = doc("perftest ib_write_bw loopback per HCA.", default_factory=ActiveIbWriteBw)


@dataclass(frozen=True)
class Checks:
    gpu: GpuChecks = doc("GPU checks (NVML).", default_factory=GpuChecks)
    ib: IbChecks = doc("InfiniBand checks (sysfs).", default_factory=IbChecks)
    system: SystemChecks = doc("System checks (psutil).", default_factory=SystemChecks)
    active: ActiveChecks = doc("Active diagnostics (phase `active`, idle nodes only).", default_factory=ActiveChecks)


@dataclass(frozen=True)
class NodeSettings:
    gpu_probe: str = doc("`nvml`, `none` (no GPUs), or `fixture:<path|builtin name>` for rehearsals and tests; "
                         "a fixture is never used unless named here.", "nvml")
    sysfs_root: str = doc("Root under which /sys/class/infiniband is read.", "/")
    kernel_log: Optional[str] = doc("Kernel log for XIDs: /dev/kmsg, a file in kmsg format, or null.", "/dev/kmsg")
    state_dir: str = doc("Where counters, job baselines and the last result are kept.", "/var/lib/slurmtools/health")
    probe_timeout_s: float = doc("Time box of each probe.", 3.0, min=0.05, max=300.0)
    deadline_s: float = doc("Time box of the whole run.", 8.0, min=0.1, max=600.0)
    active_deadline_s: float = doc("Time box of a whole `active` run (its diagnostics run one after another).",
                                   1800.0, min=1.0, max=86400.0)
    probe_timeout_status: str = doc("Status of the checks whose probe timed out (a hung NVML is a sick node).",
                                    "CRITICAL", choices=("CRITICAL", "WARN", "UNKNOWN"))
    on_internal_error: str = doc("When slurmtools itself fails: `open` (run the job, drain nothing) or `closed` "
                                 "(drain with an internal-error reason).", "open", choices=("open", "closed"))
    cache_minutes: float = doc("Prolog: skip the NVML probe when the node passed within this many minutes and no "
                               "IB counter or kernel-log XID moved (0: off).", 0.0, min=0.0, max=1440.0)
    auto_resume_after: int = doc("Periodic: resume a node drained by slurmtools after this many consecutive clean "
                                 "runs (0: never).", 0, min=0, max=1000)
    drain: bool = doc("Drain on CRITICAL (false: report only).", True)
    max_reboots_per_day: int = doc("When every CRITICAL finding is one a reboot clears (a reset-class XID), ask "
                                   "Slurm to reboot the node when idle and resume it, at most this many times in "
                                   "24 h; then drain for a person (0: always drain).", 1, min=0, max=24)
    textfile: Optional[str] = doc("Prometheus textfile to write (node_exporter textfile collector).", None)
    syslog: bool = doc("Log non-OK results to syslog.", True)
    checks: Checks = doc("Per-check switches and thresholds.", default_factory=Checks)
    blame: BlameSettings = doc("Blames of nodes reported by jobs (slurmtools/blame): where, and when they drain.",
                               default_factory=BlameSettings)
    job_metrics: JobMetricsSettings = doc("Jobs' metrics to node_exporter through a root-owned relay "
                                          "(slurmtools/metricsrelay).", default_factory=JobMetricsSettings)

    def __post_init__(self) -> None:
        check_limits(self, ())
        if not (self.gpu_probe in ("nvml", "none") or self.gpu_probe.startswith("fixture:")):
            raise err(f"must be nvml, none or fixture:<path>; got {self.gpu_probe!r}", ("gpu_probe",))
        for phase in self.blame.handle_in:
            if phase not in PHASES:
                raise err(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}", ("blame", "handle_in"))


@dataclass(frozen=True)
class HealthConfig:
    path: Optional[Path]
    defaults: Dict[str, Any]
    hosts: Tuple[Tuple[str, Dict[str, Any]], ...]

    def for_host(self, host: str) -> NodeSettings:
        from ClusterShell.NodeSet import NodeSet
        merged = copy.deepcopy(self.defaults)
        for pattern, section in self.hosts:
            if host in NodeSet(pattern):
                merged = _deep_merge(merged, section)
        try:
            settings: NodeSettings = build(NodeSettings, merged)
            return settings
        except SpecError as exc:  # each section was valid; the merge can still clash (e.g. phases)
            raise ConfigError(f"for host {host}: {exc.detail}", file=str(self.path) if self.path else None,
                              key=exc.key) from None


def _deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_config(text: str, file: str) -> HealthConfig:
    data, lines = load_yaml_with_lines(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"must be a mapping with `defaults` and/or `hosts`, got {type(data).__name__}", file=file)
    try:
        for key in data:
            if key not in ("defaults", "hosts"):
                raise err("unknown key; the top level has `defaults` and `hosts`", (str(key),))
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise err("must be a mapping of settings", ("defaults",))
        build(NodeSettings, defaults, ("defaults",))
        hosts = []
        raw_hosts = data.get("hosts") or []
        if not isinstance(raw_hosts, list):
            raise err("must be a list of sections with `match`", ("hosts",))
        for index, section in enumerate(raw_hosts):
            path = ("hosts", str(index))
            if not isinstance(section, dict) or "match" not in section:
                raise err("each host section needs `match: <hostlist>`", path)
            pattern = section["match"]
            if not isinstance(pattern, str):
                raise err("must be a hostlist string", path + ("match",))
            check_hostlist(pattern, path + ("match",))
            rest = {k: v for k, v in section.items() if k != "match"}
            build(NodeSettings, rest, path)
            hosts.append((pattern, rest))
    except SpecError as exc:
        located = attach_line(exc, file, lines)
        raise ConfigError(located.detail, file=located.file, line=located.line, key=located.key) from None
    return HealthConfig(Path(file), defaults, tuple(hosts))


def load_config(explicit: Optional[str] = None) -> HealthConfig:
    """The config in force; no file at all means every default (documented, fail-safe)."""
    path = find_config_path(explicit)
    if path is None:
        return HealthConfig(None, {}, ())
    return parse_config(read_trusted(path), str(path))


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_node_name(name: str) -> str:
    """A Slurm node name (letters, digits, `-`, `_`, `.`; no path, no hostlist); it names a
    state directory, so anything else is refused."""
    if not name.isascii() or not _NODE_NAME.match(name) or ".." in name:
        raise ConfigError(f"not a node name: {name[:64]!r}")
    return name


def this_host() -> str:
    return check_node_name(os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
