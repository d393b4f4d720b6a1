"""What of a job's metrics file reaches node_exporter: pure decisions, no files.

node_exporter's textfile directory is root's, and one directory for all: a job that could write
there could also write series in another job's name. So a job writes into an inbox of its own
(`<inbox_dir>/<job id>/`, made by the prolog as root, owned by the job's user), and root's side
(every health run, the epilog, a periodic `slurmtools metrics relay`) copies each file across after
vetting it here: only the job metrics of slurmtools.common.metric_names' table, with the table's type and
help (a file cannot make node_exporter reject another job's series of the same name with a help of
its own) and the table's labels only, every sample labelled with the inbox's own job id, this node
and the job's user (set here, never taken from the file); a sample that names another job
(`slurm_job` or `attempt`) is refused, one line saying so."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from slurmtools.common.metric_names import METRICS, labels_of

JOB_LABEL = "slurm_job"
ATTEMPT_LABEL = "attempt"
NODE_LABEL = "node"
USER_LABEL = "user"
MAX_FILE_BYTES = 1 << 20            # a job's file is a few KB; a larger one is refused, never read whole
MAX_FILES_PER_JOB = 64              # one per rank on the node and the supervisor's
MAX_SAMPLES_PER_FILE = 10_000
MAX_REFUSALS_SAID = 3               # lines per file: a flood of forged samples is counted, not echoed
_JOB_ID = re.compile(r"[0-9]{1,12}")
_STEM = re.compile(r"[A-Za-z0-9._-]{1,100}")


@dataclass
class Vetted:
    families: List[Metric] = field(default_factory=list)
    refused: List[str] = field(default_factory=list)
    refused_count: int = 0

    def refuse(self, why: str) -> None:
        self.refused_count += 1
        if len(self.refused) < MAX_REFUSALS_SAID and why not in self.refused:
            self.refused.append(why)


def is_job_id(name: str) -> bool:
    return bool(_JOB_ID.fullmatch(name))


def relayed_name(job: str, source_name: str) -> str:
    """The file in node_exporter's directory for one inbox file: `slurmtools_relay_<job>_<stem>.prom`."""
    stem = source_name[:-len(".prom")] if source_name.endswith(".prom") else source_name
    safe = "".join(char if char.isalnum() or char in "._-" else "_" for char in stem)[:100]
    return f"slurmtools_relay_{job}_{safe}.prom"


def relayed_job(name: str) -> Optional[str]:
    """The job id in a relayed file's name (relayed_name), None for any other file."""
    prefix = "slurmtools_relay_"
    job = name[len(prefix):].split("_", 1)[0] if name.startswith(prefix) else ""
    return job if is_job_id(job) and name.endswith(".prom") else None


def is_inbox_file(name: str) -> bool:
    """A file the relay reads: `<stem>.prom`, no hidden file (a writer's temp file starts with '.')."""
    return name.endswith(".prom") and not name.startswith(".") and bool(_STEM.fullmatch(name))


def _names_another_job(labels: Dict[str, str], job: str) -> str:
    claimed = labels.get(JOB_LABEL)
    if claimed is not None and claimed != job:
        return f"{JOB_LABEL}={claimed!r}"
    attempt = labels.get(ATTEMPT_LABEL)
    if attempt is not None and attempt != job and not attempt.startswith(job + "."):
        return f"{ATTEMPT_LABEL}={attempt!r}"
    return ""


def _table_name(family: Metric) -> str:
    """The family's name in the table ("" when it is not a job metric); the parser names a counter
    without its `_total`."""
    for name in (family.name, family.name + "_total"):
        if name in METRICS and METRICS[name][0] == family.type:
            return name
    return ""


def _is_created_series(family: Metric) -> bool:
    """prometheus_client writes `<counter>_created` beside each counter: not relayed, not refused."""
    return family.name.endswith("_created") and family.name[:-len("_created")] + "_total" in METRICS


def vet(text: str, job: str, node: str, user: str,
        seen: Optional[Set[Tuple[str, Tuple[Tuple[str, str], ...]]]] = None) -> Vetted:
    """The families of one inbox file that may be relayed, labelled as this job's on this node,
    without the client's timestamps (node_exporter drops a textfile that has any); seen: the
    series of the job's files relayed before this one (a series twice, in one file or two, makes
    node_exporter refuse them: the second is refused here), updated."""
    out = Vetted()
    seen = set() if seen is None else seen
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:    # the parser raises ValueError, and others on odd input: all one refusal
        out.refuse(f"not Prometheus text ({type(exc).__name__})")
        return out
    samples = 0
    for family in families:
        name = _table_name(family)
        if not name:
            if not _is_created_series(family):
                out.refuse(f"{family.name[:80]}: not a job metric")
            continue
        kind, help_text = METRICS[name]
        allowed = set(labels_of(name)) | {USER_LABEL}
        kept = Metric(family.name, help_text, kind)
        for sample in family.samples:
            samples += 1
            if samples > MAX_SAMPLES_PER_FILE:
                out.refuse(f"more than {MAX_SAMPLES_PER_FILE} samples")
                break
            other = _names_another_job(sample.labels, job)
            extra = sorted(set(sample.labels) - allowed)
            if other:
                out.refuse(f"{sample.name[:80]}: names another job ({other[:60]})")
                continue
            if sample.name != name or extra:
                out.refuse(f"{sample.name[:80]}: not as the table has it" + (f" (label {extra[0][:40]!r})" if extra else ""))
                continue
            labels = dict(sample.labels, **{JOB_LABEL: job, NODE_LABEL: node, USER_LABEL: user})
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                out.refuse(f"{sample.name[:80]}: the same series twice")
                continue
            seen.add(key)
            kept.add_sample(sample.name, labels, sample.value)
        if kept.samples:
            out.families.append(kept)
    return out


def render(families: Sequence[Metric]) -> str:
    """The Prometheus text of vetted families (prometheus_client's own writer)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    class _Fixed:
        def collect(self) -> Sequence[Metric]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed())
    return generate_latest(registry).decode()
