"""The relay's effects, as root: make a job's inbox (prolog), copy its vetted files to
node_exporter's directory (every health run, a periodic `slurmtools metrics relay`, the epilog),
remove the inbox when the job ends, and a finished job's relayed files after keep_h.

Nothing here follows a link or opens a FIFO: the inbox is the user's to fill (model.py says what
of it is believed); the inbox root and the textfile directory are root's and must stay so."""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import time
from pathlib import Path
from typing import List, Optional, Set, Tuple

from slurmtools.common.fsutil import read_small_regular, write_text_atomic
from slurmtools.errors import one_line
from slurmtools.metricsrelay import model
from slurmtools.metricsrelay.config import JobMetricsSettings


class InboxError(Exception):
    """The inbox root or the textfile directory is not root's alone: nothing is relayed."""


def _root_dir(path: Path) -> Path:
    """path, made (0755) when missing; InboxError unless it is a real directory root owns that no
    one else may write."""
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise InboxError(f"{path} must be a directory of root's that no one else may write")
    return path


def prepare(settings: JobMetricsSettings, host: str, job_id: str, uid: int, gid: int) -> Optional[Path]:
    """The prolog's part: `<inbox>/<job id>/`, owned by the job's user (a requeued job's is kept)."""
    if not settings.enabled or not model.is_job_id(job_id) or uid == 0:
        return None
    job_dir = _root_dir(settings.inbox_for(host)) / job_id
    try:
        os.mkdir(job_dir, 0o755)
    except FileExistsError:
        pass
    info = os.lstat(job_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise InboxError(f"{job_dir} is not a directory")
    os.chown(job_dir, uid, gid, follow_symlinks=False)
    os.chmod(job_dir, 0o755)
    return job_dir


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def relay_job(settings: JobMetricsSettings, host: str, job_id: str) -> List[str]:
    """Copy one job's vetted files across; one line per file with refusals."""
    return _relay_one(_root_dir(settings.inbox_for(host)), _root_dir(settings.textfiles_for(host)), host, job_id)


def _relay_one(inbox: Path, textfiles: Path, host: str, job_id: str) -> List[str]:
    job_dir = inbox / job_id
    try:
        info = os.lstat(job_dir)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode) or info.st_uid == 0:
        return [f"slurmtools: metrics of job {job_id} not relayed: {job_dir} is not a job's inbox"]
    user = _user_name(info.st_uid)
    lines = []
    names = sorted(name for name in os.listdir(job_dir) if model.is_inbox_file(name))
    if len(names) > model.MAX_FILES_PER_JOB:
        lines.append(f"slurmtools: job {job_id} has {len(names)} metrics files; the first "
                     f"{model.MAX_FILES_PER_JOB} relayed")
    seen: Set[Tuple[str, Tuple[Tuple[str, str], ...]]] = set()
    for name in names[:model.MAX_FILES_PER_JOB]:
        raw = read_small_regular(job_dir / name, model.MAX_FILE_BYTES, owner=info.st_uid)
        if raw is None:
            lines.append(f"slurmtools: metrics of job {job_id}: {name} refused (not a regular file of the job's "
                         f"user, with one link, of at most {model.MAX_FILE_BYTES} bytes)")
            continue
        vetted = model.vet(raw.decode("utf-8", errors="replace"), job_id, host, user, seen)
        if vetted.refused_count:
            lines.append(one_line(f"slurmtools: metrics of job {job_id} (user {user}): {name}: "
                                  f"{vetted.refused_count} refused: {'; '.join(vetted.refused)}"))
        if vetted.families:
            write_text_atomic(textfiles / model.relayed_name(job_id, name), model.render(vetted.families),
                              durable=False)
    return lines


def relay_all(settings: JobMetricsSettings, host: str, now_s: Optional[float] = None) -> List[str]:
    """Every job inbox on this node, then the sweep of finished jobs' relayed files."""
    if not settings.enabled:
        return []
    inbox = _root_dir(settings.inbox_for(host))
    textfiles = _root_dir(settings.textfiles_for(host))
    lines: List[str] = []
    jobs = sorted(name for name in os.listdir(inbox) if model.is_job_id(name))
    for job_id in jobs:
        lines += _relay_one(inbox, textfiles, host, job_id)
    _sweep(settings, textfiles, set(jobs), time.time() if now_s is None else now_s)
    return lines


def _sweep(settings: JobMetricsSettings, textfiles: Path, running: Set[str], now_s: float) -> None:
    """A finished job's relayed files (its inbox is gone) older than keep_h."""
    for name in os.listdir(textfiles):
        job = model.relayed_job(name)
        if job is None or job in running:
            continue
        path = textfiles / name
        try:
            if now_s - os.lstat(path).st_mtime > settings.keep_h * 3600:
                path.unlink()
        except FileNotFoundError:
            continue


def finish(settings: JobMetricsSettings, host: str, job_id: str) -> List[str]:
    """The epilog's part: the job's last files relayed, then its inbox removed (no link followed)."""
    if not settings.enabled or not model.is_job_id(job_id):
        return []
    lines = relay_job(settings, host, job_id)
    job_dir = settings.inbox_for(host) / job_id
    if job_dir.is_dir() and not job_dir.is_symlink():
        shutil.rmtree(job_dir, ignore_errors=True)
    return lines


def on_phase(settings: JobMetricsSettings, phase: str, host: str, job_id: Optional[str],
             job_uid: Optional[int], job_gid: Optional[int]) -> List[str]:
    """A health run's part, by phase; a relay problem is ours, never the node's: one line."""
    if not settings.enabled:
        return []
    try:
        if phase == "prolog" and job_id and job_uid is not None:
            prepare(settings, host, job_id, job_uid, job_gid if job_gid is not None else job_uid)
            return []
        if phase == "epilog" and job_id:
            return finish(settings, host, job_id)
        if phase == "periodic":
            return relay_all(settings, host)
        return []
    except Exception as exc:       # an inbox, file system or our bug: never this node's verdict
        return [one_line(f"slurmtools: job metrics not relayed: {type(exc).__name__}: {exc}")]
