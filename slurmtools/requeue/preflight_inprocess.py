"""Preflight in the notebook path: submitit's tasks run it themselves before training.

There is no supervisor there, so the tasks do its part: every task takes part in the checks
(worker.check, on a port next to the training rendezvous), rank 0 announces the report,
drains the named nodes and requeues the job without them (they are excluded), and every
task then waits to be ended. Each such requeue is a counted failure in the ledger: past the
restart budget the job fails instead (bounded, never a requeue storm). A preflight that
cannot run names nobody: training starts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping, Optional

from slurmtools.common import ledger
from slurmtools.common.control_dir import PREFLIGHT_ENV
from slurmtools.common.one_write import say
from slurmtools.common.rendezvous import RDZV_PORT_BASE, RDZV_PORT_SPAN
from slurmtools.errors import SlurmCommandError
from slurmtools.preflight import worker
from slurmtools.preflight.judge import Settings, named
from slurmtools.requeue import preflight_launch as launch
from slurmtools.requeue import actions, policy
from slurmtools.requeue.actions import emit
from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec, RequeueSpec


def env_value(spec: JobSpec) -> Optional[str]:
    """PREFLIGHT_ENV's value for a spec (None: the job does not check its nodes)."""
    if not spec.preflight_enabled:
        return None
    return json.dumps({"budget_s": spec.preflight_budget_s, "slow_factor": spec.preflight_slow_factor,
                       "min_busbw_gbps": spec.preflight_min_busbw_gbps}, sort_keys=True)


def settings_from_env(environ: Mapping[str, str]) -> Optional[Settings]:
    text = environ.get(PREFLIGHT_ENV)
    if not text:
        return None
    data = json.loads(text)
    return Settings(int(data["budget_s"]), float(data["slow_factor"]), data.get("min_busbw_gbps"))


def _port_beside(port: str) -> str:
    return str(RDZV_PORT_BASE + (int(port) - RDZV_PORT_BASE + 1) % RDZV_PORT_SPAN)


def before_training(environ: Mapping[str, str], rank: int, job_id: str, attempt_id: str,
                    control_dir: Optional[Path]) -> bool:
    """True: train; False: rank 0 requeued the job without the named nodes (wait to be ended)."""
    settings = settings_from_env(environ)
    if settings is None:
        return True
    env = dict(environ, MASTER_PORT=_port_beside(environ["MASTER_PORT"]))
    start_t = time.time()
    try:
        report = worker.check(settings, env)
    except Exception as exc:          # our check failing must not stop the job
        if rank == 0:
            emit("preflight", attempt_id, status="error", detail=f"{type(exc).__name__}: {exc}".splitlines()[0])
        return True
    if rank != 0:
        return not named(launch.findings_of(report))
    outcome = launch.announce(report, attempt_id, round(time.time() - start_t, 3))
    if control_dir is not None:
        ledger.append(control_dir, launch.ledger_event(outcome, attempt_id, report.get("nodes", [])))
    if not outcome.named:
        return True
    _requeue_without(outcome, job_id, attempt_id, control_dir)
    return False


def _requeue_without(outcome: launch.Outcome, job_id: str, attempt_id: str, control_dir: Optional[Path]) -> None:
    blamed = outcome.named
    events = ledger.read(control_dir) if control_dir is not None else []
    limits = RequeueSpec()
    spent = len(policy.in_window(ledger.history(events), limits.restart_window_h, time.time()))
    budget = limits.max_restarts
    first = next(iter(blamed))
    stop = spent + 1 > budget
    reason = (f"restart budget spent ({budget} failures): preflight named {','.join(blamed)}" if stop
              else f"preflight named {','.join(blamed)}; requeued without them")
    if control_dir is not None:
        ledger.append(control_dir, ledger.AttemptEnd(
            attempt_id=attempt_id, time_s=time.time(), cause=policy.Cause.PREFLIGHT.value, counted=True,
            action=(policy.Action.STOP if stop else policy.Action.REQUEUE).value,
            detail=blamed[first].words(), reason=reason, node=first))
    for node, finding in blamed.items():
        actions.drain_node(int(job_id), attempt_id, node, launch.diagnosis(finding))
    if stop:
        say(f"slurmtools: STOP: {reason}")
        raise SystemExit(f"slurmtools: {reason}")
    try:
        from ClusterShell.NodeSet import NodeSet
        excluded = NodeSet(",".join(blamed))
        current = (slurm.show_job(int(job_id)) or {}).get("ExcNodeList", "(null)")
        if current not in ("", "(null)"):
            excluded.update(current)
        slurm.requeue_excluding(int(job_id), {"ExcNodeList": str(excluded)})
        emit("requeue", attempt_id, by="slurmtools", excnodelist=str(excluded))
    except (SlurmCommandError, ValueError) as exc:
        say(f"slurmtools: requeue of job {job_id} failed: {exc}")
