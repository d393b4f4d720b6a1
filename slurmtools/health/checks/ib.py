"""InfiniBand checks: pure functions of sysfs port facts and the previous counter reading."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from slurmtools.health import config, registry
from slurmtools.health.model import CheckResult, IbPort, Status

RATE_COUNTERS = ("symbol_error", "link_error_recovery", "port_rcv_errors")


def _ports(p_ignore: Sequence[str], ports: Sequence[IbPort]) -> List[IbPort]:
    return [p for p in ports if p.hca not in p_ignore]


def check_ports(params: config.IbPorts, ports: Sequence[IbPort]) -> CheckResult:
    ports = _ports(params.ignore_hcas, ports)
    if params.expected_ports is not None and len(ports) < params.expected_ports:
        return CheckResult("ib.ports", Status.CRITICAL, f"ports={len(ports)} expected={params.expected_ports}",
                           {"found": [x.key for x in ports]})
    for port in ports:
        if port.state != "ACTIVE":
            return CheckResult("ib.ports", Status.CRITICAL, f"port={port.key} state={port.state or '?'}",
                               {"port": port.key})
        if port.phys_state != "LinkUp":
            return CheckResult("ib.ports", Status.CRITICAL, f"port={port.key} phys_state={port.phys_state or '?'}",
                               {"port": port.key})
        if params.min_rate_gbps is not None and (port.rate_gbps or 0) < params.min_rate_gbps:
            return CheckResult("ib.ports", Status.CRITICAL, f"port={port.key} rate={port.rate_gbps:g}Gb/s "
                               f"expected>={params.min_rate_gbps:g}", {"port": port.key})
        if params.link_layer is not None and port.link_layer != params.link_layer:
            return CheckResult("ib.ports", Status.CRITICAL, f"port={port.key} link_layer={port.link_layer} "
                               f"expected={params.link_layer}", {"port": port.key})
    return CheckResult("ib.ports", Status.OK, f"{len(ports)} ports active" if ports else "no InfiniBand ports",
                       {"ports": [x.key for x in ports]})


def counter_state(ports: Sequence[IbPort]) -> Dict[str, Dict[str, int]]:
    return {p.key: dict(p.counters) for p in ports}


def check_counters(params: config.IbCounters, ports: Sequence[IbPort],
                   previous: Optional[Dict[str, Dict[str, int]]]) -> CheckResult:
    if not previous:
        return CheckResult("ib.counters", Status.OK, "baseline recorded", {})
    worst_warn = None
    for port in ports:
        before = previous.get(port.key)
        if before is None:
            continue
        for name in params.critical_on_increase:
            increase = port.counters.get(name, 0) - before.get(name, port.counters.get(name, 0))
            if increase > 0:
                return CheckResult("ib.counters", Status.CRITICAL, f"port={port.key} {name}+{increase}",
                                   {"port": port.key, "counter": name, "increase": increase})
        for name in RATE_COUNTERS:
            increase = port.counters.get(name, 0) - before.get(name, port.counters.get(name, 0))
            if increase >= params.critical_increase:
                return CheckResult("ib.counters", Status.CRITICAL, f"port={port.key} {name}+{increase}",
                                   {"port": port.key, "counter": name, "increase": increase})
            if increase >= params.warn_increase and worst_warn is None:
                worst_warn = CheckResult("ib.counters", Status.WARN, f"port={port.key} {name}+{increase}",
                                         {"port": port.key, "counter": name, "increase": increase})
    return worst_warn or CheckResult("ib.counters", Status.OK, "no error counter growth", {})


def ib_results(checks: config.Checks, ports: Sequence[IbPort], phase: str,
               previous: Optional[Dict[str, Dict[str, int]]]) -> List[CheckResult]:
    """Every enabled InfiniBand check for this phase (registry order)."""
    ib = checks.ib
    run: Dict[str, Callable[[], CheckResult]] = {
        "ib.ports": lambda: check_ports(ib.ports, ports),
        "ib.counters": lambda: check_counters(ib.counters, _ports(ib.ports.ignore_hcas, ports), previous),
    }
    return [run[name]() for name in registry.enabled(checks, phase, "ib")]
