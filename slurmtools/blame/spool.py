"""The blame spool: a directory every node's root-owned health hooks read and every job's user
can drop a report into, like /tmp (root-owned, mode 1733: anyone creates, nobody else's files can
be touched, nobody but root lists it).

    <spool>/blame.<random>.munge         a report: one munge credential (written by the job's user)
    <spool>/done/<name>.json             the root side's record of it (root-only, 0700)

The user side writes a report under a dot-name and renames it into place, so the root side never
reads half a report. The root side claims a report by renaming it into done/ (on a shared file
system exactly one node wins), then reads it without following a link, never waits on a FIFO, and
reads at most MAX_REPORT_BYTES. A spool that is not root-owned and sticky is not trusted at all."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from slurmtools.common.fsutil import read_small_regular, write_json_atomic

REPORT = re.compile(r"^blame\.[A-Za-z0-9]{8,32}\.munge$")
DONE_DIR = "done"
MAX_REPORT_BYTES = 8192
MAX_REPORTS_PER_RUN = 64          # a flood is handled a bounded amount at a time
KEEP_RECORDS_S = 7 * 24 * 3600.0
SPOOL_MODE = 0o1733


MAX_RECORDS = 20000               # done/'s records kept at most (a week of them, or fewer)
# a user's reports waiting at once: a job blames a node or a few, and each run takes 64 in turns;
# past this a user's newest are removed unread, so no flood grows what every run lists
MAX_WAITING_PER_USER = 256


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


class SpoolError(Exception):
    """The spool cannot be used (missing, or not trustworthy); one line."""


def drop(spool_dir: Path, credential: str) -> Path:
    """The user side: write one report; its path. Never follows a link planted at either name."""
    if not spool_dir.is_dir():
        raise SpoolError(f"blame spool {spool_dir} does not exist (the admin creates it, mode 1733)")
    name = f"blame.{secrets.token_hex(8)}.munge"
    tmp = spool_dir / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(credential + "\n")
        os.rename(tmp, spool_dir / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return spool_dir / name


def check_spool(spool_dir: Path) -> Path:
    """The spool's done/ dir, made when missing; SpoolError unless the spool is a real directory
    owned by root with the sticky bit (else any user could replace another's report) and done/ is
    root's alone."""
    try:
        info = os.lstat(spool_dir)
    except OSError as exc:
        raise SpoolError(f"blame spool {spool_dir}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or not info.st_mode & stat.S_ISVTX:
        raise SpoolError(f"blame spool {spool_dir} is not a root-owned sticky directory (mode 1733); not read")
    done = spool_dir / DONE_DIR
    try:
        os.mkdir(done, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(done)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        raise SpoolError(f"{done} is not root's own directory (mode 0700); not read")
    return done


def make_spool(spool_dir: Path) -> None:
    """The admin's set-up (root): the spool with mode 1733."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    os.chown(spool_dir, 0, 0)
    os.chmod(spool_dir, SPOOL_MODE)
    check_spool(spool_dir)


def _by_owner(spool_dir: Path) -> Dict[int, List[Tuple[float, str]]]:
    """The waiting reports (modification time, name) by the user who wrote them (the file's owner),
    in name order."""
    by_owner: Dict[int, List[Tuple[float, str]]] = {}
    for name in sorted(name for name in os.listdir(spool_dir) if REPORT.match(name)):
        try:
            info = os.lstat(spool_dir / name)
        except OSError:
            continue                      # gone meanwhile (another node's run claimed it)
        by_owner.setdefault(info.st_uid, []).append((info.st_mtime, name))
    return by_owner


def waiting(spool_dir: Path) -> List[str]:
    """The names of the reports waiting, at most MAX_REPORTS_PER_RUN, taken in turn from each
    user who wrote them (the file's owner): one user's flood of reports never holds back another's."""
    turns = [[name for _, name in dated] for _, dated in sorted(_by_owner(spool_dir).items())]
    taken: List[str] = []
    for index in range(max((len(names) for names in turns), default=0)):
        taken += [names[index] for names in turns if index < len(names)]
        if len(taken) >= MAX_REPORTS_PER_RUN:
            break
    return taken[:MAX_REPORTS_PER_RUN]


def remove_over_quota(spool_dir: Path) -> Dict[int, int]:
    """Each user's waiting reports past their MAX_WAITING_PER_USER oldest, removed unread (root
    may, in the sticky spool): {uid: how many}. Unrecorded one by one: a flood fills no records."""
    removed: Dict[int, int] = {}
    for owner, dated in _by_owner(spool_dir).items():
        for _, name in sorted(dated)[MAX_WAITING_PER_USER:]:
            _discard(spool_dir / name)
        if len(dated) > MAX_WAITING_PER_USER:
            removed[owner] = len(dated) - MAX_WAITING_PER_USER
    return removed


def claim(spool_dir: Path) -> Iterator[Tuple[str, Optional[bytes]]]:
    """The root side: (name, content) of each waiting report, one at a time (None: not a regular
    file of at most MAX_REPORT_BYTES). Each is moved into done/ (on a shared file system exactly
    one node wins it) and read; the caller records it, then forgets it (forget): a run killed in
    between loses none (the next run is handed what it had claimed, CLAIMED in done/), and an
    entry that cannot be removed (a directory named like a report) costs no other report. The
    spool is checked now (SpoolError), not at the first report."""
    done = check_spool(spool_dir)
    return _claim_each(spool_dir, done)


CLAIMED = ".claimed"


def _claim_each(spool_dir: Path, done: Path) -> Iterator[Tuple[str, Optional[bytes]]]:
    left = sorted(name[:-len(CLAIMED)] for name in os.listdir(done)
                  if name.endswith(CLAIMED) and REPORT.match(name[:-len(CLAIMED)]))
    for name in left[:MAX_REPORTS_PER_RUN]:
        yield name, read_small_regular(done / f"{name}{CLAIMED}", MAX_REPORT_BYTES)
    for name in waiting(spool_dir)[:max(0, MAX_REPORTS_PER_RUN - len(left))]:
        claimed = done / f"{name}{CLAIMED}"
        try:
            os.rename(spool_dir / name, claimed)
        except OSError:
            continue                      # another node's health run took it
        yield name, read_small_regular(claimed, MAX_REPORT_BYTES)


def forget(done: Path, name: str) -> None:
    """A claimed report whose record is written: removed, whatever it is."""
    _discard(done / f"{name}{CLAIMED}")


def _discard(path: Path) -> None:
    """Remove a claimed entry, whatever it is; a directory with its tree (never following a link)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


@contextlib.contextmanager
def handling_lock(done: Path, wait_s: float = 2.0) -> Iterator[bool]:
    """Held while one health run handles reports (flock on done/.lock: released when the process
    dies, so a killed run never blocks the next). Yields False when another run held it for
    wait_s: that run handles the reports, and a prolog is never held up behind it."""
    fd = os.open(done / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)


def record(done: Path, name: str, entry: Dict[str, Any]) -> None:
    write_json_atomic(done / f"{name}.json", entry, durable=False)


def records(done: Path, now_s: Optional[float] = None) -> List[Dict[str, Any]]:
    """The records of the last KEEP_RECORDS_S (older ones, and files that are no record, are
    removed), at most MAX_RECORDS: past that the oldest refused ones are removed first, so a flood
    of garbage reports grows neither root's done/ nor what every run reads, and never pushes out
    the accepted records the budgets and confirmations count."""
    now_s = time.time() if now_s is None else now_s
    read: List[Tuple[Path, Dict[str, Any]]] = []
    for path in sorted(done.glob("blame.*.json")):
        raw = read_small_regular(path, 65536)
        try:
            entry = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):      # a record nested past the parser's depth is no record
            entry = None
        if not isinstance(entry, dict):
            path.unlink(missing_ok=True)
            continue
        handled = entry.get("handled_s")
        if isinstance(handled, (int, float)) and now_s - handled > KEEP_RECORDS_S:
            path.unlink(missing_ok=True)
            continue
        read.append((path, entry))
    if len(read) > MAX_RECORDS:
        # refused reports go first, the oldest of them: garbage never pushes out the evidence that
        # counts against a budget or for a confirmation
        order = sorted(read, key=lambda item: (item[1].get("accepted") is True, _mtime(item[0])))
        for path, _ in order[:len(read) - MAX_RECORDS]:
            path.unlink(missing_ok=True)
        kept = {path for path, _ in order[len(read) - MAX_RECORDS:]}
        read = [(path, entry) for path, entry in read if path in kept]
    return [entry for _, entry in read]
