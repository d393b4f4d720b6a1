"""torch.distributed.checkpoint (DCP) on top of CheckpointManager: sharded save/load, resharding
on load (DCP handles a different world size), and an async save on its own process group.

Rank 0 owns the directory: it stages `step_N.tmp`, every rank writes its shards there with
overwrite disabled, each hashed while it is written (slurmtools.checkpoint.hashing_fs) and fsynced by DCP,
and rank 0 commits (manifest last, rename) once all shards are written and sealed: rank 0 never
reads the whole checkpoint. On resume rank 0 picks the newest checkpoint complete by names and
sizes, and every rank verifies its share of the files (each file read once) before any loads it;
a mismatch anywhere quarantines that checkpoint and the next older one is tried.

The trainer's own state (RNG streams, data-loader position, LR scheduler, grad scaler, extras:
slurmtools.train.trainer_state) travels in every save, sync and async: each rank writes its small
trainer-state file beside its shards and seals it with them.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from slurmtools.checkpoint.hashing_fs import HashingFileSystem
from slurmtools.checkpoint.manager import (Checkpoint, CheckpointManager, mark_seal_failed, seal_failures,
                                           seal_own_files, verify_dir, why_save_failed, writers_sealed)
from slurmtools.checkpoint.resume import broadcast, first_problem, rank, refuse_fresh_start, verified_latest, world
from slurmtools.errors import CheckpointError
from slurmtools.train import trainer_state as trainer_state_files
from slurmtools.train.agreement import agree, barrier
from slurmtools.train.trainer_state import TrainerState

# how long rank 0 waits for every rank to seal its shards before it gives the save up (an async save)
SEAL_WAIT_S = 600.0
# how long a trainer that raised waits for its save in flight before it exits (the restart waits
# that long at most): a save begun a step before the crash is the newest checkpoint, not lost
CRASH_SAVE_WAIT_S = 60.0
# retention runs here, off the training path (deleting an old checkpoint of hundreds of GB takes
# seconds); one thread, so prunes never overlap; joined at interpreter exit like any executor
_PRUNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-prune")


def _commit(manager: CheckpointManager, step: int, meta: Dict[str, Any]) -> Checkpoint:
    """Rank 0's commit; the older checkpoints are pruned in the background."""
    ckpt = manager.commit(step, meta, prune=False)
    _PRUNER.submit(manager.prune)
    return ckpt


def _complete_or_quarantine(manager: CheckpointManager, step: int) -> bool:
    """True when step is already saved and verifies; a corrupt one is moved aside so it is rewritten."""
    final = manager.final_dir(step)
    if not final.exists():
        return False
    ok, why, _ = verify_dir(final, step=step)
    if not ok:
        manager.quarantine(final, why)
    return ok


def own_shards(staging: Path, rank: int) -> List[str]:
    """The files rank wrote: DCP's `__<rank>_<n>.distcp` (FileSystemWriter's storage prefix) and
    its trainer-state file."""
    pattern = re.compile(rf"^__{rank}_\d+\.distcp$")
    state_name = trainer_state_files.state_file_name(rank)
    return sorted(path.name for path in staging.iterdir() if pattern.match(path.name) or path.name == state_name)


def seal_own(staging: str, rank: int, snapshot: Optional[Dict[str, Any]] = None,
             writer: Optional[FileSystemWriter] = None) -> None:
    """This rank's part of the commit: write its trainer state (when given), then record the
    digest of every file it wrote (the shards' were computed while writer wrote them; the rest
    are fsynced and hashed now)."""
    if snapshot is not None:
        trainer_state_files.write(Path(staging), rank, snapshot)
    digests = writer.fs.digests() if writer is not None and isinstance(writer.fs, HashingFileSystem) else None
    seal_own_files(Path(staging), f"rank_{rank}", own_shards(Path(staging), rank), digests)


def hashing_writer(staging: str) -> FileSystemWriter:
    """DCP's writer for a staging directory: no overwriting, every file hashed as it is written."""
    writer = FileSystemWriter(staging, overwrite=False)
    writer.fs = HashingFileSystem()
    return writer


