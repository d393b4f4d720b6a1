"""InfiniBand checks: pure functions of sysfs port facts, the previous reading and the clock.

Every failing port or HCA is named, in the result's details and (summarised, grouped by
problem) in its summary, which becomes the drain reason: `ports=mlx5_2/1,mlx5_5/1 state=DOWN`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurmtools.health import config, registry
from slurmtools.health.model import CheckResult, IbPort, Status

# error counters judged as a rate per hour (link_error_recovery and link_downed are flaps)
RATE_COUNTERS = ("symbol_error", "port_rcv_errors")
FLAP_COUNTERS = ("link_downed", "link_error_recovery")
MAX_NAMED = 6          # names per problem in a summary; the details list every one
MAX_SUMMARY_CHARS = 150
HOUR_S = 3600.0


@dataclass(frozen=True)
class Problem:
    what: str           # "mlx5_2/1" (a port) or "mlx5_12" (an HCA)
    problem: str        # "state=DOWN", "operstate=down", "unexpected", ...
    status: Status


def _ports(p_ignore: Sequence[str], ports: Sequence[IbPort]) -> List[IbPort]:
    return [p for p in ports if p.hca not in p_ignore]


def summarise(problems: Sequence[Problem]) -> str:
    """Problems grouped by kind: `ports=mlx5_2/1,mlx5_5/1 state=DOWN; hcas=mlx5_12 unexpected`,
    at most MAX_NAMED names per group and MAX_SUMMARY_CHARS in all (the details name the rest)."""
    groups: Dict[str, List[Problem]] = {}
    for item in problems:
        groups.setdefault(item.problem, []).append(item)
    parts = []
    for problem, items in groups.items():
        if not items[0].what:              # a node-wide problem (a port count)
            parts.append(problem)
            continue
        kind = "ports" if "/" in items[0].what else "hcas"
        names = ",".join(i.what for i in items[:MAX_NAMED]) + (f",+{len(items) - MAX_NAMED}"
                                                                 if len(items) > MAX_NAMED else "")
        parts.append(f"{kind}={names} {problem}")
    text = "; ".join(parts)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[:MAX_SUMMARY_CHARS - 3] + "..."


def _result(name: str, problems: Sequence[Problem], ok_summary: str, **details: object) -> CheckResult:
    if not problems:
        return CheckResult(name, Status.OK, ok_summary, dict(details))
    status = Status.CRITICAL if any(p.status is Status.CRITICAL for p in problems) else Status.WARN
    failing = [{"what": p.what, "problem": p.problem, "status": p.status.name} for p in problems]
    return CheckResult(name, status, summarise(problems), dict(details, failing=failing))


def _hca_problems(params: config.IbPorts, ports: Sequence[IbPort]) -> List[Problem]:
    present = sorted({p.hca for p in ports})
    out: List[Problem] = []
    if params.expected_hcas:
        out += [Problem(h, "missing", Status.CRITICAL) for h in params.expected_hcas if h not in present]
        out += [Problem(h, "unexpected", Status.CRITICAL) for h in present if h not in params.expected_hcas]
    first_port = {p.hca: p for p in reversed(ports)}
    for hca, slot in sorted(params.hca_pci_slots.items()):
        port = first_port.get(hca)
        if port is not None and port.pci_slot.lower() != slot.lower():
            out.append(Problem(hca, f"pci={port.pci_slot or '?'} expected={slot}", Status.CRITICAL))
    if params.fw_ver:
        out += [Problem(hca, f"fw={first_port[hca].fw_ver or '?'} expected={params.fw_ver}", Status.CRITICAL)
                for hca in present if first_port[hca].fw_ver != params.fw_ver]
    return out


def _port_problem(params: config.IbPorts, port: IbPort, init_since: Dict[str, float], now_s: float) -> Optional[Problem]:
    """The first thing wrong with one port (a DOWN port's Disabled phys_state is the same fault)."""
    if port.state == "INIT":
        waited_s = now_s - init_since.get(port.key, now_s)
        late = waited_s >= params.init_grace_s
        return Problem(port.key, "state=INIT" + (f" for {waited_s:.0f}s" if late else ""),
                       Status.CRITICAL if late else Status.WARN)
    if port.state != "ACTIVE":
        return Problem(port.key, f"state={port.state or '?'}" + (f" phys_state={port.phys_state}" if port.phys_state
                                                                  else ""), Status.CRITICAL)
    if port.phys_state != "LinkUp":
        return Problem(port.key, f"phys_state={port.phys_state or '?'}", Status.CRITICAL)
    if params.min_rate_gbps is not None and (port.rate_gbps or 0) < params.min_rate_gbps:
        return Problem(port.key, f"rate={port.rate_gbps or 0:g}Gb/s expected>={params.min_rate_gbps:g}", Status.CRITICAL)
    if params.link_layer is not None and port.link_layer != params.link_layer:
        return Problem(port.key, f"link_layer={port.link_layer} expected={params.link_layer}", Status.CRITICAL)
    if params.check_netdev:
        down = [name for name, operstate in port.netdevs if operstate.lower() != "up"]
        if down:
            return Problem(port.key, "netdev_operstate=down", Status.CRITICAL)
    return None


def init_since_now(ports: Sequence[IbPort], previous: Dict[str, float], now_s: float) -> Dict[str, float]:
    """When each port now in INIT was first seen in INIT (the state kept for the grace period)."""
    return {p.key: previous.get(p.key, now_s) for p in ports if p.state == "INIT"}


def check_ports(params: config.IbPorts, ports: Sequence[IbPort], init_since: Optional[Dict[str, float]] = None,
                now_s: float = 0.0) -> CheckResult:
    ports = _ports(params.ignore_hcas, ports)
    problems = _hca_problems(params, ports)
    if params.expected_ports is not None and len(ports) < params.expected_ports:
        problems.append(Problem("", f"ports={len(ports)} expected={params.expected_ports}", Status.CRITICAL))
    for port in ports:
        found = _port_problem(params, port, init_since or {}, now_s)
        if found:
            problems.append(found)
    netdevs = {p.key: [name for name, _ in p.netdevs] for p in ports if p.netdevs}
    return _result("ib.ports", problems, f"{len(ports)} ports active" if ports else "no InfiniBand ports",
                   ports=[x.key for x in ports], netdevs=netdevs)


def counter_state(ports: Sequence[IbPort]) -> Dict[str, Dict[str, int]]:
    return {p.key: dict(p.counters) for p in ports}


def _growth(port: IbPort, before: Dict[str, int], name: str) -> int:
    """A counter's growth; a counter that went down was reset (driver reload): its value is the growth."""
    now = port.counters.get(name, 0)
    was = before.get(name, now)
    return now - was if now >= was else now


def _per_hour(count: int, elapsed_s: Optional[float]) -> float:
    """A count as a rate per hour; over less than an hour the count itself (an hour's window)."""
    return count / max((elapsed_s or 0.0) / HOUR_S, 1.0)


def check_counters(params: config.IbCounters, ports: Sequence[IbPort],
                   previous: Optional[Dict[str, Dict[str, int]]], elapsed_s: Optional[float] = None) -> CheckResult:
    if not previous:
        return CheckResult("ib.counters", Status.OK, "baseline recorded", {})
    problems: List[Problem] = []
    for port in ports:
        before = previous.get(port.key)
        if before is None:
            continue
        for name in params.critical_on_increase:
            increase = _growth(port, before, name)
            if increase > 0:
                problems.append(Problem(port.key, f"{name}+{increase}", Status.CRITICAL))
        for name in RATE_COUNTERS:
            rate = _per_hour(_growth(port, before, name), elapsed_s)
            if rate >= params.critical_increase:
                problems.append(Problem(port.key, f"{name}={rate:.0f}/h", Status.CRITICAL))
            elif rate >= params.warn_increase:
                problems.append(Problem(port.key, f"{name}={rate:.0f}/h", Status.WARN))
    return _result("ib.counters", problems, "no error counter growth")


def check_flap(params: config.IbFlap, ports: Sequence[IbPort], previous: Optional[Dict[str, Dict[str, int]]],
               elapsed_s: Optional[float] = None, kernel_link_downs: int = 0) -> CheckResult:
    """Link flaps since the previous run: link_downed and link_error_recovery growth per port,
    and mlx5 link-down lines in the kernel log (which see a flap the counters may have missed
    across a driver reload); WARN for any, CRITICAL above critical_per_hour."""
    flapped: List[Tuple[str, int]] = []
    downed = recovered = 0
    for port in ports:
        before = (previous or {}).get(port.key)
        if before is None:
            continue
        port_downed, port_recovered = (_growth(port, before, name) for name in FLAP_COUNTERS)
        downed += port_downed
        recovered += port_recovered
        if port_downed + port_recovered:
            flapped.append((port.key, port_downed + port_recovered))
    flaps = max(downed, kernel_link_downs) + recovered
    if flaps == 0:
        return CheckResult("ib.flap", Status.OK, "no link flaps", {})
    rate = _per_hour(flaps, elapsed_s)
    status = Status.CRITICAL if rate > params.critical_per_hour else Status.WARN
    names = ",".join(f"{key}x{count}" for key, count in flapped[:MAX_NAMED]) or "?"
    summary = f"flaps={flaps} ({rate:.0f}/h) ports={names}" + (f" kernel_link_down={kernel_link_downs}"
                                                              if kernel_link_downs else "")
    return CheckResult("ib.flap", status, summary[:MAX_SUMMARY_CHARS],
                       {"flaps": flaps, "per_hour": round(rate, 2), "ports": dict(flapped),
                        "link_downed": downed, "link_error_recovery": recovered, "kernel_link_down": kernel_link_downs})


@dataclass(frozen=True)
class IbHistory:
    """What the IB checks compare with: the previous counters, how long ago they were read,
    when ports in INIT were first seen, and mlx5 link-down lines in the kernel log since."""
    counters: Optional[Dict[str, Dict[str, int]]] = None
    elapsed_s: Optional[float] = None
    init_since: Optional[Dict[str, float]] = None
    now_s: float = 0.0
    kernel_link_downs: int = 0


def ib_results(checks: config.Checks, ports: Sequence[IbPort], phase: str, history: IbHistory) -> List[CheckResult]:
    """Every enabled InfiniBand check for this phase (registry order)."""
    ib = checks.ib
    watched = _ports(ib.ports.ignore_hcas, ports)
    run: Dict[str, Callable[[], CheckResult]] = {
        "ib.ports": lambda: check_ports(ib.ports, ports, history.init_since, history.now_s),
        "ib.counters": lambda: check_counters(ib.counters, watched, history.counters, history.elapsed_s),
        "ib.flap": lambda: check_flap(ib.flap, watched, history.counters, history.elapsed_s,
                                      history.kernel_link_downs),
    }
    return [run[name]() for name in registry.enabled(checks, phase, "ib")]
