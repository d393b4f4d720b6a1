"""One health run for a phase (prolog, epilog, periodic): gather, judge, report, drain, remember.

Exit-code contract with the prolog.d/epilog.d shims: 0 healthy (OK/WARN/UNKNOWN), 3 CRITICAL
(drained with our reason; the prolog fails so Slurm runs the job elsewhere). Config errors
(exit 2) and our own failures (exit 1) never drain unless `on_internal_error: closed`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurmtools.common.fsutil import write_json_atomic
from slurmtools.common.xid import REBOOT
from slurmtools.errors import ConfigError, Exit, SlurmCommandError, SlurmToolsError, one_line
from slurmtools.health import active_probe, remedy, report, runner, state
from slurmtools.health.checks.ib import IbHistory
from slurmtools.health.config import NodeSettings
from slurmtools.health.gpu_probe import FixtureProbe, ProbeError, make_gpu_probe
from slurmtools.health.model import CheckResult, Status, worst
from slurmtools.slurm import drain as drains
from slurmtools.slurm import commands as slurm



@dataclass
class Outcome:
    results: List[CheckResult]
    status: Status
    drained_reason: Optional[str]
    cached: bool
    duration_s: float
    report: Dict[str, Any]

    @property
    def exit_code(self) -> int:
        return Exit.NODE_BAD if self.status is Status.CRITICAL else Exit.OK


def _cache_hit(settings: NodeSettings, phase: str, st: state.HealthState, facts: runner.Facts, now_s: float) -> bool:
    """Prolog only: the node passed within cache_minutes, no IB counter moved and the kernel log
    has no new XID. Then the NVML probe (the slow part on real nodes) is skipped."""
    if phase != "prolog" or settings.cache_minutes <= 0 or not st.last_clean_t:
        return False
    if now_s - st.last_clean_t > settings.cache_minutes * 60:
        return False
    from slurmtools.health import kmsg
    from slurmtools.health.checks.ib import counter_state
    if facts.ib.error or facts.kernel.error:
        return False
    if counter_state(runner.ib_ports(facts)) != st.ib_counters:
        return False
    if facts.kernel.value is not None and kmsg.xid_events(facts.kernel.value, st.kmsg_seq):
        return False
    return True


def check_settings(settings: NodeSettings) -> None:
    """What a run needs from its settings beyond their syntax, checked before anything is read:
    the same ConfigError for `health check-config` and the prolog (which fails open on it)."""
    state.check_state_dir(Path(settings.state_dir))
    if settings.gpu_probe.startswith("fixture:"):
        probe = make_gpu_probe(settings.gpu_probe)
        if isinstance(probe, FixtureProbe):
            try:
                probe.check()
            except ProbeError as exc:
                raise ConfigError(f"gpu_probe: {exc}") from None


def run_phase(settings: NodeSettings, phase: str, host: str, *, job_id: Optional[str], allow_drain: bool = True,
              job_owner: Optional[Tuple[int, int]] = None) -> Outcome:
    """job_owner: the job's uid and gid (the prolog's SLURM_JOB_UID/GID), for its metrics inbox."""
    t0 = time.monotonic()
    now_s = time.time()
    deadline = t0 + (settings.active_deadline_s if phase == "active" else settings.deadline_s)
    check_settings(settings)                              # ConfigError: fail open, before any read
    spath = state.state_file(Path(settings.state_dir), host)
    st, state_problem = state.load(spath)
    facts = runner.gather_cheap(settings, phase, deadline)
    newest_seq = max((seq for seq, _ in facts.kernel.value), default=-1) if facts.kernel.value else None
    if newest_seq is not None and st.kmsg_seq > newest_seq:
        st.kmsg_seq = -1     # the kernel log restarted (a reboot): every record in it is new
    baseline = st.baseline_for(job_id) if phase == "epilog" else None
    prev_ib = baseline["ib_counters"] if baseline else st.ib_counters
    prev_ib_t = float(baseline["t"]) if baseline else st.ib_t
    prev_nvlink = baseline["nvlink_counters"] if baseline else st.nvlink_counters
    after_seq = int(baseline["kmsg_seq"]) if baseline else st.kmsg_seq
    if newest_seq is not None and after_seq > newest_seq:
        after_seq = -1

    cached = _cache_hit(settings, phase, st, facts, now_s)
    if cached:
        facts.gpu_skipped = True
    else:
        runner.gather_gpu(settings, phase, deadline, facts)
    history = IbHistory(counters=prev_ib or None, elapsed_s=now_s - prev_ib_t if prev_ib_t else None,
                        init_since=st.ib_init_since, now_s=now_s)
    results = runner.judge(settings, phase, facts, after_kmsg_seq=after_seq, ib_history=history,
                           previous_nvlink=prev_nvlink or None)
    if phase == "active":
        results += active_probe.active_results(settings, deadline)
    if baseline:
        results = [_attributed(r, job_id) for r in results]
    if state_problem:
        results.append(CheckResult("slurmtools.state", Status.WARN,
                                   f"previous state discarded ({state_problem}); counters start fresh"))
    overall = worst(results)

    drained_reason = None
    if overall is Status.CRITICAL and settings.drain and allow_drain:
        drained_reason = _take_out_of_service(settings, host, results, st, job_id, now_s)
    if phase == "periodic" and settings.auto_resume_after > 0:
        _auto_resume(settings, host, st, overall, results)
    # others' blames in the phases the admin chose (the periodic run only, by default: no job's
    # prolog waits on them), after this node's own verdict, within what is left of the run's time
    # box; a node found CRITICAL in a prolog or epilog leaves them to the next run (a kill at the
    # shim's limit would turn its verdict into a pass)
    own_first = overall is Status.CRITICAL and phase in ("prolog", "epilog")
    handles = phase in settings.blame.handle_in and settings.drain and allow_drain and not own_first
    blames = _handle_blames(settings, deadline) if handles else []
    relayed = _relay_metrics(settings, phase, host, job_id, job_owner)

    _remember(st, facts, overall, phase, job_id, now_s)
    state.save(spath, st)
    duration = time.monotonic() - t0
    doc = report.to_json(host, phase, results, job_id=job_id, duration_s=duration, drained=drained_reason,
                         cached=cached)
    if blames:
        doc["blames"] = blames
    if relayed:
        doc["job_metrics"] = relayed
    write_json_atomic(spath.parent / f"last-{phase}.json", doc)
    if settings.textfile:
        report.write_textfile(settings.textfile, host, phase, results, duration)
    if settings.syslog:
        report.log_syslog(host, phase, results, job_id)
    return Outcome(results, overall, drained_reason, cached, duration, doc)


def _handle_blames(settings: NodeSettings, until: Optional[float] = None) -> List[str]:
    """The blames jobs reported (slurmtools.blame), for any node: checked, drained or refused, one
    line each (to the hook's log, and the report). A spool or Slurm problem is ours, never the node's:
    one line, and this node's own verdict stands."""
    from slurmtools.blame import intake
    try:
        lines = [handled.line() for handled in intake.handle(settings.blame, until=until)]
    except Exception as exc:    # a spool, Slurm or munge problem, or our bug: never this node's verdict
        lines = [one_line(f"slurmtools: blames not handled: {type(exc).__name__}: {exc}")]
    for line in lines:
        print(line, file=sys.stderr)
    return lines


def _relay_metrics(settings: NodeSettings, phase: str, host: str, job_id: Optional[str],
                   job_owner: Optional[Tuple[int, int]]) -> List[str]:
    """Jobs' metrics through the root-owned relay (slurmtools.metricsrelay); one line per problem."""
    from slurmtools.metricsrelay import inbox
    uid, gid = job_owner if job_owner else (None, None)
    lines = inbox.on_phase(settings.job_metrics, phase, host, job_id, uid, gid)
    for line in lines:
        print(line, file=sys.stderr)
    return lines


def _take_out_of_service(settings: NodeSettings, host: str, results: List[CheckResult], st: state.HealthState,
                         job_id: Optional[str], now_s: float) -> Optional[str]:
    """Drain with our reason, or (remedy.py) ask Slurm to reboot the node when idle and resume it;
    the reason set, or None when the node was already drained (a person's reason is kept)."""
    first = next(r for r in results if r.status is Status.CRITICAL)
    chosen = remedy.decide(results, st.reboot_times, now_s, settings.max_reboots_per_day)
    rebooting = chosen.action == REBOOT
    reason = drains.DrainReason("CRITICAL", first.name, first.summary + (" remedy=reboot" if rebooting else ""), job_id)
    try:
        done = drains.reboot(host, reason) if rebooting else drains.drain(host, reason)
    except SlurmCommandError as exc:
        results.append(CheckResult("slurmtools.drain", Status.UNKNOWN, f"drain failed: {exc}"))
        return None
    if remedy.reboot_class(results):
        said = ("already drained, not rebooted" if not done else
                f"reboot requested: {chosen.why}" if rebooting else f"drained: {chosen.why}")
        results.append(CheckResult("slurmtools.remedy", Status.WARN, said, {"action": chosen.action}))
    if rebooting and done:
        st.reboot_times = remedy.recent(st.reboot_times, now_s) + [now_s]
    return reason.render() if done else None


# checks that compare with a previous reading: in the epilog that reading is the job's prolog
# baseline, so what they find happened during the job
DELTA_CHECKS = frozenset({"gpu.xid", "ib.counters", "ib.flap", "gpu.nvlink"})


def _attributed(result: CheckResult, job_id: Optional[str]) -> CheckResult:
    if result.status in (Status.OK, Status.UNKNOWN) or result.name not in DELTA_CHECKS:
        return result
    return CheckResult(result.name, result.status, result.summary + " (during this job)", dict(result.details, job_id=job_id), result.duration_s)


def _remember(st: state.HealthState, facts: runner.Facts, overall: Status, phase: str, job_id: Optional[str],
              now_s: float) -> None:
    from slurmtools.health.checks.gpu import nvlink_counters
    from slurmtools.health.checks.ib import counter_state, init_since_now
    from slurmtools.health.model import GpuSnapshot
    if isinstance(facts.ib.value, list):
        st.ib_counters = counter_state(facts.ib.value)
        st.ib_t = now_s
        st.ib_init_since = init_since_now(facts.ib.value, st.ib_init_since, now_s)
    if isinstance(facts.gpu.value, GpuSnapshot):
        st.nvlink_counters = nvlink_counters(facts.gpu.value)
    if facts.kernel.value:
        st.kmsg_seq = max(seq for seq, _ in facts.kernel.value)
    if overall is not Status.CRITICAL:
        st.last_clean_t = now_s
    if phase == "prolog" and job_id:
        st.record_baseline(job_id, now_s)
    if phase == "epilog" and job_id:
        st.jobs.pop(job_id, None)


def _auto_resume(settings: NodeSettings, host: str, st: state.HealthState, overall: Status,
                 results: List[CheckResult]) -> None:
    """Resume our own drain after K consecutive clean periodic runs; never a person's drain."""
    if overall is Status.CRITICAL:
        st.clean_runs = 0
        return
    st.clean_runs += 1
    if st.clean_runs < settings.auto_resume_after:
        return
    try:
        node = slurm.nodes(host)
        if node and node[0].drained and drains.auto_resumable(node[0].reason):
            slurm.resume_node(host)
            results.append(CheckResult("slurmtools.resume", Status.OK,
                                       f"resumed after {st.clean_runs} clean runs (was: {node[0].reason})"))
            st.clean_runs = 0
    except SlurmCommandError as exc:
        results.append(CheckResult("slurmtools.resume", Status.UNKNOWN, f"resume failed: {exc}"))


def internal_error_outcome(settings: Optional[NodeSettings], phase: str, host: str, job_id: Optional[str],
                           error: str, *, allow_drain: bool = True) -> Optional[Outcome]:
    """`on_internal_error: closed`: fail the phase, and drain with an internal-error reason unless
    draining is off (the config's `drain: false`, or `--no-drain`: then the phase fails, nothing drains)."""
    if settings is None or settings.on_internal_error != "closed" or not settings.drain:
        return None
    reason = drains.DrainReason("CRITICAL", "slurmtools.internal", error[:120], job_id)
    drained: Optional[str] = None
    if allow_drain:
        try:
            drains.drain(host, reason)
            drained = reason.render()
        except SlurmCommandError:
            pass
    res = [CheckResult("slurmtools.internal", Status.CRITICAL, error)]
    return Outcome(res, Status.CRITICAL, drained, False, 0.0,
                   {"host": host, "phase": phase, "status": "CRITICAL", "results": [r.to_json() for r in res]})


def run_guarded(settings: NodeSettings, phase: str, host: str, *, job_id: Optional[str],
                allow_drain: bool = True, job_owner: Optional[Tuple[int, int]] = None) -> Optional[Outcome]:
    """run_phase, failing open when slurmtools itself fails (a bug, not a sick node): the job
    runs and nothing is drained (None, after one line on stderr), unless `on_internal_error: closed`."""
    try:
        return run_phase(settings, phase, host, job_id=job_id, allow_drain=allow_drain, job_owner=job_owner)
    except SlurmToolsError:
        raise
    except Exception as exc:  # our own bug: never a traceback, never a drain (unless configured)
        what = one_line(f"{type(exc).__name__}: {exc}")
        closed = internal_error_outcome(settings, phase, host, job_id, what, allow_drain=allow_drain)
        if closed is None:
            print(f"slurmtools: error: health run failed ({what}); failing open", file=sys.stderr)
        return closed


def exit_now(code: int) -> int:
    """The exit code, returned; but when a probe thread is still stuck (a hung NVML call), the
    process leaves at once: a daemon thread must not keep the prolog alive."""
    if runner.any_probe_thread_alive():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def dump(outcome: Outcome) -> str:
    return json.dumps(outcome.report, sort_keys=True)
