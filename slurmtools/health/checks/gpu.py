"""GPU checks: pure functions of an NVML snapshot (and, for deltas, the previous reading)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from slurmtools.common import xid as xid_policy
from slurmtools.health import config
from slurmtools.health import registry
from slurmtools.health.model import CheckResult, GpuSnapshot, Status, XidEvent


def _ok(name: str, summary: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.OK, summary, details)


def check_count(params: config.GpuCount, snap: GpuSnapshot) -> CheckResult:
    count = len(snap.gpus)
    if params.expected is not None and count < params.expected:
        return CheckResult("gpu.count", Status.CRITICAL, f"gpus={count} expected={params.expected}",
                           {"found": count, "expected": params.expected})
    return _ok("gpu.count", f"gpus={count}", found=count)


def check_ecc(params: config.GpuEcc, snap: GpuSnapshot) -> CheckResult:
    bad = [(g.index, g.ecc_uncorrected_volatile) for g in snap.gpus if (g.ecc_uncorrected_volatile or 0) > 0]
    if bad:
        idx, count = bad[0]
        return CheckResult("gpu.ecc", Status.CRITICAL, f"gpu={idx} uncorrected={count}" + (f" (+{len(bad) - 1} gpus)"
                           if len(bad) > 1 else ""), {"uncorrected": dict(bad)})
    warn = [(g.index, g.ecc_corrected_volatile) for g in snap.gpus
            if (g.ecc_corrected_volatile or 0) > params.corrected_warn]
    if warn:
        return CheckResult("gpu.ecc", Status.WARN, f"gpu={warn[0][0]} corrected={warn[0][1]} > {params.corrected_warn}",
                           {"corrected": dict(warn)})
    return _ok("gpu.ecc", "no uncorrected ECC errors")


def check_memory(params: config.GpuMemory, snap: GpuSnapshot) -> CheckResult:
    """A failed row remap is hardware (CRITICAL); a pending remap or page retirement is applied by
    the next GPU reset and still lets new work start (WARN)."""
    for gpu in snap.gpus:
        if gpu.remapped_rows_failure:
            return CheckResult("gpu.memory", Status.CRITICAL, f"gpu={gpu.index} row_remap=failed", {"gpu": gpu.index})
    for gpu in snap.gpus:
        if gpu.remapped_rows_pending:
            return CheckResult("gpu.memory", Status.WARN, f"gpu={gpu.index} row_remap=pending (applied at the next "
                               "GPU reset)", {"gpu": gpu.index})
        if gpu.retired_pages_pending:
            return CheckResult("gpu.memory", Status.WARN, f"gpu={gpu.index} retired_pages=pending (applied at the "
                               "next GPU reset)", {"gpu": gpu.index})
    return _ok("gpu.memory", "no pending retirement or remap")


# an action's status; `reboot` is CRITICAL with details["remedy"] = "reboot" (health/remedy.py)
XID_STATUS = {xid_policy.DRAIN: Status.CRITICAL, xid_policy.REBOOT: Status.CRITICAL,
              xid_policy.RESTART_APP: Status.WARN, xid_policy.IGNORE: Status.OK}


def check_xid(params: config.GpuXid, snap: GpuSnapshot, events: Sequence[XidEvent]) -> CheckResult:
    """Each new XID judged by NVIDIA's catalogue (or the admin's override): the worst action wins;
    the summary names every code of that action, the details every event with its action."""
    if not events:
        return _ok("gpu.xid", "no new XIDs")
    by_bus = {_bus(g.pci_bus_id): g.index for g in snap.gpus}
    judged = [(event, xid_policy.action(event.code, event.message, params.actions)) for event in events]
    worst_action = min((chosen for _, chosen in judged), key=xid_policy.ACTIONS.index)
    of_worst = [event for event, chosen in judged if chosen == worst_action]
    first = of_worst[0]
    gpu = by_bus.get(_bus(first.pci_bus_id))
    codes = sorted({event.code for event in of_worst})
    summary = (f"xid={','.join(map(str, codes))} action={worst_action}" + (f" gpu={gpu}" if gpu is not None else "")
               + f" pci={first.pci_bus_id}")
    details: Dict[str, Any] = {"events": [dict(_event(event, by_bus), action=chosen) for event, chosen in judged]}
    if worst_action == xid_policy.REBOOT:
        details["remedy"] = xid_policy.REBOOT
    return CheckResult("gpu.xid", XID_STATUS[worst_action], summary, details)


def _bus(bus_id: str) -> str:
    """'00000000:1B:00.0' and '0000:1b:00' name the same GPU: compare bus:device, lower case."""
    parts = bus_id.lower().split(":")
    if len(parts) >= 2:
        return f"{parts[-2]}:{parts[-1].split('.')[0]}"
    return bus_id.lower()


def _event(event: XidEvent, by_bus: Dict[str, int]) -> Dict[str, Any]:
    return {"xid": event.code, "pci": event.pci_bus_id, "gpu": by_bus.get(_bus(event.pci_bus_id)),
            "message": event.message[:200]}


def check_thermal(params: config.GpuThermal, snap: GpuSnapshot) -> CheckResult:
    for gpu in snap.gpus:
        crit = [r for r in gpu.throttle_reasons if r in params.critical_reasons]
        if crit:
            return CheckResult("gpu.thermal", Status.CRITICAL, f"gpu={gpu.index} throttle={','.join(crit)}",
                               {"gpu": gpu.index, "reasons": list(gpu.throttle_reasons), "temperature_c": gpu.temperature_c})
    for gpu in snap.gpus:
        warn = [r for r in gpu.throttle_reasons if r in params.warn_reasons]
        hot = gpu.temperature_c is not None and gpu.temperature_c >= params.temperature_warn_c
        if warn or hot:
            what = f"throttle={','.join(warn)}" if warn else f"temp={gpu.temperature_c}C"
            return CheckResult("gpu.thermal", Status.WARN, f"gpu={gpu.index} {what}",
                               {"gpu": gpu.index, "reasons": list(gpu.throttle_reasons), "temperature_c": gpu.temperature_c})
    return _ok("gpu.thermal", "no thermal or hardware slowdown")


def check_pcie(params: config.GpuPcie, snap: GpuSnapshot) -> CheckResult:
    for gpu in snap.gpus:
        if params.expected_width is not None and gpu.pcie_width_current is not None and gpu.pcie_width_current < params.expected_width:
            return CheckResult("gpu.pcie", Status.CRITICAL, f"gpu={gpu.index} width=x{gpu.pcie_width_current} "
                               f"expected=x{params.expected_width}", {"gpu": gpu.index})
        if params.expected_gen is not None and gpu.pcie_gen_max is not None and gpu.pcie_gen_max < params.expected_gen:
            return CheckResult("gpu.pcie", Status.CRITICAL, f"gpu={gpu.index} gen={gpu.pcie_gen_max} "
                               f"expected={params.expected_gen}", {"gpu": gpu.index})
    return _ok("gpu.pcie", "links at expected width/generation" if (params.expected_width or params.expected_gen)
               else "no expectation configured")


def nvlink_counters(snap: GpuSnapshot) -> Dict[str, int]:
    """Flattened error counters, the state kept for the next run's deltas."""
    return {f"{g.index}/{link.link}": link.replay_errors + link.recovery_errors + link.crc_errors
            for g in snap.gpus for link in g.nvlinks}


