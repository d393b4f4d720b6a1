"""System checks: pure functions of psutil facts."""
from __future__ import annotations

from typing import Callable, Dict, List

from slurmtools.health import config, registry
from slurmtools.health.model import CheckResult, Status, SystemFacts


def check_memory(params: config.SysMemory, facts: SystemFacts) -> CheckResult:
    if facts.mem_available_gb < params.min_available_gb:
        return CheckResult("system.memory", Status.CRITICAL, f"available={facts.mem_available_gb:.1f}GB "
                           f"min={params.min_available_gb:g}GB", {"available_gb": round(facts.mem_available_gb, 2)})
    return CheckResult("system.memory", Status.OK, f"available={facts.mem_available_gb:.1f}GB", {})


def check_disk(params: config.SysDisk, facts: SystemFacts) -> CheckResult:
    for path in params.paths:
        free = facts.disk_free_gb.get(path)
        if free is None:
            return CheckResult("system.disk", Status.CRITICAL, f"path={path} missing", {"path": path})
        if free < params.min_free_gb:
            return CheckResult("system.disk", Status.CRITICAL, f"path={path} free={free:.1f}GB min={params.min_free_gb:g}GB",
                               {"path": path, "free_gb": round(free, 2)})
    return CheckResult("system.disk", Status.OK, "enough free space", {})


def check_mounts(params: config.SysMounts, facts: SystemFacts) -> CheckResult:
    mounted = {m.mountpoint for m in facts.mounts}
    missing = [m for m in params.required if m.rstrip("/") not in mounted and m not in mounted]
    if missing:
        return CheckResult("system.mounts", Status.CRITICAL, f"not mounted: {','.join(missing)}", {"missing": missing})
    return CheckResult("system.mounts", Status.OK, "required mounts present", {})


def check_processes(params: config.SysProcesses, facts: SystemFacts) -> CheckResult:
    missing = [name for name in params.required if name not in facts.process_names]
    if missing:
        return CheckResult("system.processes", Status.CRITICAL, f"not running: {','.join(missing)}",
                           {"missing": missing})
    return CheckResult("system.processes", Status.OK, "required processes running", {})


def system_results(checks: config.Checks, facts: SystemFacts, phase: str) -> List[CheckResult]:
    """Every enabled system check for this phase (registry order)."""
    system = checks.system
    run: Dict[str, Callable[[], CheckResult]] = {
        "system.memory": lambda: check_memory(system.memory, facts),
        "system.disk": lambda: check_disk(system.disk, facts),
        "system.mounts": lambda: check_mounts(system.mounts, facts),
        "system.processes": lambda: check_processes(system.processes, facts),
    }
    return [run[name]() for name in registry.enabled(checks, phase, "system")]
