"""Checkpoints that are either complete or ignored.

A checkpoint is written into `step_N.tmp/` (never into an existing directory), its files
are fsynced, a MANIFEST.json with every file's size and digest (slurmtools.checkpoint.digests) is written last (temp +
fsync + replace), the directory is renamed to `step_N/` and the parent fsynced. Each writer
(a rank) fsyncs and hashes the files it wrote itself (`seal_own_files`, off the training
thread for async saves), so the committer reads none of a large checkpoint's shards: it merges
the writers' records and hashes only what no writer recorded. `latest()`
returns the newest `step_N` whose manifest verifies, falling back to older ones: a kill
mid-save leaves only a `.tmp` directory, a flipped byte fails the checksum. Framework-agnostic:
a callable writes files into a directory (torch DCP lives in checkpoint_torch.py).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from slurmtools.checkpoint import digests
from slurmtools.common.fsutil import fsync_path, write_json_atomic
from slurmtools.errors import CheckpointError

MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_HASH_CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 16 << 20
# in a staging dir: each writer's {file: {size, digest}} for the files it wrote and sealed
SHARD_HASHES_DIR = ".shard-hashes"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    """A sealed checkpoint: its step, its directory and its manifest (every file's size and digest)."""

    step: int
    path: Path
    manifest: Dict[str, Any]


def open_regular_fd(path: Path) -> int:
    """An fd for path only if it is a regular file: never follows a symlink, never blocks on a
    FIFO or device (a hostile manifest may name /dev/zero, a FIFO, or `../outside`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    return fd


def file_digest(path: Path, algorithm: str = digests.ALGORITHM) -> str:
    digest = digests.new(algorithm)
    with os.fdopen(open_regular_fd(path), "rb") as handle:
        for chunk in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return str(digest.hexdigest())


def _read_manifest(path: Path) -> Dict[str, Any]:
    with os.fdopen(open_regular_fd(path), "rb") as handle:
        raw = handle.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"larger than {MAX_MANIFEST_BYTES} bytes")
    manifest = json.loads(raw)
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    return manifest


def seal_own_files(staging: Path, writer: str, names: Iterable[str],
                   hashed_while_written: Optional[Mapping[str, Tuple[int, str]]] = None) -> Dict[str, Dict[str, Any]]:
    """A writer's part of the commit: fsync and hash the files it wrote into staging and record
    them for the committer (SHARD_HASHES_DIR/<writer>.json), which then reads none of them.
    hashed_while_written: {name: (size, digest)} of files already fsynced and hashed as they were
    written (slurmtools.checkpoint.hashing_fs): taken as they are when the size on disk agrees, never re-read."""
    known = hashed_while_written or {}
    entries: Dict[str, Dict[str, Any]] = {}
    for name in sorted(names):
        member = staging / name
        size = member.stat().st_size
        if name in known and known[name][0] == size:
            entries[name] = digests.entry(size, known[name][1])
            continue
        fsync_path(member)
        entries[name] = digests.entry(size, file_digest(member))
    (staging / SHARD_HASHES_DIR).mkdir(exist_ok=True)
    write_json_atomic(staging / SHARD_HASHES_DIR / f"{writer}.json", entries)
    return entries


def sealed_by_writers(staging: Path) -> Dict[str, Dict[str, Any]]:
    """The writers' records merged (a malformed record or entry is ignored: its files are hashed
    by the committer instead)."""
    merged: Dict[str, Dict[str, Any]] = {}
    directory = staging / SHARD_HASHES_DIR
    for record in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            entries = _read_manifest(record)
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            continue
        for rel, info in entries.items():
            recorded = digests.entry_digest(info)
            if _member_problem(staging, rel, info) is None and recorded is not None:
                merged[rel] = digests.entry(info["size"], recorded[1], recorded[0])
    return merged


def writers_sealed(staging: Path) -> int:
    """How many writers recorded their files so far."""
    directory = staging / SHARD_HASHES_DIR
    return sum(1 for _ in directory.glob("*.json")) if directory.is_dir() else 0


def mark_seal_failed(staging: Path, writer: str, why: str) -> None:
    """Best effort (the file system may be full): tell the committer this writer's part failed,
    so it gives the save up at once instead of waiting for a seal that never comes."""
    try:
        (staging / SHARD_HASHES_DIR).mkdir(exist_ok=True)
        (staging / SHARD_HASHES_DIR / f"{writer}.failed").write_text(why[:500])
    except OSError:
        pass


def seal_failures(staging: Path) -> List[str]:
    """The failures writers marked: 'writer: why'."""
    directory = staging / SHARD_HASHES_DIR
    out = []
    for path in sorted(directory.glob("*.failed")) if directory.is_dir() else []:
        try:
            out.append(f"{path.stem}: {path.read_text(errors='replace')[:500]}")
        except OSError as exc:
            out.append(f"{path.stem}: ({exc})")
    return out


def _member_problem(step_dir: Path, rel: Any, info: Any) -> Optional[str]:
    """Why one manifest entry is not a sealed file of this checkpoint, or None."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or len(rel) > 1024:
        return f"bad file name {str(rel)[:60]!r}"
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or ".." in parts or rel == MANIFEST or not parts:
        return f"file name outside the checkpoint: {rel[:60]!r}"
    if digests.entry_digest(info) is None:
        return f"bad entry for {rel[:60]!r}"
    size = info.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"bad size for {rel[:60]!r}"
    parent = step_dir
    for part in parts[:-1]:                        # no symlinked directory on the way
        parent = parent / part
        if parent.is_symlink() or not parent.is_dir():
            return f"missing file {rel}"
    return None