def check_nvlink(params: config.GpuNvlink, snap: GpuSnapshot, previous: Optional[Dict[str, int]]) -> CheckResult:
    for gpu in snap.gpus:
        if not gpu.nvlinks:
            continue
        active = sum(1 for link in gpu.nvlinks if link.active)
        expected = params.expected_active if params.expected_active is not None else len(gpu.nvlinks)
        if active < expected:
            down = [link.link for link in gpu.nvlinks if not link.active]
            return CheckResult("gpu.nvlink", Status.CRITICAL, f"gpu={gpu.index} active={active}/{expected} "
                               f"down={','.join(map(str, down))}", {"gpu": gpu.index, "inactive": down})
    if previous:
        now = nvlink_counters(snap)
        grown = {k: v - previous.get(k, v) for k, v in now.items() if v - previous.get(k, v) > params.errors_warn}
        if grown:
            worst_link = max(grown, key=lambda x: grown[x])
            return CheckResult("gpu.nvlink", Status.WARN, f"gpu/link={worst_link} errors+{grown[worst_link]}", {"increase": grown})
    return _ok("gpu.nvlink", "links active")


def check_processes(params: config.GpuProcesses, snap: GpuSnapshot, phase: str) -> CheckResult:
    busy = {g.index: list(g.compute_pids) for g in snap.gpus if g.compute_pids}
    if busy:
        idx = min(busy)
        when = "before the job" if phase == "prolog" else "after the job" if phase == "epilog" else "now"
        return CheckResult("gpu.processes", Status.CRITICAL, f"gpu={idx} pids={','.join(map(str, busy[idx]))} {when}",
                           {"pids": busy})
    return _ok("gpu.processes", "no compute processes")


def gpu_results(checks: config.Checks, snap: GpuSnapshot, events: Sequence[XidEvent], phase: str,
                previous_nvlink: Optional[Dict[str, int]]) -> List[CheckResult]:
    """Every enabled GPU check for this phase (registry order)."""
    gpu = checks.gpu
    run: Dict[str, Callable[[], CheckResult]] = {
        "gpu.count": lambda: check_count(gpu.count, snap),
        "gpu.ecc": lambda: check_ecc(gpu.ecc, snap),
        "gpu.memory": lambda: check_memory(gpu.memory, snap),
        "gpu.xid": lambda: check_xid(gpu.xid, snap, events),
        "gpu.thermal": lambda: check_thermal(gpu.thermal, snap),
        "gpu.pcie": lambda: check_pcie(gpu.pcie, snap),
        "gpu.nvlink": lambda: check_nvlink(gpu.nvlink, snap, previous_nvlink),
        "gpu.processes": lambda: check_processes(gpu.processes, snap, phase),
    }
    return [run[name]() for name in registry.enabled(checks, phase, "gpu")]