def _stage(manager: CheckpointManager, step: int) -> Optional[str]:
    """Collective: the staging directory every rank writes step's shards into, or None when step
    is already saved and verifies (rank 0 decides and tells the others)."""
    if broadcast(_complete_or_quarantine(manager, step) if rank() == 0 else None):
        return None
    tmp = broadcast(str(manager.begin(step)) if rank() == 0 else None)
    return str(tmp)


def save(manager: CheckpointManager, step: int, model: Any, optim: Any, extra: Optional[Dict[str, Any]] = None,
         meta: Optional[Dict[str, Any]] = None, before_commit: Optional[Callable[[], None]] = None,
         trainer_state: Optional[TrainerState] = None) -> Optional[Checkpoint]:
    """Blocking sharded save of model + optimizer (+ small extras, + the trainer's own state) as
    step; collective.

    before_commit runs on every rank after the shards are written and before rank 0 commits
    (a place for fault injection in tests, or for flushing logs)."""
    tmp = _stage(manager, step)
    if tmp is None:
        return None
    snapshot = trainer_state.snapshot() if trainer_state is not None else None
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "extra": dict(extra or {}, step=step)}
    problem = None
    try:
        writer = hashing_writer(tmp)
        dcp_save(state, storage_writer=writer)
        seal_own(tmp, rank(), snapshot, writer)
    except (OSError, CheckpointException, RuntimeError) as exc:    # a full or failing file system
        problem = why_save_failed(exc) if isinstance(exc, CheckpointException) else \
            f"rank {rank()}: {why_save_failed(exc)}"   # DCP's own error names the ranks already
    failed = first_problem(problem)
    if failed is not None:
        if rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)      # the previous complete checkpoint stays the newest
        raise CheckpointError(f"checkpoint of step {step} not saved: {failed}")
    if before_commit is not None:
        before_commit()
    barrier()
    ckpt = None
    if rank() == 0:
        ckpt = _commit(manager, step, dict(meta or {}, world_size=world()))
    barrier()
    return ckpt


def _saved_extras(reader: FileSystemReader) -> Dict[str, Any]:
    """Placeholders for every extra the checkpoint holds (DCP loads only the keys it is asked for)."""
    keys = reader.read_metadata().state_dict_metadata
    return {key.split(".", 1)[1]: None for key in keys if key.startswith("extra.") and key.count(".") == 1}


def _restore_trainer_state(chosen: str, trainer_state: TrainerState, skip: Tuple[str, ...]) -> List[str]:
    """This rank's trainer state from the checkpoint; returns what could not be restored. Saved at
    another world size: the shared parts come from rank 0's file, the RNG streams are not taken."""
    directory = Path(chosen)
    saved_ranks = {path.name for path in directory.glob(f"{trainer_state_files.STATE_FILE_PREFIX}*")}
    same_world = saved_ranks == {trainer_state_files.state_file_name(r) for r in range(world())}
    snapshot = trainer_state_files.read(directory, rank() if same_world else 0)
    if snapshot is None:
        return sorted(trainer_state.parts) + (["rng"] if trainer_state.rng else [])
    return trainer_state.restore(snapshot, rng=same_world, skip=skip)


def load_latest(manager: CheckpointManager, model: Any, optim: Any, trainer_state: Optional[TrainerState] = None,
                skip: Tuple[str, ...] = ()) -> Optional[Dict[str, Any]]:
    """Load the newest complete checkpoint into model/optim (any saved world size) and, when
    given, the trainer's own state; returns its extras, its path, `not_restored` (the trainer
    state's names the checkpoint could not give back: report them, re-seed a missing "rng"),
    `refused` ((path, why) of newer checkpoints passed over: report them) and `saved_world_size`.

    Every rank verifies its share of the checkpoint's files first, so all ranks load the same
    verified one and no file is hashed twice. skip: trainer-state names left as they are (tests)."""
    refused: List[Tuple[str, str]] = []
    chosen = verified_latest(manager, refused)
    if chosen is None:
        refuse_fresh_start(refused, os.environ)
        return None
    reader = FileSystemReader(chosen)
    msd, osd = get_state_dict(model, optim)
    state: Dict[str, Any] = {"model": msd, "optim": osd, "extra": dict(_saved_extras(reader), step=-1)}
    dcp_load(state, storage_reader=reader)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    not_restored = _restore_trainer_state(chosen, trainer_state, skip) if trainer_state is not None else []
    manifest = verify_dir(Path(chosen), checksums=False)[2]
    return dict(state["extra"], path=chosen, not_restored=not_restored, refused=refused,
                saved_world_size=manifest.get("world_size"))