# errors of a read that say nothing of the file: the storage (a target failing over, a lost mount)
TRANSIENT_READ_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.EAGAIN, errno.ENOTCONN,
                                   errno.ECONNRESET, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.EREMOTEIO,
                                   errno.ENOLINK, errno.ECOMM})
TRANSIENT_READ_MARK = "storage error: "


def verify_files(path: Path, files: Mapping[str, Any], names: Iterable[str]) -> Optional[str]:
    """Why some of these members of a complete checkpoint do not match their digest, or None
    (each rank of a resume checks its share: every file is read once, by one rank). A read failed
    for a transient error is said so (is_transient_read): the storage, not the file."""
    for rel in names:
        try:
            if not _matches(path / rel, files[rel]):
                return f"checksum mismatch in {rel}"
        except OSError as exc:
            mark = TRANSIENT_READ_MARK if exc.errno in TRANSIENT_READ_ERRNOS else ""
            return f"{mark}cannot read {rel} ({exc})"
    return None


def is_transient_read(problem: str) -> bool:
    """Whether verify_files' problem is a transient read error (retry; never quarantine)."""
    return problem.startswith(TRANSIENT_READ_MARK)


def _matches(path: Path, info: Mapping[str, Any]) -> bool:
    """Whether the file's digest is the one its (well-formed: _member_problem) entry records."""
    recorded = digests.entry_digest(info)
    return recorded is not None and file_digest(path, recorded[0]) == recorded[1]


def verify_dir(path: Path, *, checksums: bool = True, step: Optional[int] = None) -> Tuple[bool, str, Dict[str, Any]]:
    """(ok, why-not, manifest) for one checkpoint directory. Any malformed manifest makes the
    checkpoint invalid (never an exception); only regular files inside the directory are read."""
    try:
        manifest = _read_manifest(path / MANIFEST)
    except FileNotFoundError:
        return False, "no manifest", {}
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return False, f"unreadable manifest ({exc})", {}
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False, "manifest lists no files", manifest
    if step is not None and manifest.get("step") != step:
        return False, f"manifest is for step {str(manifest.get('step'))[:20]}, not {step}", manifest
    for rel, info in files.items():
        problem = _member_problem(path, rel, info)
        if problem:
            return False, problem, manifest
        member = path / rel
        try:
            member_stat = os.lstat(member)
        except OSError:
            return False, f"missing file {rel}", manifest
        if not stat.S_ISREG(member_stat.st_mode):
            return False, f"{rel} is not a regular file", manifest
        if member_stat.st_size != info["size"]:
            return False, f"size mismatch in {rel} ({member_stat.st_size} != {info['size']})", manifest
        try:
            if checksums and not _matches(member, info):
                return False, f"checksum mismatch in {rel}", manifest
        except OSError as exc:
            return False, f"cannot read {rel} ({exc})", manifest
    return True, "", manifest


