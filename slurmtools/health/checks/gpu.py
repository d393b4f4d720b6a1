"""GPU checks: pure functions of an NVML snapshot (and, for deltas, the previous reading)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from slurmtools.health import config
from slurmtools.health import registry
from slurmtools.health.model import CheckResult, GpuSnapshot, Status, XidEvent


def _ok(name: str, summary: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.OK, summary, details)


def check_count(p: config.GpuCount, snap: GpuSnapshot) -> CheckResult:
    n = len(snap.gpus)
    if p.expected is not None and n < p.expected:
        return CheckResult("gpu.count", Status.CRITICAL, f"gpus={n} expected={p.expected}",
                           {"found": n, "expected": p.expected})
    return _ok("gpu.count", f"gpus={n}", found=n)


def check_ecc(p: config.GpuEcc, snap: GpuSnapshot) -> CheckResult:
    bad = [(g.index, g.ecc_uncorrected_volatile) for g in snap.gpus if (g.ecc_uncorrected_volatile or 0) > 0]
    if bad:
        idx, n = bad[0]
        return CheckResult("gpu.ecc", Status.CRITICAL, f"gpu={idx} uncorrected={n}" + (f" (+{len(bad) - 1} gpus)"
                           if len(bad) > 1 else ""), {"uncorrected": dict(bad)})
    warn = [(g.index, g.ecc_corrected_volatile) for g in snap.gpus
            if (g.ecc_corrected_volatile or 0) > p.corrected_warn]
    if warn:
        return CheckResult("gpu.ecc", Status.WARN, f"gpu={warn[0][0]} corrected={warn[0][1]} > {p.corrected_warn}",
                           {"corrected": dict(warn)})
    return _ok("gpu.ecc", "no uncorrected ECC errors")


def check_memory(p: config.GpuMemory, snap: GpuSnapshot) -> CheckResult:
    for g in snap.gpus:
        if g.remapped_rows_failure:
            return CheckResult("gpu.memory", Status.CRITICAL, f"gpu={g.index} row_remap=failed", {"gpu": g.index})
        if g.remapped_rows_pending:
            return CheckResult("gpu.memory", Status.CRITICAL, f"gpu={g.index} row_remap=pending (reset needed)",
                               {"gpu": g.index})
        if g.retired_pages_pending:
            return CheckResult("gpu.memory", Status.CRITICAL, f"gpu={g.index} retired_pages=pending (reset needed)",
                               {"gpu": g.index})
    return _ok("gpu.memory", "no pending retirement or remap")


def check_xid(p: config.GpuXid, snap: GpuSnapshot, events: Sequence[XidEvent]) -> CheckResult:
    by_bus = {_bus(g.pci_bus_id): g.index for g in snap.gpus}
    fatal = [e for e in events if e.code in p.fatal]
    if fatal:
        e = fatal[0]
        gpu = by_bus.get(_bus(e.pci_bus_id))
        return CheckResult("gpu.xid", Status.CRITICAL, f"xid={e.code}" + (f" gpu={gpu}" if gpu is not None else "")
                           + f" pci={e.pci_bus_id}", {"events": [_event(x, by_bus) for x in fatal]})
    monitored = [e for e in events if e.code in p.monitor or e.code not in p.fatal]
    if monitored:
        codes = sorted({e.code for e in monitored})
        return CheckResult("gpu.xid", Status.WARN, f"xid={','.join(map(str, codes))}",
                           {"events": [_event(x, by_bus) for x in monitored]})
    return _ok("gpu.xid", "no new XIDs")


def _bus(bus_id: str) -> str:
    """'00000000:1B:00.0' and '0000:1b:00' name the same GPU: compare bus:device, lower case."""
    parts = bus_id.lower().split(":")
    if len(parts) >= 2:
        return f"{parts[-2]}:{parts[-1].split('.')[0]}"
    return bus_id.lower()


def _event(event: XidEvent, by_bus: Dict[str, int]) -> Dict[str, Any]:
    return {"xid": event.code, "pci": event.pci_bus_id, "gpu": by_bus.get(_bus(event.pci_bus_id)),
            "message": event.message[:200]}


def check_thermal(p: config.GpuThermal, snap: GpuSnapshot) -> CheckResult:
    for g in snap.gpus:
        crit = [r for r in g.throttle_reasons if r in p.critical_reasons]
        if crit:
            return CheckResult("gpu.thermal", Status.CRITICAL, f"gpu={g.index} throttle={','.join(crit)}",
                               {"gpu": g.index, "reasons": list(g.throttle_reasons), "temperature_c": g.temperature_c})
    for g in snap.gpus:
        warn = [r for r in g.throttle_reasons if r in p.warn_reasons]
        hot = g.temperature_c is not None and g.temperature_c >= p.temperature_warn_c
        if warn or hot:
            what = f"throttle={','.join(warn)}" if warn else f"temp={g.temperature_c}C"
            return CheckResult("gpu.thermal", Status.WARN, f"gpu={g.index} {what}",
                               {"gpu": g.index, "reasons": list(g.throttle_reasons), "temperature_c": g.temperature_c})
    return _ok("gpu.thermal", "no thermal or hardware slowdown")


def check_pcie(p: config.GpuPcie, snap: GpuSnapshot) -> CheckResult:
    for g in snap.gpus:
        if p.expected_width is not None and g.pcie_width_current is not None and g.pcie_width_current < p.expected_width:
            return CheckResult("gpu.pcie", Status.CRITICAL, f"gpu={g.index} width=x{g.pcie_width_current} "
                               f"expected=x{p.expected_width}", {"gpu": g.index})
        if p.expected_gen is not None and g.pcie_gen_max is not None and g.pcie_gen_max < p.expected_gen:
            return CheckResult("gpu.pcie", Status.CRITICAL, f"gpu={g.index} gen={g.pcie_gen_max} "
                               f"expected={p.expected_gen}", {"gpu": g.index})
    return _ok("gpu.pcie", "links at expected width/generation" if (p.expected_width or p.expected_gen)
               else "no expectation configured")


def nvlink_counters(snap: GpuSnapshot) -> Dict[str, int]:
    """Flattened error counters, the state kept for the next run's deltas."""
    return {f"{g.index}/{link.link}": link.replay_errors + link.recovery_errors + link.crc_errors
            for g in snap.gpus for link in g.nvlinks}


def check_nvlink(p: config.GpuNvlink, snap: GpuSnapshot, previous: Optional[Dict[str, int]]) -> CheckResult:
    for g in snap.gpus:
        if not g.nvlinks:
            continue
        active = sum(1 for link in g.nvlinks if link.active)
        expected = p.expected_active if p.expected_active is not None else len(g.nvlinks)
        if active < expected:
            down = [link.link for link in g.nvlinks if not link.active]
            return CheckResult("gpu.nvlink", Status.CRITICAL, f"gpu={g.index} active={active}/{expected} "
                               f"down={','.join(map(str, down))}", {"gpu": g.index, "inactive": down})
    if previous:
        now = nvlink_counters(snap)
        grown = {k: v - previous.get(k, v) for k, v in now.items() if v - previous.get(k, v) > p.errors_warn}
        if grown:
            k = max(grown, key=lambda x: grown[x])
            return CheckResult("gpu.nvlink", Status.WARN, f"gpu/link={k} errors+{grown[k]}", {"increase": grown})
    return _ok("gpu.nvlink", "links active")


def check_processes(p: config.GpuProcesses, snap: GpuSnapshot, phase: str) -> CheckResult:
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
