"""A training job's numbers as Prometheus metrics, written as node_exporter textfiles.

Two writers, one table of names (METRICS): each rank's per-step training and communication
numbers (StepMetrics, labels slurm_job/attempt/node/rank), written here, and the supervisor's attempts,
restarts by cause, lost steps, restart latency and goodput (requeue/job_metrics.py, labels slurm_job/node). Both follow the
textfile collector's convention: one `*.prom` file per writer, in the job's own inbox, which the
admin's root-owned relay (slurmtools.metricsrelay) vets and copies to node_exporter's directory,
replaced atomically (prometheus_client writes a temporary file and renames it), so a scrape never
sees half a file. Names carry their units (`_seconds`, `_ratio`) and counters end in `_total`.
"""
from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

from slurmtools.common.metric_names import JOB_PLACEHOLDER, METRICS, METRICS_DIR_ENV, NODE_PLACEHOLDER, TRAIN_LABELS

DEFAULT_MIN_INTERVAL_S = 5.0


@dataclass(frozen=True)
class StepSample:
    """One finished step as a rank measured it; None: not measured."""
    step: int
    step_s: float
    tokens: Optional[int] = None
    loss: Optional[float] = None
    grad_norm: Optional[float] = None
    collective_s: Optional[float] = None
    data_wait_s: Optional[float] = None


Metric = Union[Counter, Gauge]


def metric_of(registry: CollectorRegistry, name: str, labels: Sequence[str]) -> Metric:
    kind, help_text = METRICS[name]
    if kind == "counter":   # prometheus_client adds the _total suffix itself
        return Counter(name[:-len("_total")], help_text, list(labels), registry=registry)
    return Gauge(name, help_text, list(labels), registry=registry)


def set_metric(metric: Metric, labels: Mapping[str, str], value: Optional[float]) -> None:
    """A gauge set, a counter advanced from zero (each file is written from a fresh registry)."""
    if value is None or not math.isfinite(value):
        return
    if isinstance(metric, Gauge):
        metric.labels(**labels).set(value)
    else:
        metric.labels(**labels).inc(max(value, 0.0))


def write(path: Path, registry: CollectorRegistry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)


class StepMetrics:
    """One per rank: record() every step, the file is rewritten at most every min_interval_s
    (and by flush() at the end), so metrics cost nothing a step would notice."""

    def __init__(self, path: Path, labels: Mapping[str, str], *, min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        missing = [name for name in TRAIN_LABELS if name not in labels]
        if missing:
            raise ValueError(f"StepMetrics needs labels {', '.join(missing)}")
        self.path = path
        self.labels = {name: str(labels[name]) for name in TRAIN_LABELS}
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.last: Optional[StepSample] = None
        self.steps = 0
        self.tokens = 0
        self.collective_s = 0.0
        self._written_t: Optional[float] = None

    def record(self, sample: StepSample) -> bool:
        """Account one step; True when the file was written now."""
        self.last = sample
        self.steps += 1
        self.tokens += sample.tokens or 0
        self.collective_s += sample.collective_s or 0.0
        now = self.clock()
        if self._written_t is not None and now - self._written_t < self.min_interval_s:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        if self.last is None:
            return
        write(self.path, self.registry())
        self._written_t = self.clock()

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry()
        sample = self.last
        assert sample is not None
        values: Dict[str, Optional[float]] = {
            "slurmtools_train_step": sample.step,
            "slurmtools_train_steps_total": self.steps,
            "slurmtools_train_step_seconds": sample.step_s,
            "slurmtools_train_tokens_per_second": (sample.tokens / sample.step_s
                                                   if sample.tokens is not None and sample.step_s > 0 else None),
            "slurmtools_train_tokens_total": self.tokens,
            "slurmtools_train_loss": sample.loss,
            "slurmtools_train_grad_norm": sample.grad_norm,
            "slurmtools_train_step_collective_seconds": sample.collective_s,
            "slurmtools_train_collective_seconds_total": self.collective_s,
            "slurmtools_train_collective_share_ratio": (sample.collective_s / sample.step_s
                                                        if sample.collective_s is not None and sample.step_s > 0
                                                        else None),
            "slurmtools_train_step_data_wait_seconds": sample.data_wait_s,
            "slurmtools_train_last_update_timestamp_seconds": time.time(),
        }
        for name, value in values.items():
            set_metric(metric_of(reg, name, TRAIN_LABELS), self.labels, value)
        return reg


def textfile_name(job: str, writer: str) -> str:
    """`slurmtools_job_<job>_<writer>.prom`: one file per job and writer (a rank, the supervisor)."""
    safe = "".join(char if char.isalnum() or char in "._-" else "_" for char in f"{job}_{writer}")
    return f"slurmtools_job_{safe}.prom"


# ---- where the files go: a job opts in with its spec's metrics_dir (SLURMTOOLS_METRICS_DIR) ------


def metrics_dir(environ: Mapping[str, str], host: Optional[str] = None) -> Optional[Path]:
    """The dir this node's files go to. `%N` in it becomes the node's short host name, `%j` the
    job's id: with the admin's relay (slurmtools.metricsrelay) that is `<inbox_dir>/%j`, the inbox
    the prolog made for this job; without one, a directory of the job's own."""
    value = environ.get(METRICS_DIR_ENV, "")
    if not value:
        return None
    value = value.replace(NODE_PLACEHOLDER, host or socket.gethostname().split(".")[0])
    return Path(value.replace(JOB_PLACEHOLDER, environ.get("SLURM_JOB_ID", "")))


def step_metrics_for(rank: int, attempt_id: str, environ: Mapping[str, str]) -> Optional[StepMetrics]:
    """A rank's StepMetrics when the job asked for metrics, else None."""
    directory = metrics_dir(environ)
    if directory is None:
        return None
    job = attempt_id.split(".", 1)[0]
    labels = {"slurm_job": job, "attempt": attempt_id, "node": socket.gethostname().split(".")[0], "rank": str(rank)}
    return StepMetrics(directory / textfile_name(job, f"rank{rank}"), labels)
