"""The job's side of a blame: the supervisor (running as the job's user) reports a node it blames,
with its evidence, as a munge credential in the site's blame spool; the root-owned health hooks
decide and drain (intake.py). The spool and munged's socket come from the site's health config
(root-owned, world-readable), found as the health hooks find it."""
from __future__ import annotations

import os
import time
from pathlib import Path

from slurmtools.blame import munge, spool
from slurmtools.blame.model import Blame, clean_evidence, kind_of_check
from slurmtools.errors import ConfigError, SlurmToolsError

class BlameError(SlurmToolsError):
    """A blame could not be reported (no spool configured, munge failed); one line."""


def report(job_id: int, node: str, check: str, evidence: str) -> Path:
    """Report node as blamed by job_id; the report's path in the spool."""
    from slurmtools.health.config import load_config, this_host
    if kind_of_check(check) is None:
        raise BlameError(f"no kind of evidence for check {check!r}")
    try:
        settings = load_config().for_host(this_host()).blame
    except ConfigError as exc:
        raise BlameError(f"cannot read the site's blame settings: {exc}") from None
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
    from slurmtools import slurm
    return slurm.cluster_name()
