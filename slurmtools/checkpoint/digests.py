"""File digests for checkpoint manifests.

New checkpoints record xxh3-128 (the `xxhash` library): a corruption check, not a signature (who may
write a checkpoint is the file system's business), and about ten times faster than sha256, so
hashing a shard while it is written stays a small part of the write (bench/checkpoint.py's
`ratio sync-commit/raw-write`). Manifests written with sha256 (before 2026-12-02) still verify: an
entry names its algorithm by its key, {"size": N, "xxh3_128": HEX} or {"size": N, "sha256": HEX}.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import xxhash

ALGORITHM = "xxh3_128"
_DIGEST_PATTERNS = {"xxh3_128": re.compile(r"^[0-9a-f]{32}$"), "sha256": re.compile(r"^[0-9a-f]{64}$")}
ALGORITHMS = tuple(_DIGEST_PATTERNS)


def new(algorithm: str = ALGORITHM) -> Any:
    """A running hash (update/hexdigest) of one of ALGORITHMS; both release the GIL on large buffers."""
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def of_buffer(data: Any, algorithm: str = ALGORITHM) -> str:
    """The hex digest of bytes in memory (bytes, a memoryview of a received buffer)."""
    running = new(algorithm)
    running.update(data)
    return str(running.hexdigest())


def entry(size: int, digest: str, algorithm: str = ALGORITHM) -> Dict[str, Any]:
    """A manifest entry for one file."""
    return {"size": size, algorithm: digest}


def entry_digest(info: Any) -> Optional[Tuple[str, str]]:
    """(algorithm, hex digest) of a manifest entry, or None when it has no well-formed one."""
    if not isinstance(info, Mapping):
        return None
    for algorithm, pattern in _DIGEST_PATTERNS.items():
        value = info.get(algorithm)
        if isinstance(value, str) and pattern.match(value):
            return algorithm, value
    return None
