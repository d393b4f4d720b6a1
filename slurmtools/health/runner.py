"""Gather facts with every probe time-boxed and the whole run under a deadline, then judge.

Probes run concurrently in daemon threads: a hung probe (NVML stuck on a sick GPU) becomes a
"timed out" result with the configured status, never a hung prolog; the CLI exits without
waiting for such a thread.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from slurmtools.health import kmsg, registry, sysfs, system_probe
from slurmtools.health.checks import gpu as gpu_checks
from slurmtools.health.checks import ib as ib_checks
from slurmtools.health.checks import system as system_checks
from slurmtools.health.config import NodeSettings
from slurmtools.health.gpu_probe import ProbeError, make_gpu_probe
from slurmtools.health.model import CheckResult, GpuSnapshot, IbPort, Status, SystemFacts, XidEvent


@dataclass
class ProbeOutcome:
    value: Any = None
    error: Optional[str] = None
    timed_out: bool = False
    duration_s: float = 0.0


class _ProbeThread(threading.Thread):
    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.outcome = ProbeOutcome()
        self.t0 = 0.0

    def run(self) -> None:
        self.t0 = time.monotonic()
        try:
            self.outcome.value = self.fn()
        except ProbeError as exc:
            self.outcome.error = str(exc)
        except Exception as exc:  # a probe's own bug is a result, not a crash of the prolog
            self.outcome.error = f"{type(exc).__name__}: {exc}"
        self.outcome.duration_s = time.monotonic() - self.t0


def run_probes(probes: Dict[str, Callable[[], Any]], timeout_s: float, deadline: float) -> Dict[str, ProbeOutcome]:
    threads = {name: _ProbeThread(fn) for name, fn in probes.items()}
    for thread in threads.values():
        thread.start()
    out = {}
    for name, thread in threads.items():
        thread.join(max(0.0, min(timeout_s, deadline - time.monotonic())))
        if thread.is_alive():
            out[name] = ProbeOutcome(error=f"timed out after {timeout_s:g} s", timed_out=True,
                                     duration_s=time.monotonic() - thread.t0)
        else:
            out[name] = thread.outcome
    return out


def any_probe_thread_alive() -> bool:
    return any(isinstance(t, _ProbeThread) and t.is_alive() for t in threading.enumerate())


@dataclass
class Facts:
    gpu: ProbeOutcome = field(default_factory=ProbeOutcome)
    ib: ProbeOutcome = field(default_factory=ProbeOutcome)
    kernel: ProbeOutcome = field(default_factory=ProbeOutcome)
    system: ProbeOutcome = field(default_factory=ProbeOutcome)
    gpu_skipped: bool = False


def gather_cheap(settings: NodeSettings, phase: str, deadline: float) -> Facts:
    """sysfs, kernel log and psutil: milliseconds; run first (their change decides the cache)."""
    probes: Dict[str, Callable[[], Any]] = {}
    if registry.enabled(settings.checks, phase, "ib"):
        probes["ib"] = lambda: sysfs.read_ib_ports(Path(settings.sysfs_root))
    kernel_log = settings.kernel_log
    wants_xids = registry.runs(settings.checks.gpu.xid, phase) and settings.gpu_probe != "none"
    if kernel_log and (wants_xids or registry.runs(settings.checks.ib.flap, phase)):
        probes["kernel"] = lambda: kmsg.read_records(Path(kernel_log))
    if registry.enabled(settings.checks, phase, "system"):
        sc = settings.checks.system
        probes["system"] = lambda: system_probe.gather(sc.disk.paths if sc.disk.enabled else [],
                                                       sc.processes.enabled and bool(sc.processes.required))
    facts = Facts()
    for name, outcome in run_probes(probes, settings.probe_timeout_s, deadline).items():
        setattr(facts, name, outcome)
    return facts


def gather_gpu(settings: NodeSettings, phase: str, deadline: float, facts: Facts) -> None:
    if settings.gpu_probe == "none" or not registry.enabled(settings.checks, phase, "gpu"):
        return
    try:
        probe = make_gpu_probe(settings.gpu_probe)
    except ProbeError as exc:
        facts.gpu = ProbeOutcome(error=str(exc))
        return
    facts.gpu = run_probes({"gpu": probe.snapshot}, settings.probe_timeout_s, deadline)["gpu"]  # type: ignore[union-attr]


def _failed(names: Sequence[str], outcome: ProbeOutcome, settings: NodeSettings, what: str) -> List[CheckResult]:
    status = Status[settings.probe_timeout_status] if outcome.timed_out else Status.UNKNOWN
    return [CheckResult(n, status, f"{what} probe: {outcome.error}", {"probe_error": outcome.error},
                        outcome.duration_s) for n in names]


def judge(settings: NodeSettings, phase: str, facts: Facts, *, after_kmsg_seq: int,
          ib_history: ib_checks.IbHistory, previous_nvlink: Optional[Dict[str, int]]) -> List[CheckResult]:
    results: List[CheckResult] = []
    events: List[XidEvent] = []
    if facts.kernel.error and settings.gpu_probe != "none":
        results += _failed(["gpu.xid"], facts.kernel, settings, "kernel log")
    elif facts.kernel.value is not None:
        events = kmsg.xid_events(facts.kernel.value, after_kmsg_seq)
        ib_history = dataclasses.replace(ib_history, kernel_link_downs=kmsg.link_down_count(facts.kernel.value,
                                                                                            after_kmsg_seq))
    if settings.gpu_probe != "none" and not facts.gpu_skipped:
        if facts.gpu.error:
            results += _failed(registry.enabled(settings.checks, phase, "gpu"), facts.gpu, settings, "NVML")
        elif isinstance(facts.gpu.value, GpuSnapshot):
            gpu = gpu_checks.gpu_results(settings.checks, facts.gpu.value, events, phase, previous_nvlink)
            if facts.kernel.error:
                gpu = [r for r in gpu if r.name != "gpu.xid"]
            results += [_timed(r, facts.gpu.duration_s) for r in gpu]
    if facts.ib.error:
        results += _failed(registry.enabled(settings.checks, phase, "ib"), facts.ib, settings, "sysfs")
    elif facts.ib.value is not None:
        results += ib_checks.ib_results(settings.checks, facts.ib.value, phase, ib_history)
    if facts.system.error:
        results += _failed(registry.enabled(settings.checks, phase, "system"), facts.system, settings, "system")
    elif isinstance(facts.system.value, SystemFacts):
        results += system_checks.system_results(settings.checks, facts.system.value, phase)
    return results


def _timed(result: CheckResult, duration_s: float) -> CheckResult:
    return CheckResult(result.name, result.status, result.summary, result.details, duration_s)


def ib_ports(facts: Facts) -> List[IbPort]:
    return facts.ib.value if isinstance(facts.ib.value, list) else []
