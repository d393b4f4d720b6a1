"""The user's side of every cluster test, run as the cluster's ordinary job user (not root, not a
Slurm operator), as on a real cluster: submitting, following, requeueing and cancelling jobs, the
notebook path, the report. Only what an admin does stays root's (the cluster, the health hooks,
drains and resumes, killing a node to make a fault).

`call(fn, ...)` runs a Python function in a forked child that has dropped to the user's uid and gid
(no supplementary groups), HOME in a directory of its own; its result or exception comes back
pickled. `run(argv)` runs a command the same way. Another release's Slurm commands are wrappers
that enter its Debian root; for an ordinary user they map it back to its own uid (in-root), so
Slurm and munge see exactly this user there too."""
from __future__ import annotations

import os
import pickle
import subprocess
import tempfile
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TypeVar

from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import jobuser
from tests.conftest import TEST_CLUSTER_NAME, TEST_STATE_DIR, TEST_WORK_DIR, unreachable_by_others

T = TypeVar("T")


@lru_cache(maxsize=1)
def user() -> jobuser.JobUser:
    return jobuser.job_user(mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR))


def home() -> Path:
    return TEST_WORK_DIR / "home"


def environ(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment a user's login would give: the test's, with the user's own identity and HOME."""
    env = dict(os.environ if base is None else base)
    path = os.environ.get("PATH", "")
    # what root has on PATH that the user cannot enter (a Python in root's home) is not theirs
    usable = [entry for entry in path.split(os.pathsep) if entry and Path(entry).is_dir()
              and not unreachable_by_others(Path(entry) / ".")]
    env.update({"HOME": str(home()), "USER": user().name, "LOGNAME": user().name, "PATH": os.pathsep.join(usable)})
    return env


def user_dir(prefix: str) -> Path:
    """A fresh directory the user owns (0755: root and every node read it) for a job's output,
    checkpoints and control files."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=TEST_WORK_DIR))
    path.chmod(0o755)
    os.chown(path, user().uid, user().gid)
    return path


def root_dir(prefix: str) -> Path:
    """A fresh root-owned directory (0755) for what an admin writes: health fixtures the prolog
    trusts only when root owns them."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=TEST_WORK_DIR))
    path.chmod(0o755)
    return path


def _drop() -> None:
    who = user()
    env = environ()          # as root: it looks at directories the user may not enter
    os.setgroups([])
    os.setgid(who.gid)
    os.setuid(who.uid)
    os.environ.update(env)
    os.chdir(home())


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) as the user, in a forked child; its result, or its exception raised here
    (with the child's traceback in the message when the exception itself cannot travel)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: never returns into pytest
        os.close(read_fd)
        try:
            _drop()
            outcome: tuple = ("ok", fn(*args, **kwargs))
        except BaseException as exc:                # noqa: B902 - everything goes back to the parent
            outcome = ("error", exc, traceback.format_exc())
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:        # pytest's Failed, say: its message travels as an AssertionError
            said = f"{type(outcome[1]).__name__}: {outcome[1]}" if outcome[0] == "error" else f"a result ({exc})"
            data = pickle.dumps(("error", AssertionError(f"as the user: {said}"),
                                 outcome[2] if len(outcome) > 2 else ""))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"as the user: the child died without an answer (wait status {status})")
    kind, *rest = pickle.loads(data)
    if kind == "ok":
        return rest[0]
    exc, child_traceback = rest
    if isinstance(exc, AssertionError):
        exc.add_note(f"(as the user {user().name}) {child_traceback}")
    elif isinstance(exc, Exception):
        raise AssertionError(f"as the user {user().name}: {type(exc).__name__}: {exc}\n{child_traceback}") from exc
    raise exc


def command(argv: List[str]) -> List[str]:
    """argv run as the user (setpriv: its uid and gid, no supplementary groups, its environment)."""
    who = user()
    env = [f"{key}={value}" for key, value in environ({}).items()]
    return ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups", "--",
            "env", *env, *argv]


def run(argv: List[str], **kwargs: Any) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 120)
    kwargs.setdefault("cwd", str(home()))
    return subprocess.run(command(argv), **kwargs)


def popen(argv: List[str], **kwargs: Any) -> subprocess.Popen:
    kwargs.setdefault("cwd", str(home()))
    return subprocess.Popen(command(argv), **kwargs)
