"""Running the active diagnostics (phase `active`): each tool as a child process in its own
session, time-boxed, one after another (they would load the same GPUs and links), its output
handed to the parsers in checks/active.py. Commands come from the root-owned health config and
run as argv, never through a shell. A tool that is not installed is UNKNOWN with the reason,
never a pass; output in a format the parser does not know is UNKNOWN too.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from slurmtools.health import registry, sysfs
from slurmtools.health.checks import active
from slurmtools.health.config import NodeSettings
from slurmtools.health.model import CheckResult, Status

T = TypeVar("T")
IB_SERVER_START_S = 1.0


@dataclass(frozen=True)
class ToolRun:
    output: str
    error: Optional[str] = None      # why there is no usable output (not installed, timed out, ...)
    exit_code: Optional[int] = None


def _kill_session(proc: "subprocess.Popen[str]") -> None:
    """The tool and whatever it started; its pipes drained and closed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.communicate()


def run_tool(argv: Sequence[str], timeout_s: float) -> ToolRun:
    """stdout of argv (stderr's tail on failure); the whole process group dies on the time box."""
    if shutil.which(argv[0]) is None:
        return ToolRun("", f"{argv[0]} is not installed (not found on PATH)")
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(0.1, timeout_s))
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        return ToolRun("", f"{argv[0]} timed out after {timeout_s:g} s")
    if proc.returncode != 0 and not out.strip():
        tail = " ".join(err.strip().splitlines()[-2:])[:300]
        return ToolRun("", f"{argv[0]} exited {proc.returncode}: {tail or 'no output'}", proc.returncode)
    return ToolRun(out, None, proc.returncode)


def _judged(name: str, run: ToolRun, parse: Callable[[str], T], judge: Callable[[T], CheckResult],
            duration_s: float) -> CheckResult:
    if run.error is not None:
        return CheckResult(name, Status.UNKNOWN, run.error, {}, duration_s)
    try:
        parsed = parse(run.output)
    except active.ParseError as exc:
        return CheckResult(name, Status.UNKNOWN, f"output not understood: {exc}", {"exit_code": run.exit_code},
                           duration_s)
    result = judge(parsed)
    return CheckResult(result.name, result.status, result.summary, result.details, duration_s)


def ib_devices(settings: NodeSettings) -> List[str]:
    configured = settings.checks.active.ib_write_bw.devices
    if configured:
        return list(configured)
    return sorted({port.hca for port in sysfs.read_ib_ports(Path(settings.sysfs_root))})


def ib_loopback(command: str, device: str, size_bytes: int, timeout_s: float) -> ToolRun:
    """perftest's usual loopback: a server and a client on this node over the same HCA."""
    if shutil.which(command) is None:
        return ToolRun("", f"{command} is not installed (not found on PATH)")
    base = [command, "-d", device, "-s", str(size_bytes), "--report_gbits"]
    server = subprocess.Popen(base, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        time.sleep(IB_SERVER_START_S)
        return run_tool(base + ["localhost"], timeout_s)
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        server.wait()


def active_results(settings: NodeSettings, deadline: float) -> List[CheckResult]:
    """The enabled active checks, each within what is left of the run's time box."""
    checks = settings.checks.active
    results: List[CheckResult] = []

    def left(timeout_s: float) -> float:
        return max(0.1, min(timeout_s, deadline - time.monotonic()))

    if registry.runs(checks.dcgm_diag, "active"):
        t0 = time.monotonic()
        run = run_tool([checks.dcgm_diag.command, "diag", "--run", str(checks.dcgm_diag.level), "--json"],
                       left(checks.dcgm_diag.timeout_s))
        results.append(_judged("active.dcgm_diag", run, active.parse_dcgm_diag,
                               lambda found: active.check_dcgm_diag(checks.dcgm_diag, found), time.monotonic() - t0))
    if registry.runs(checks.nccl_allreduce, "active"):
        t0 = time.monotonic()
        run = run_tool([checks.nccl_allreduce.command, *checks.nccl_allreduce.arguments],
                       left(checks.nccl_allreduce.timeout_s))
        results.append(_judged("active.nccl_allreduce", run, active.parse_all_reduce_perf,
                               lambda parsed: active.check_nccl_allreduce(checks.nccl_allreduce, parsed),
                               time.monotonic() - t0))
    if registry.runs(checks.ib_write_bw, "active"):
        results.append(_ib_result(settings, left))
    return results


def _ib_result(settings: NodeSettings, left: Callable[[float], float]) -> CheckResult:
    params = settings.checks.active.ib_write_bw
    t0 = time.monotonic()
    measured: Dict[str, Tuple[int, float]] = {}
    for device in ib_devices(settings):
        run = ib_loopback(params.command, device, params.size_bytes, left(params.timeout_s))
        if run.error is not None:
            return CheckResult("active.ib_write_bw", Status.UNKNOWN, f"device={device}: {run.error}", {},
                               time.monotonic() - t0)
        try:
            measured[device] = active.parse_ib_write_bw(run.output)
        except active.ParseError as exc:
            return CheckResult("active.ib_write_bw", Status.UNKNOWN, f"device={device}: output not understood: {exc}",
                               {}, time.monotonic() - t0)
    result = active.check_ib_write_bw(params, measured)
    return CheckResult(result.name, result.status, result.summary, result.details, time.monotonic() - t0)
