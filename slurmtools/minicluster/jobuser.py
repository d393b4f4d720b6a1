"""The mini-cluster's own ordinary user: jobs run as a user, not as root or a Slurm operator, on a
real cluster, so the rehearsal has one too. `up` creates `slurmtools-<cluster>` (uid and gid
JOB_UID_BASE + slot) when it is missing, and `down --purge` removes it when `up` created it. A
name or id already taken by some other account is never reused: `up` says so in one line."""
from __future__ import annotations

import grp
import pwd
import subprocess
from dataclasses import dataclass
from typing import Dict, List

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster.layout import MiniClusterLayout

JOB_UID_BASE = 64100          # below 65534 (nobody), above what distributions give their users by default


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int


def job_user(layout: MiniClusterLayout) -> JobUser:
    uid = JOB_UID_BASE + layout.slot
    return JobUser(f"slurmtools-{layout.name}", uid, uid)


def _exists(user: JobUser) -> bool:
    """True when the account is exactly ours; MiniClusterError when its name or ids are another's."""
    try:
        entry = pwd.getpwnam(user.name)
    except KeyError:
        entry = None
    if entry is not None:
        if (entry.pw_uid, entry.pw_gid) != (user.uid, user.gid):
            raise MiniClusterError(f"user {user.name} exists with uid {entry.pw_uid}, not {user.uid}: not ours")
        return True
    owners = []
    try:
        owners.append(("uid", pwd.getpwuid(user.uid).pw_name))
    except KeyError:
        pass
    try:
        owners.append(("gid", grp.getgrgid(user.gid).gr_name))
    except KeyError:
        pass
    for what, owner in owners:
        if owner != user.name:
            raise MiniClusterError(f"{what} {user.uid} belongs to {owner!r}: the cluster's job user cannot take it")
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
          "--shell", "/usr/sbin/nologin", "--comment", f"slurmtools mini-cluster {layout.name} jobs", user.name])
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
