"""Facts and results: the data the probes produce and the checks consume."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Dict, List, Optional, Tuple


class Status(IntEnum):
    """Nagios values (as GCM), which are exit-code-like numbers and not a severity order: only
    CRITICAL drains a node. Severity (for the overall verdict) is SEVERITY below."""

    OK = 0
    WARN = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def severity(self) -> int:
        """OK < UNKNOWN < WARN < CRITICAL: a check that could not judge (UNKNOWN) outranks a
        clean one, but never a WARN, and never drains."""
        return SEVERITY.index(self)


SEVERITY = (Status.OK, Status.UNKNOWN, Status.WARN, Status.CRITICAL)


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    summary: str
    details: Dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return {"check": self.name, "status": self.status.name, "summary": self.summary, "details": self.details,
                "duration_s": round(self.duration_s, 4)}


def worst(results: List[CheckResult]) -> Status:
    """The most severe status (Status.severity); OK when there are no results."""
    return max((result.status for result in results), key=lambda status: status.severity, default=Status.OK)


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    replay_errors: int = 0
    recovery_errors: int = 0
    crc_errors: int = 0


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML reports it; None means 'not supported / not reported'."""

    index: int
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    ecc_uncorrected_volatile: Optional[int] = None
    ecc_corrected_volatile: Optional[int] = None
    retired_pages_pending: Optional[bool] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    temperature_c: Optional[int] = None
    throttle_reasons: Tuple[str, ...] = ()
    pcie_gen_current: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width_current: Optional[int] = None
    pcie_width_max: Optional[int] = None
    nvlinks: Tuple[NvLink, ...] = ()
    compute_pids: Tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuSnapshot:
    driver_version: str
    gpus: Tuple[GpuFacts, ...]


@dataclass(frozen=True)
class XidEvent:
    seq: int
    pci_bus_id: str
    code: int
    message: str


@dataclass(frozen=True)
class IbPort:
    hca: str
    port: int
    state: str           # "ACTIVE", "DOWN", ... (text after "N: ")
    phys_state: str      # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: Optional[float]
    link_layer: str      # "InfiniBand" or "Ethernet"
    counters: Dict[str, int] = field(default_factory=dict)
    fw_ver: str = ""                          # the HCA's firmware (/sys/class/infiniband/<hca>/fw_ver)
    pci_slot: str = ""                        # the PCI address the HCA is bound to ("0000:1a:00.0")
    netdevs: Tuple[Tuple[str, str], ...] = ()  # this port's IPoIB/RoCE interfaces: (name, operstate)

    @property
    def key(self) -> str:
        return f"{self.hca}/{self.port}"


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    fstype: str


@dataclass(frozen=True)
class SystemFacts:
    mem_available_gb: float
    mem_total_gb: float
    disk_free_gb: Dict[str, Optional[float]]     # path -> free GB (None: path missing)
    mounts: Tuple[Mount, ...]
    process_names: Tuple[str, ...]
