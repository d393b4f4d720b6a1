"""The mini-cluster's own ordinary user: jobs run as a user, not as root or a Slurm operator, on a
real cluster, so the rehearsal has one too. `up` creates `slurmtools-<cluster>` (uid = gid, the
first free from JOB_UID_BASE) when it is missing, and `down --purge` removes it when `up` created it. A
name or id already taken by some other account is never reused: `up` says so in one line."""
from __future__ import annotations

import grp
import pwd
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Set

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster.layout import MiniClusterLayout

JOB_UID_BASE = 64100          # below 65534 (nobody), above what distributions give their users by default
JOB_UID_COUNT = 400


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int


def _comment(cluster_name: str) -> str:
    return f"slurmtools mini-cluster {cluster_name} jobs"


def _free_id(taken_uids: Set[int], taken_gids: Set[int]) -> int:
    for candidate in range(JOB_UID_BASE, JOB_UID_BASE + JOB_UID_COUNT):
        if candidate not in taken_uids and candidate not in taken_gids:
            return candidate
    raise MiniClusterError(f"no free uid/gid in {JOB_UID_BASE}..{JOB_UID_BASE + JOB_UID_COUNT - 1} for a job user")


def job_user(layout: MiniClusterLayout) -> JobUser:
    """`slurmtools-<cluster>`: the account when it exists and is ours (its comment says so), else the
    first uid free as both uid and gid from JOB_UID_BASE. The name is the key, never the slot: a
    stopped cluster's user (kept until `down --purge`) must not collide with the next cluster's."""
    name = f"slurmtools-{layout.name}"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return JobUser(name, *(2 * [_free_id({e.pw_uid for e in pwd.getpwall()}, {g.gr_gid for g in grp.getgrall()})]))
    if entry.pw_gecos != _comment(layout.name):
        raise MiniClusterError(f"user {name} exists but was not made by slurmtools (comment {entry.pw_gecos!r}): not ours")
    return JobUser(name, entry.pw_uid, entry.pw_gid)


def _exists(user: JobUser) -> bool:
    try:
        pwd.getpwnam(user.name)
        return True
    except KeyError:
        return False


def _run(argv: List[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if proc.returncode != 0:
        raise MiniClusterError(f"{' '.join(argv[:1])} failed: {(proc.stderr.strip().splitlines() or [''])[-1]}")


def ensure(layout: MiniClusterLayout, record: Dict[str, object]) -> JobUser:
    """The cluster's job user, created (no home, no login shell) and noted in record when missing."""
    user = job_user(layout)
    if _exists(user):
        return user
    try:
        grp.getgrgid(user.gid)
    except KeyError:
        _run(["groupadd", "--gid", str(user.gid), user.name])
    _run(["useradd", "--uid", str(user.uid), "--gid", str(user.gid), "--no-create-home", "--home-dir", "/nonexistent",
          "--shell", "/usr/sbin/nologin", "--comment", _comment(layout.name), user.name])
    record["job_user"] = user.name
    return user


def remove(layout: MiniClusterLayout, record: Dict[str, object]) -> None:
    """Remove the job user when this cluster's `up` created it."""
    user = job_user(layout)
    if record.get("job_user") != user.name:
        return
    try:
        if pwd.getpwnam(user.name).pw_uid == user.uid:
            _run(["userdel", user.name])
    except KeyError:
        pass
    try:
        if grp.getgrgid(user.gid).gr_name == user.name:
            _run(["groupdel", user.name])
    except KeyError:
        pass
    record.pop("job_user", None)