def write_manifest(directory: Path, step: int, meta: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Seal a directory whose files are all written: fsync each (what a writer sealed itself is
    taken from its record), then MANIFEST.json last (temp + fsync + replace). Also for a
    framework's own checkpoint directory, sealed in place once the framework is done with it
    (slurmtools.integrations): without the manifest it is never resumed from."""
    sealed = sealed_by_writers(directory)
    shutil.rmtree(directory / SHARD_HASHES_DIR, ignore_errors=True)
    files: Dict[str, Dict[str, Any]] = {}
    for member in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = member.relative_to(directory).as_posix()
        if rel == MANIFEST:
            continue
        size = member.stat().st_size
        if rel in sealed and sealed[rel]["size"] == size:
            files[rel] = sealed[rel]             # fsynced and hashed by the rank that wrote it
            continue
        fsync_path(member)
        files[rel] = digests.entry(size, file_digest(member))
    if not files:
        raise CheckpointError(f"step {step}: the writer wrote no files into {directory}")
    manifest = {"format": 1, "step": step, "files": files, "created_unix_s": time.time(), **(meta or {})}
    write_json_atomic(directory / MANIFEST, manifest)
    return manifest


class CheckpointManager:
    """Atomic commit, latest complete, retention (keeps at least two)."""

    def __init__(self, root: Union[str, Path], keep: int = 2) -> None:
        if keep < 2:
            raise CheckpointError(f"keep must be >= 2 (a corrupt newest needs an older one), got {keep}")
        self.root = Path(root)
        self.keep = keep

    # ---- paths -------------------------------------------------------------------
    def final_dir(self, step: int) -> Path:
        """Where step's checkpoint lies once sealed: `<root>/step_<N>`."""
        return self.root / f"step_{step}"

    def tmp_dir(self, step: int) -> Path:
        """Where step's checkpoint is written before its seal: `<root>/step_<N>.tmp`."""
        return self.root / f"step_{step}.tmp"

    # ---- writing -------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """A fresh, empty staging directory for step (a stale one from a dead attempt is removed)."""
        if step < 0:
            raise CheckpointError(f"step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_dir(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def commit(self, step: int, meta: Optional[Mapping[str, Any]] = None, *, prune: bool = True) -> Checkpoint:
        """Seal the staging directory: fsync files, manifest last, rename, fsync the parent; then
        retention, unless prune is False (the caller prunes off the critical path: deleting a
        checkpoint of hundreds of GB takes seconds)."""
        tmp = self.tmp_dir(step)
        if not tmp.is_dir():
            raise CheckpointError(f"nothing staged for step {step} ({tmp} missing)")
        final = self.final_dir(step)
        if final.exists():
            raise CheckpointError(f"{final} already exists; a checkpoint is never written into an existing directory")
        manifest = write_manifest(tmp, step, meta)
        os.replace(tmp, final)
        fsync_path(self.root)
        if prune:
            self.prune()
        return Checkpoint(step, final, manifest)

    def save(self, step: int, writer: Callable[[Path], None], meta: Optional[Mapping[str, Any]] = None) -> Checkpoint:
        """Single-process save: writer(directory) writes the files; the rest is atomic."""
        existing = self.final_dir(step)
        if existing.exists():
            ok, why, manifest = verify_dir(existing, step=step)
            if ok:
                return Checkpoint(step, existing, manifest)
            self.quarantine(existing, why)
        tmp = self.begin(step)
        writer(tmp)
        return self.commit(step, meta)

    # ---- reading -------------------------------------------------------------------
    def step_dirs(self) -> List[Tuple[int, Path]]:
        """(step, directory) of every `step_<N>` directory (sealed, or sealed and since damaged), newest first."""
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and not path.is_symlink() and path.is_dir():
                out.append((int(match.group(1)), path))
        return sorted(out, reverse=True)

    def latest(self, *, checksums: bool = True) -> Optional[Checkpoint]:
        """Newest checkpoint whose manifest verifies; older ones are the fallback."""
        for step, path in self.step_dirs():
            ok, why, manifest = verify_dir(path, checksums=checksums, step=step)
            if ok:
                return Checkpoint(step, path, manifest)
            log.warning("skipping checkpoint %s: %s", path, why)
        return None

    def complete(self, *, checksums: bool = False) -> List[Checkpoint]:
        """Every checkpoint whose manifest verifies, newest first (checksums: every file's digest too)."""
        out = []
        for step, path in self.step_dirs():
            ok, _, manifest = verify_dir(path, checksums=checksums, step=step)
            if ok:
                out.append(Checkpoint(step, path, manifest))
        return out

    # ---- retention -------------------------------------------------------------------
    def quarantine(self, path: Path, why: str) -> None:
        """Move a bad checkpoint aside (kept for inspection, never loaded)."""
        target = path.with_name(f"{path.name}.bad-{int(time.time())}")
        log.warning("quarantining %s (%s) as %s", path, why, target.name)
        os.replace(path, target)

    def prune(self) -> List[Path]:
        """Keep the newest `keep` complete checkpoints; drop older complete ones and staging dirs
        older than the newest complete one (leftovers of dead attempts)."""
        removed = []
        done = self.complete()
        for ckpt in done[self.keep:]:
            shutil.rmtree(ckpt.path, ignore_errors=True)
            removed.append(ckpt.path)
        newest = done[0].step if done else None
        for path in (self.root.iterdir() if self.root.is_dir() else []):
            match = re.match(r"^step_(\d+)\.tmp$", path.name)
            if match and newest is not None and int(match.group(1)) < newest:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed


def why_save_failed(exc: BaseException) -> str:
    """One line for a failed save: DCP's CheckpointException carries each failed rank's exception
    (e.g. rank 1: OSError: [Errno 28] No space left on device)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, wrapped = sorted(failures.items())[0]
        inner = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        detail = why_save_failed(inner) if isinstance(inner, BaseException) else " ".join(str(inner).split())
        return f"rank {rank}: {detail}"[:300]
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
