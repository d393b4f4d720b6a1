"""The supervisor's metrics file: attempts, restarts by cause, lost steps, restart latency and
goodput of the whole chain so far, from the ledger (labels slurm_job/node). Written where the ranks
write theirs, by the same rules (train/metrics.py)."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from prometheus_client import CollectorRegistry

from slurmtools.common import ledger
from slurmtools.common.ledger import Cause, Event
from slurmtools.common.metric_names import JOB_LABELS
from slurmtools.common.one_write import say
from slurmtools.requeue import goodput
from slurmtools.requeue.goodput import Goodput
from slurmtools.train.metrics import metric_of, metrics_dir, set_metric, textfile_name, write


def job_registry(result: Goodput, restarts_by_cause: Mapping[str, int], stragglers: int,
                 labels: Mapping[str, str]) -> CollectorRegistry:
    """The supervisor's view of the whole chain so far (from the ledger)."""
    reg = CollectorRegistry()
    job_labels = {name: str(labels[name]) for name in JOB_LABELS}
    set_metric(metric_of(reg, "slurmtools_job_attempts_total", JOB_LABELS), job_labels, result.attempts)
    restarts = metric_of(reg, "slurmtools_job_restarts_total", JOB_LABELS + ("cause",))
    for cause, count in sorted(restarts_by_cause.items()):
        set_metric(restarts, dict(job_labels, cause=cause), count)
    set_metric(metric_of(reg, "slurmtools_job_steps_lost_total", JOB_LABELS), job_labels, sum(result.steps_lost))
    if result.restart_latency_s:
        set_metric(metric_of(reg, "slurmtools_job_restart_latency_seconds", JOB_LABELS), job_labels,
             result.restart_latency_s[-1])
    set_metric(metric_of(reg, "slurmtools_job_goodput_ratio", JOB_LABELS), job_labels, result.ratio)
    set_metric(metric_of(reg, "slurmtools_job_final_step", JOB_LABELS), job_labels, result.final_step)
    set_metric(metric_of(reg, "slurmtools_job_stragglers_total", JOB_LABELS), job_labels, stragglers)
    return reg


def restarts_by_cause(events: Sequence[Event]) -> Dict[str, int]:
    """Attempts that ended in anything but completion, counted by their cause."""
    counts: Dict[str, int] = {}
    for attempt in ledger.attempts(list(events)):
        if attempt.cause is not None and attempt.cause != Cause.COMPLETED.value:
            counts[attempt.cause] = counts.get(attempt.cause, 0) + 1
    return counts


def stragglers(events: Sequence[Event]) -> int:
    """Distinct nodes the straggler detector named."""
    return len({event.straggler for event in events if isinstance(event, ledger.NodeSlowdown) and event.straggler})


def job_registry_from_ledger(events: Sequence[Event], labels: Mapping[str, str]) -> CollectorRegistry:
    return job_registry(goodput.goodput(list(events)), restarts_by_cause(events), stragglers(events), labels)


def write_job_metrics(control_dir: Path, job: str, environ: Mapping[str, str]) -> Optional[Path]:
    """The supervisor's file, from the ledger; metrics never fail a job (an unwritable directory
    is skipped), so the path written or None."""
    directory = metrics_dir(environ)
    if directory is None:
        return None
    path = directory / textfile_name(job, "supervisor")
    try:
        write(path, job_registry_from_ledger(ledger.read(control_dir),
                                             {"slurm_job": job, "node": socket.gethostname().split(".")[0]}))
    except Exception as exc:     # never the supervisor's failure: one line, and the job goes on
        say(f"slurmtools: job metrics not written to {path}: {type(exc).__name__}: {exc}")
        return None
    return path
