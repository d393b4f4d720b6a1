"""The job's side of a blame: the supervisor (running as the job's user) reports a node it blames,
with its evidence, as a munge credential in the site's blame spool; the root-owned health hooks
decide and drain (intake.py). The spool and munged's socket are the site's settings (the health
config's `blame:`, root-owned and world-readable), which the caller reads."""
from __future__ import annotations

import os
import time
from pathlib import Path

from slurmtools.blame import munge, spool
from slurmtools.blame.config import BlameSettings
from slurmtools.blame.model import Blame, clean_evidence, kind_of_check
from slurmtools.errors import SlurmToolsError

class BlameError(SlurmToolsError):
    """A blame could not be reported (no spool configured, munge failed); one line."""


def report(job_id: int, node: str, check: str, evidence: str, settings: BlameSettings) -> Path:
    """Report node as blamed by job_id (settings: the site's, health config `blame:`); the report's
    path in the spool."""
    if kind_of_check(check) is None:
        raise BlameError(f"no kind of evidence for check {check!r}")
    if not settings.spool_dir:
        raise BlameError("the site's health config sets no blame.spool_dir: blames are off here")
    cluster = os.environ.get("SLURM_CLUSTER_NAME") or _cluster()
    blame = Blame(cluster, str(job_id), node, check, clean_evidence(evidence), time.time())
    try:
        credential = munge.encode(blame.payload(), settings.munge_socket)
        return spool.drop(Path(settings.spool_dir), credential)
    except (munge.MungeError, spool.SpoolError, OSError) as exc:
        raise BlameError(f"blame of {node} not reported: {exc}") from None


def _cluster() -> str:
    from slurmtools.slurm import commands as slurm
    return slurm.cluster_name()
