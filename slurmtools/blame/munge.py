"""MUNGE credentials: the identity a blame report carries. `munge` (run as the job's user) seals a
payload with that user's uid and gid; `unmunge` (run as root) gives them back only for a
credential munged itself made, within its TTL (300 s by default), and only once (a replay is
refused). Slurm authenticates every user the same way, so a site that runs Slurm runs munged.

Both run munge's own clients, never through a shell, with a timeout."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import List, Optional

DEFAULT_SOCKET = "/run/munge/munge.socket.2"
TIMEOUT_S = 10.0
MAX_CREDENTIAL_BYTES = 8192
_UID = re.compile(r"^UID:\s+(\S+)\s+\((\d+)\)\s*$", re.MULTILINE)
_STATUS = re.compile(r"^STATUS:\s+(.+?)\s*$", re.MULTILINE)


class MungeError(Exception):
    """munge or unmunge failed; the message is one line."""


@dataclass(frozen=True)
class Decoded:
    uid: int
    user: str
    payload: str


def _argv(program: str, socket: Optional[str]) -> List[str]:
    return [program, *(["--socket", socket] if socket else [])]


def encode(payload: str, socket: Optional[str] = None) -> str:
    """A credential holding payload and the caller's identity."""
    try:
        proc = subprocess.run(_argv("munge", socket), input=payload, capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeError(f"munge: {exc}") from None
    if proc.returncode != 0:
        raise MungeError(f"munge exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return proc.stdout.strip()


def decode(credential: str, socket: Optional[str] = None) -> Decoded:
    """The identity and payload of a credential munged made (refused: expired, replayed, forged)."""
    if len(credential) > MAX_CREDENTIAL_BYTES or not credential.startswith("MUNGE:"):
        raise MungeError("not a munge credential")
    try:
        proc = subprocess.run(_argv("unmunge", socket), input=credential, capture_output=True, text=True,
                              timeout=TIMEOUT_S, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeError(f"unmunge: {exc}") from None
    status = _STATUS.search(proc.stdout)
    if proc.returncode != 0 or status is None or not status.group(1).startswith("Success"):
        said = status.group(1) if status else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise MungeError(f"credential refused: {said}")
    head, sep, payload = proc.stdout.partition("\n\n")
    uid = _UID.search(head)
    if not sep or uid is None:
        raise MungeError("unmunge gave no uid")
    return Decoded(int(uid.group(2)), uid.group(1), payload)