def _seal_when_written(upload: "Future[Any]", staging: str, rank: int, world: int,
                       snapshot: Optional[Dict[str, Any]], writer: FileSystemWriter) -> None:
    """In the checkpointer's thread: once this rank's shards are written, write its trainer state
    and seal them all; rank 0 then waits (up to SEAL_WAIT_S) for every rank's seal, so its
    commit reads no shard."""
    upload.result()                  # raises on every rank when DCP's write failed on any
    try:
        seal_own(staging, rank, snapshot, writer)
    except OSError as exc:
        mark_seal_failed(Path(staging), f"rank_{rank}", why_save_failed(exc))
        raise
    if rank == 0:
        deadline = time.monotonic() + SEAL_WAIT_S
        while writers_sealed(Path(staging)) < world and time.monotonic() < deadline:
            failures = seal_failures(Path(staging))
            if failures:
                raise CheckpointError(f"a rank could not seal its shards: {failures[0]}")
            time.sleep(0.05)
        if writers_sealed(Path(staging)) < world:
            raise CheckpointError(f"only {writers_sealed(Path(staging))} of {world} ranks sealed their shards "
                                  f"within {SEAL_WAIT_S:.0f} s")


class AsyncCheckpointer:
    """Async sharded save: training continues while a thread writes the shards.

    The save runs on its own gloo process group (on the training group it can hang or abort
    with a collective mismatch in our measurements). The state is first copied into staging
    buffers that one DCP stager keeps across saves (pinned memory on CUDA); that copy too runs
    in the background, overlapping the next forward/backward, so the trainer calls
    `wait_staged()` before its next optimizer step (the weights must not change while they are
    copied). Once a rank's upload future resolves (DCP resolves it only after every rank's
    shards and the metadata are written) the checkpointer's own thread seals that rank's shards;
    rank 0 commits (manifest, rename) once every rank sealed. One save is in flight at a time;
    `wait()` finishes it.
    """

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.stager: Any = None     # made at the first save, for the state's device
        self._pending: Optional[Tuple[int, Any, Dict[str, Any], str]] = None
        self.failures: List[Tuple[int, str]] = []      # (step, why) of saves that failed: take_failures()
        self._staging: Any = None
        self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-seal")
        self._released = False

    def save(self, step: int, model: Any, optim: Any, meta: Optional[Dict[str, Any]] = None,
             extra: Optional[Dict[str, Any]] = None, trainer_state: Optional[TrainerState] = None) -> None:
        """Begin saving step; the trainer state is copied now, as it is at this step boundary."""
        self.wait()
        tmp = _stage(self.manager, step)
        if tmp is None:
            return
        snapshot = trainer_state.snapshot() if trainer_state is not None else None
        msd, osd = get_state_dict(model, optim)
        if self.stager is None or _closed_by_staging(self.stager):
            # torch 2.11's DefaultStager closes its copier at the end of each staging (its buffers
            # are not kept either): the next save needs a stager of its own (the H200's
            # `KeyError: <class 'type'>` at the second save, issue 47)
            self.stager = _new_stager(any(getattr(value, "is_cuda", False) for value in msd.values()))
        state = {"model": msd, "optim": osd, "extra": dict(extra or {}, step=step)}
        writer = hashing_writer(tmp)
        response = dcp_async_save(state, storage_writer=writer, process_group=self.group, async_stager=self.stager)
        upload = cast("Future[Any]", getattr(response, "upload_completion", response))
        self._staging = getattr(response, "staging_completion", None)
        sealed = self._sealer.submit(_seal_when_written, upload, tmp, rank(), world(), snapshot, writer)
        self._pending = (step, sealed, dict(meta or {}, world_size=world()), tmp)

    def wait_staged(self) -> None:
        """Return once the state of the save in flight is copied: the weights may change now. A
        copy that failed fails its save (wait() records it), never the trainer; the stager is
        replaced for the next save."""
        if self._staging is not None:
            staging, self._staging = self._staging, None
            try:
                staging.result()
            except (Exception, CheckpointException):    # noqa: BLE001 - the save failed, not training
                self.stager = None

    def poll(self) -> Optional[Checkpoint]:
        """Commit the save in flight once it is written, without waiting for it: called at every
        step boundary, an async checkpoint is the newest complete one within a step of its shards
        being on disk (not only when the next save begins)."""
        if self._pending is None or not self._pending[1].done():
            return None
        return self.wait()

    def wait(self) -> Optional[Checkpoint]:
        self.wait_staged()
        if self._pending is None:
            return None
        step, future, meta, staging = self._pending
        self._pending = None
        try:
            future.result()
        # any error of the save's pipeline fails the save, not training (DCP's CheckpointException
        # is a BaseException)
        except (Exception, CheckpointException) as exc:   # noqa: BLE001
            # a failed background save: training goes on, the previous checkpoint stays the newest
            self.failures.append((step, why_save_failed(exc) if not isinstance(exc, CheckpointError) else str(exc)))
            if rank() == 0:
                shutil.rmtree(staging, ignore_errors=True)
            return None
        if rank() == 0:
            return _commit(self.manager, step, meta)
        return None

    def take_failures(self) -> List[Tuple[int, str]]:
        """The saves that failed since the last call (rank 0's view decides: report it there)."""
        failures, self.failures = self.failures, []
        return failures

    def finish_on_crash(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> bool:
        """An exit callback (ExitStack.push): when the trainer raised an Exception, finish the save in
        flight if it is written within CRASH_SAVE_WAIT_S (as Lightning's async checkpointing does at
        teardown); one that cannot (a peer gone) is left. Otherwise the checkpointer is released then
        (_release). The crash's exception goes on either way."""
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        if self._pending is None:
            self._release()
            return False
        step, future = self._pending[0], self._pending[1]
        if not futures_wait([future], timeout=CRASH_SAVE_WAIT_S).done:
            return False
        try:                         # wait() commits it, or records it as failed
            if self.wait() is not None:
                print(f"slurmtools: the checkpoint of step {step}, in flight when the trainer raised, was finished "
                      "before it exits", file=sys.stderr, flush=True)
        except Exception as err:     # never hide the crash behind the save's own error
            print(f"slurmtools: the checkpoint of step {step} in flight at the crash was not finished: {err}",
                  file=sys.stderr, flush=True)
        self._release()
        return False

    def close(self) -> None:
        """Finish the save in flight and free the staging buffers and threads."""
        self.wait()
        self._release()

    def _release(self) -> None:
        """Free the staging buffers and the sealing thread, and let go of the save's process group
        (destroy_process_group() then frees it, not a garbage collection at interpreter exit:
        the exception that ended training keeps this object alive in a reference cycle)."""
        if self._released:
            return
        self._released, self._staging, self.group = True, None, None
        if self.stager is not None:
            self.stager.close()
        self._sealer.shutdown(wait=True)


def _new_stager(cuda: bool) -> Any:
    """DCP's stager of a save's state: pinned host buffers and a non-blocking copy when the state
    is on a GPU; plain memory for a state in host memory (CPU ranks on a machine with a GPU pin
    nothing, nor start a CUDA context each)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True,
                                        use_non_blocking_copy=cuda))


def _closed_by_staging(stager: Any) -> bool:
    """Whether the stager's copier was closed (its type dispatch table emptied): torch 2.11 does
    that at the end of every staging; 2.13 keeps it, with its buffers, across saves."""
    copier = getattr(stager, "_state_dict_stager", None)
    dispatch = getattr(copier, "_deepcopy_dispatch", None)
    return isinstance(dispatch, dict) and not dispatch


def report_failed_saves(saver: AsyncCheckpointer, on_save_error: str, rank: int,
                        log: Callable[[Dict[str, Any]], None], attempt_id: str) -> None:
    """Rank 0 logs each failed background save (its view decides: it commits); with on_save_error
    "stop" every rank stops at the same step (agreed) after the first one."""
    failures = saver.take_failures()
    failed = failures if rank == 0 else []
    for step, why in failed:
        log({"event": "checkpoint_failed", "step": step, "error": why, "attempt_id": attempt_id})
    if on_save_error == "stop" and agree(bool(failed)):
        raise CheckpointError("a periodic checkpoint was not saved (on_save_error: stop); see the "
                              "checkpoint_failed event")
