"""The job's secret key, and the MAC its in-memory snapshots carry on the wire.

Gloo and torch's store authenticate nobody: a process of another user that reaches a node's ports
can join a job's transport (docs/admin-guide.md, "Security model"). So a replica a rank keeps for its peer, and a
copy pulled from a peer at a restore, is accepted only with a MAC under the job's key: HMAC-SHA256
over what the copy is (whose state, which step, world and attempt), its size and its digest, which
the receiver computes itself over the bytes it got. The key is a file of the job's control dir, the
user's own (mode 0600; the control dir is where the job's processes already meet), read by every
rank and never sent. The bytes are bound to the digest by xxh3-128 (slurmtools.checkpoint.digests): a checksum,
not a cryptographic hash, so this stops a process outside the job that cannot read the genuine
copy; one that reads it on the wire would still need a second xxh3 preimage to swap its bytes."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Tuple

from slurmtools.errors import CheckpointError

KEY_FILE = "job.key"
KEY_BYTES = 32


def ensure(control_dir: Path) -> None:
    """The job's key, made once (the first run of the job; a requeue keeps it, so replicas kept on
    the nodes stay usable): written under a temporary name, then linked into place, so a rank never
    reads a half-written key and two makers never both win."""
    target = control_dir / KEY_FILE
    if os.path.lexists(target):
        return
    temporary = control_dir / f".{KEY_FILE}.{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            pass                                   # another maker won: its key is the job's
    finally:
        temporary.unlink(missing_ok=True)


def read(control_dir: Path) -> bytes:
    """The job's key; CheckpointError (one line) unless it is a regular file of this user's that
    nobody else can read or write, of KEY_BYTES bytes."""
    path = control_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise CheckpointError(f"job key {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"job key {path}: not a regular file")
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise CheckpointError(f"job key {path}: not this user's alone (owner uid {info.st_uid}, "
                                  f"mode {stat.S_IMODE(info.st_mode):04o})")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise CheckpointError(f"job key {path}: {len(key)} bytes, not {KEY_BYTES}")
    return key


def copy_mac(key: bytes, of_rank: int, step: int, world: int, attempt: str, size: int,
             digest: Tuple[str, str]) -> str:
    """The MAC of one copy of a rank's snapshot (hex, 64 characters)."""
    fields = {"rank": of_rank, "step": step, "world": world, "attempt": attempt, "size": size,
              "digest": f"{digest[0]}:{digest[1]}"}
    message = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def mac_matches(key: bytes, mac: str, of_rank: int, step: int, world: int, attempt: str, size: int,
                digest: Tuple[str, str]) -> bool:
    """Whether mac is the job's MAC of that copy (compared in constant time)."""
    return hmac.compare_digest(mac.encode(errors="replace"),
                               copy_mac(key, of_rank, step, world, attempt, size, digest).encode())
