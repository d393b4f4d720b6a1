"""Reports of a health run: a JSON document, a Prometheus textfile for node_exporter, syslog lines."""
from __future__ import annotations

import logging
import logging.handlers
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurmtools.health.model import CheckResult, Status, worst


def to_json(host: str, phase: str, results: List[CheckResult], *, job_id: Optional[str], duration_s: float,
            drained: Optional[str], cached: bool) -> Dict[str, Any]:
    return {"host": host, "phase": phase, "job_id": job_id, "status": worst(results).name, "time": time.time(),
            "duration_s": round(duration_s, 4), "drained_reason": drained, "cached": cached,
            "results": [r.to_json() for r in results]}


def write_textfile(path: str, host: str, phase: str, results: List[CheckResult], duration_s: float) -> None:
    """node_exporter textfile collector format, written atomically by prometheus_client."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    status = Gauge("slurmtools_health_check_status", "Check status: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN",
                   ["check", "phase"], registry=reg)
    seconds = Gauge("slurmtools_health_check_duration_seconds", "Time to gather the check's facts",
                    ["check", "phase"], registry=reg)
    for result in results:
        status.labels(result.name, phase).set(int(result.status))
        seconds.labels(result.name, phase).set(result.duration_s)
    Gauge("slurmtools_health_status", "Worst status of the run", ["phase"], registry=reg).labels(phase).set(
        int(worst(results)))
    Gauge("slurmtools_health_run_duration_seconds", "Wall time of the run", ["phase"], registry=reg).labels(
        phase).set(duration_s)
    Gauge("slurmtools_health_last_run_timestamp_seconds", "When the run finished", ["phase"],
          registry=reg).labels(phase).set(time.time())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(path, reg)


def log_syslog(host: str, phase: str, results: List[CheckResult], job_id: Optional[str]) -> None:
    """One line per non-OK result; silently nothing where there is no syslog socket."""
    if not os.path.exists("/dev/log"):
        return
    logger = logging.getLogger("slurmtools.health.syslog")
    if not logger.handlers:
        handler = logging.handlers.SysLogHandler(address="/dev/log")
        handler.setFormatter(logging.Formatter("slurmtools: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    for result in results:
        if result.status is not Status.OK:
            level = logging.ERROR if result.status is Status.CRITICAL else logging.WARNING
            logger.log(level, "%s %s %s %s%s", host, phase, result.status.name, result.name,
                       f" {result.summary}" + (f" job={job_id}" if job_id else ""))


def format_text(results: List[CheckResult]) -> str:
    width = max((len(r.name) for r in results), default=10)
    return "\n".join(f"{r.status.name:<8} {r.name:<{width}}  {r.summary}" for r in results)
