"""Which checkpoint a resume loads, agreed by every rank: the newest one every rank verified its
share of (files i with i % world == rank, so no file is hashed twice).

Only a digest mismatch condemns a checkpoint (quarantined by rank 0, the next one tried). A read
that fails with a transient error (EIO, ESTALE, a timeout: a storage target failing over) says
nothing of the checkpoint: every rank reads its share again, with backoff, and when the storage
stays unreadable the resume fails as a platform failure (StorageUnavailable: the supervisor
restarts the job) with the checkpoint left in place. And a job whose ledger shows a checkpoint
never starts again from step 0 without a word (EXPECTED_CHECKPOINT_ENV, set by the supervisor).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch.distributed as dist

from slurmtools.checkpoint.manager import CheckpointManager, is_transient_read, verify_files
from slurmtools.common.control_dir import EXPECTED_CHECKPOINT_ENV
from slurmtools.errors import CheckpointError
from slurmtools.train.agreement import barrier

# a storage target's failover takes seconds to a minute: about 30 s of retries, then a platform failure
READ_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0)


class StorageUnavailable(CheckpointError):
    """A checkpoint could not be read for a transient storage error, even after the retries: the
    storage failed, not the checkpoint (left in place; the supervisor restarts the job)."""


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def broadcast(obj: Any) -> Any:
    """Rank 0's obj on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_problems(problem: Optional[str]) -> List[Optional[str]]:
    """Collective: every rank's problem (or None), in rank order."""
    problems = [problem]
    if dist.is_initialized():
        problems = [None] * world()
        dist.all_gather_object(problems, problem)
    return problems


def first_problem(problem: Optional[str]) -> Optional[str]:
    """Collective: the first rank's problem, the same on every rank (None when none has one)."""
    return next((p for p in all_problems(problem) if p), None)


def _verify_share(path: str, files: Mapping[str, Any], sleep: Callable[[float], None]) -> Optional[str]:
    """Collective: the first problem any rank found in its share, after transient read errors are
    retried with backoff; raises StorageUnavailable when they outlast the retries."""
    names = sorted(files)[rank()::world()]
    for delay in (*READ_RETRY_DELAYS_S, None):
        problems = all_problems(verify_files(Path(path), files, names))
        transient = next((p for p in problems if p and is_transient_read(p)), None)
        if transient is None:
            return next((p for p in problems if p), None)
        if delay is None:
            raise StorageUnavailable(f"checkpoint {path}: {transient}, still after {len(READ_RETRY_DELAYS_S)} "
                                     f"retries over {sum(READ_RETRY_DELAYS_S):g} s: the storage failed, not the "
                                     f"checkpoint (left in place)")
        sleep(delay)
    return None


def verified_latest(manager: CheckpointManager, refused: Optional[List[Tuple[str, str]]] = None,
                    sleep: Callable[[float], None] = time.sleep) -> Optional[str]:
    """Collective: the newest checkpoint every rank verified its share of. One whose digest does
    not match is quarantined by rank 0 (left in place when even that fails) and the next tried;
    one some rank cannot read for good (a permission, a missing file) is passed over, not moved.
    refused, when given, gets (path, why) of each one passed over."""
    passed_over: Dict[str, str] = {}
    while True:
        newest = (next((c for c in manager.complete() if str(c.path) not in passed_over), None)
                  if rank() == 0 else None)
        chosen = broadcast((str(newest.path), newest.manifest["files"]) if newest else None)
        if chosen is None:
            return None
        path, files = chosen
        bad = _verify_share(path, files, sleep)
        if bad is None:
            return str(path)
        passed_over[str(path)] = bad
        if refused is not None:
            refused.append((str(path), bad))
        if rank() == 0 and bad.startswith("checksum mismatch"):
            try:
                manager.quarantine(Path(path), bad)
            except OSError:
                pass              # cannot be moved aside (a read-only directory): skipped all the same
        barrier()


def refuse_fresh_start(refused: List[Tuple[str, str]], environ: Mapping[str, str]) -> None:
    """No checkpoint verified although the job's ledger shows one (the supervisor says which
    step): raise rather than train again from step 0 without a word."""
    expected = environ.get(EXPECTED_CHECKPOINT_ENV, "")
    if not (expected.isascii() and expected.isdigit()):
        return
    why = "; ".join(f"{Path(path).name}: {reason}" for path, reason in refused) or "none is left"
    raise CheckpointError(f"no checkpoint verifies although this job checkpointed step {expected} before "
                          f"({why}): not starting again from step 0")
