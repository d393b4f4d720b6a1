"""Preflight from the batch step: one srun step over the allocation within the time budget,
its report read back and announced as JSON lines. Effects only; the judging is judge.py's.

The step copies the training launch's srun options (its task layout, CPUs, binding,
container) and runs `python -m slurmtools.preflight.worker` with the supervisor's own
interpreter: slurmtools must be importable there on every node, as it is for the batch step.
A preflight that cannot run, fails or runs out of time names no node: training starts, and
the outcome says why (our check must never be what stops a job).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.common import ledger
from slurmtools.common.control_dir import PREFLIGHT_REPORT_FILE
from slurmtools.preflight.judge import Finding, Settings, named
from slurmtools.requeue import actions, policy, step
from slurmtools.requeue.actions import emit
from slurmtools.requeue.topology import step_argv

WORKER_MODULE = "slurmtools.preflight.worker"


@dataclass
class Outcome:
    status: str                               # passed | failed | error | skipped
    detail: str = ""
    findings: List[Finding] = field(default_factory=list)
    report: Optional[Dict[str, Any]] = None
    wall_s: float = 0.0

    @property
    def named(self) -> Dict[str, Finding]:
        return named(self.findings)


def worker_argv(train_argv: Sequence[str], nodes: Sequence[str], report: Path, settings: Settings,
                python: str = sys.executable) -> Optional[List[str]]:
    """The preflight step: the training srun's options, the worker as the program; None when
    the training launch is not an srun (nothing to copy the layout from)."""
    if not train_argv or os.path.basename(train_argv[0]) != "srun":
        return None
    options: List[str] = []
    for arg in train_argv[1:]:
        if not arg.startswith("-"):
            break
        options.append(arg)
    worker = [python, "-m", WORKER_MODULE, f"--report={report}", f"--budget-s={settings.budget_s}",
              f"--slow-factor={settings.slow_factor}"]
    if settings.min_busbw_gbps is not None:
        worker.append(f"--min-busbw-gbps={settings.min_busbw_gbps}")
    return step_argv([train_argv[0], *options, *worker], nodes)


def read_report(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("findings"), list) else None


def findings_of(report: Mapping[str, Any]) -> List[Finding]:
    out = []
    for item in report.get("findings", []):
        if isinstance(item, dict) and item.get("test"):
            out.append(Finding(str(item["test"]), item.get("node"), str(item.get("measured", "")),
                               str(item.get("expected", "")), str(item.get("detail", ""))))
    return out


def run(train_argv: Sequence[str], nodes: Sequence[str], env: Mapping[str, str], control_dir: Path,
        settings: Settings, attempt_id: str, stop_timeout_s: float = 8.0) -> Outcome:
    """Run the preflight step on nodes and announce its results (one JSON line per measurement)."""
    report_path = control_dir / PREFLIGHT_REPORT_FILE
    argv = worker_argv(train_argv, nodes, report_path, settings)
    if argv is None:
        outcome = Outcome("skipped", "the training launch is not an srun step")
        emit("preflight", attempt_id, status=outcome.status, detail=outcome.detail)
        return outcome
    report_path.unlink(missing_ok=True)
    start_t = time.time()
    emit("preflight_start", attempt_id, nodes=",".join(nodes), budget_s=settings.budget_s)
    try:
        launched = step.launch(argv, env)
    except OSError as exc:
        outcome = Outcome("error", f"cannot start {argv[0]}: {exc}")
        emit("preflight", attempt_id, status=outcome.status, detail=outcome.detail)
        return outcome
    timed_out = False
    try:
        while launched.child.poll() is None:
            if time.time() - start_t > settings.budget_s:
                timed_out = True
                step.stop(launched.child, stop_timeout_s)
                break
            time.sleep(0.2)
    finally:
        launched.finish(stop_timeout_s)
    wall_s = round(time.time() - start_t, 3)
    report = read_report(report_path)
    if report is None:
        why = (f"did not finish within its budget of {settings.budget_s} s" if timed_out
               else f"ended (exit {launched.child.returncode}) without a report")
        outcome = Outcome("error", why, wall_s=wall_s)
        emit("preflight", attempt_id, status="error", detail=why, wall_s=wall_s)
        return outcome
    return announce(report, attempt_id, wall_s)


def announce(report: Mapping[str, Any], attempt_id: str, wall_s: float) -> Outcome:
    """The report as JSON lines in the job's output: one per measurement, then the verdict."""
    for result in report.get("canary", []):
        emit("preflight_canary", attempt_id, **result)
    for link in ([report["ring"]] if report.get("ring") else []) + report.get("pairs", []):
        emit("preflight_link", attempt_id, **link)
    findings = findings_of(report)
    outcome = Outcome("failed" if findings else "passed", findings=findings, report=dict(report), wall_s=wall_s)
    emit("preflight", attempt_id, status=outcome.status, wall_s=wall_s, rounds=report.get("rounds"),
         findings=[finding.to_json() for finding in findings], named=sorted(outcome.named))
    return outcome


def ledger_event(outcome: Outcome, attempt_id: str, nodes: Sequence[str]) -> "ledger.PreflightCheck":
    return ledger.PreflightCheck(
        attempt_id, time.time(), outcome.status, ",".join(nodes), outcome.wall_s,
        {node: f"preflight.{finding.test} {finding.words()}" for node, finding in outcome.named.items()},
        outcome.detail)


def blame(outcome: Outcome, this_run: "actions.Run", job_id: Optional[int], attempt_id: str
          ) -> "Optional[Tuple[policy.Evidence, bool]]":
    """The evidence against the first node preflight named, and whether the run can go on in
    its allocation without all of them; every other named node is drained and left out here
    (the policy drains and replaces the first, within the restart budget)."""
    blamed = outcome.named
    if not blamed:
        return None
    first, *others = blamed
    in_place = True
    for node in others:
        finding = blamed[node]
        actions.drain_node(job_id, attempt_id, node, diagnosis(finding), direct=this_run.direct_drain)
        in_place = in_place and this_run.topology.can_lose(node, this_run.lost)
        this_run.lost.append(node)
    finding = blamed[first]
    in_place = in_place and this_run.topology.can_lose(first, this_run.lost)
    evidence = policy.Evidence(exit_code=None, progressed=False, preflight_node=first,
                               preflight_check=f"preflight.{finding.test}", preflight_detail=finding.words())
    return evidence, in_place


def diagnosis(finding: Finding) -> "policy.Diagnosis":
    return policy.Diagnosis(policy.Cause.PREFLIGHT, node=finding.node, detail=finding.words(), fatal_for_node=True,
                            check=f"preflight.{finding.test}")


def check_allocation(train_argv: Sequence[str], this_run: "actions.Run", env: Mapping[str, str], control_dir: Path,
                     settings: Settings, attempt_id: str, job_id: Optional[int], stop_timeout_s: float
                     ) -> "Optional[Tuple[policy.Evidence, bool]]":
    """The supervisor's preflight: every node of the allocation (spares too) before training,
    recorded in the ledger; the evidence against a node it named, and whether the run can go
    on in this allocation without the named nodes."""
    checked = [node for node in this_run.topology.allocation if node not in this_run.lost]
    outcome = run(train_argv, checked, env, control_dir, settings, attempt_id, stop_timeout_s)
    ledger.append(control_dir, ledger_event(outcome, attempt_id, checked))
    return blame(outcome, this_run, job_id, attempt_id)
