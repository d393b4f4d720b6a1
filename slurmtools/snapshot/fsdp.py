"""In-memory snapshots for a trainer with a sharded (FSDP2) model, its optimizer and its own
state (slurmtools.train.trainer_state): what a snapshot holds (each rank's local shards, via DCP's
get_state_dict, as checkpoint_torch saves them), how it is put back, and the trainer's session:
open it at start (every rank), restore from it before the persistent checkpoint, take one every
N steps. The mechanics are snapshot_torch's; the rules snapshot.py's (docs/snapshots.md).

The ledger says which restore was used and why (rank 0's `snapshot_restore` record).
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common import job_secret
from slurmtools.common.control_dir import (CONTROL_DIR_ENV, LOCAL_JOB_ID, SNAPSHOT_EVERY_ENV,
                                           SNAPSHOT_MAX_OVERHEAD_ENV, SNAPSHOT_MEMORY_GB_ENV)
from slurmtools.errors import CheckpointError
from slurmtools.snapshot import cgroup_memory
from slurmtools.snapshot.rules import job_key, refused_after, rolled_back, settings_from_env, timeline
from slurmtools.snapshot.store import STALE_AFTER_S, SnapshotStore
from slurmtools.snapshot.torch_state import Snapshotter, gather_inventory, lists_node, restore_from, side_group
from slurmtools.snapshot.wire import gather_json
from slurmtools.train.agreement import agree, all_ranks_max
from slurmtools.train.node_beat import NODE_LOCAL_DIR_ENV, local_rank, memory_root
from slurmtools.train.node_sweep import stale_after_s
from slurmtools.train.trainer_state import TrainerState


def capture(model: Any, optim: Any, trainer_state: Optional[TrainerState], extra: Mapping[str, Any]) -> Dict[str, Any]:
    """This rank's state now (DTensors as they are: Snapshotter.take copies their local shards)."""
    model_state, optim_state = get_state_dict(model, optim)
    return {"model": model_state, "optim": optim_state,
            "trainer": trainer_state.snapshot() if trainer_state is not None else None, "extra": dict(extra)}


def _fill(live: Any, saved: Any) -> Any:
    """saved's values in live's structure: each tensor (a DTensor's local shard) copied in place."""
    if isinstance(live, torch.Tensor):
        target = live.to_local() if hasattr(live, "to_local") else live
        if not isinstance(saved, torch.Tensor) or saved.shape != target.shape:
            raise ValueError(f"snapshot shape {getattr(saved, 'shape', type(saved).__name__)} != {tuple(target.shape)}")
        target.copy_(saved)
        return live
    if isinstance(live, dict):
        if set(live) != set(saved):
            raise ValueError(f"snapshot keys differ: {sorted(map(str, set(live) ^ set(saved)))[:3]}")
        return {key: _fill(value, saved[key]) for key, value in live.items()}
    if isinstance(live, (list, tuple)) and len(live) == len(saved):
        return type(live)(_fill(value, other) for value, other in zip(live, saved))
    return saved


def apply(model: Any, optim: Any, trainer_state: Optional[TrainerState], state: Mapping[str, Any]) -> None:
    """Put a snapshot back: the model's and optimizer's local shards, then the trainer's state."""
    model_state, optim_state = get_state_dict(model, optim)
    set_state_dict(model, optim, model_state_dict=_fill(model_state, state["model"]),
                   optim_state_dict=_fill(optim_state, state["optim"]))
    if trainer_state is not None and state.get("trainer") is not None:
        trainer_state.restore(state["trainer"])


def _job_key(control_dir: Path) -> Tuple[Optional[bytes], str]:
    """The job's key, or None and why not (one line)."""
    try:
        return job_secret.read(control_dir), ""
    except CheckpointError as exc:
        return None, str(exc)


def _unusable(root: Path, key: str, host: str, mac_key: Optional[bytes]) -> int:
    """1 when this node's memory is not the user's own (a rank without the key cannot tell: 0)."""
    return int(mac_key is not None and not SnapshotStore(root, key, host, mac_key).usable())


def _hosts_and_flags(parts: List[Any]) -> Tuple[List[str], int, int]:
    """Every rank's host, whether any rank lacks the job's key, whether any rank's node memory is
    not its own, from the session's round ([host, 0/1, 0/1] a rank)."""
    if not all(isinstance(part, list) and len(part) == 3 and isinstance(part[0], str)
               and part[1] in (0, 1) and part[2] in (0, 1) for part in parts):
        raise CheckpointError("a rank sent a snapshot session's opening that is none of ours")
    return [part[0] for part in parts], max(part[1] for part in parts), max(part[2] for part in parts)


class Session:
    """One trainer's snapshots in one step of the job (every rank opens it, in the same order)."""

    def __init__(self, snapshotter: Snapshotter, hosts: Mapping[int, str], control_dir: Optional[Path],
                 attempt_id: str) -> None:
        self.snapshotter, self.hosts, self.control_dir, self.attempt_id = snapshotter, dict(hosts), control_dir, attempt_id
        self._step_times_s: Deque[float] = deque(maxlen=20)     # this rank's recent steps, without snapshots
        self._last_step_t: Optional[float] = None
        self._prepared = False                  # host buffers asked for (once the optimizer has state)

    @classmethod
    def open(cls, every_steps: int, control_dir: Optional[Path], attempt_id: str,
             environ: Mapping[str, str] = os.environ) -> Optional["Session"]:
        """None when off (every_steps 0; -1: the spec's, SLURMTOOLS_SNAPSHOT_EVERY, else off) or when
        any rank's node memory is not its own (said once)."""
        spec_every, memory_gb, max_overhead_pct = settings_from_env(
            environ, SNAPSHOT_EVERY_ENV, SNAPSHOT_MEMORY_GB_ENV, SNAPSHOT_MAX_OVERHEAD_ENV)
        if every_steps < 0:
            every_steps = spec_every
        if every_steps <= 0:
            return None
        rank = dist.get_rank()
        if control_dir is None:         # the same on every rank: their environments agree
            if rank == 0:
                print(f"slurmtools: snapshots off: no control dir (the job's key, which authenticates replicas, is "
                      f"kept there): run under `slurmtools run` or set {CONTROL_DIR_ENV}", file=sys.stderr, flush=True)
            return None
        if rank == 0:
            try:
                job_secret.ensure(control_dir)      # a job's first start: made once, kept by every restart
            except OSError as exc:
                print(f"slurmtools: cannot make the job key in {control_dir}: {exc.strerror}", file=sys.stderr,
                      flush=True)
        host = socket.gethostname()
        root = memory_root(environ)
        key = job_key(environ.get("SLURM_JOB_ID") or LOCAL_JOB_ID, control_dir)
        # read before the round below: a restart's key exists (a requeue and a recovery in place
        # keep it), and one round then says every rank's host, key and node memory; only a rank
        # that read before rank 0 made the key (a job's first start) reads it again, agreed in a
        # second round
        mac_key, why_no_key = _job_key(control_dir)
        names, missing, unusable = _hosts_and_flags(gather_json([host, int(mac_key is None),
                                                                 _unusable(root, key, host, mac_key)]))
        if missing:
            if mac_key is None:
                mac_key, why_no_key = _job_key(control_dir)
            missing, unusable = all_ranks_max([int(mac_key is None), _unusable(root, key, host, mac_key)])
        if mac_key is None:
            print(f"slurmtools: rank {rank}: snapshots off: {why_no_key}", file=sys.stderr, flush=True)
        if missing or mac_key is None:
            return None
        store = SnapshotStore(root, key, host, mac_key)
        if unusable:
            if rank == 0:
                print(f"slurmtools: snapshots off: {NODE_LOCAL_DIR_ENV} {root} is not a directory of this user's own "
                      f"on every node", file=sys.stderr, flush=True)
            return None
        if local_rank(environ) == 0:
            store.sweep_stale(time.time(), stale_after_s(environ, STALE_AFTER_S))
        hosts = dict(enumerate(names))
        share = cgroup_memory.rank_share_bytes(cgroup_memory.job_headroom_bytes(), names.count(host))
        limit_bytes, bound = cgroup_memory.snapshot_limit_bytes(memory_gb, share)
        if bound and local_rank(environ) == 0:
            print(f"slurmtools: {host}: {bound}", file=sys.stderr, flush=True)
        snapshotter = Snapshotter(store, rank, hosts, every_steps, side_group(), limit_bytes=limit_bytes,
                                  max_overhead_pct=max_overhead_pct, attempt_id=attempt_id)
        return cls(snapshotter, hosts, control_dir, attempt_id)

    def restore_into(self, model: Any, optim: Any, trainer_state: Optional[TrainerState],
                     manager: Optional[CheckpointManager]) -> Optional[Dict[str, Any]]:
        """The snapshot's extras (its step among them) once it is put back, or None: resume from the
        persistent checkpoint (manager's newest complete one, when newer). Rank 0 records which and
        why in the ledger."""
        from slurmtools.common import ledger
        from slurmtools.common.ledger import Cause
        started = time.monotonic()
        # rank 0 alone reads the ledger and the checkpoints' manifests (thousands of ranks reading
        # them at once would load the shared file system's metadata server for nothing)
        # [why no snapshot, the newest checkpoint's step, the timeline's attempts (None: no record)]
        decided: List[Optional[Any]] = [None, None, None]
        if dist.get_rank() == 0:
            complete = manager.complete() if manager is not None else []
            decided[1] = complete[0].step if complete else None
            if self.control_dir is not None:
                events = ledger.read(self.control_dir)
                ends = [event for event in events if isinstance(event, ledger.AttemptEnd)]
                decided[0] = refused_after(bool(ends) and ends[-1].cause == Cause.SDC.value) or rolled_back(
                    decided[1], ledger.newest_checkpoint_step(events))
                decided[2] = sorted(timeline([(event.attempt_id, event.step) for event in events
                                              if isinstance(event, ledger.SnapshotRestore)]))
        # rank 0's word rides in the inventory's round (each round costs every rank of a recovery)
        copies, decided = gather_inventory(self.snapshotter.store, self.snapshotter.group,
                                           decided if dist.get_rank() == 0 else None,
                                           lists=lists_node(dist.get_rank(), self.hosts))
        step: Optional[int] = None
        state: Any = None
        why = decided[0] or ""
        if not why:
            step, state, why = restore_from(copies, self.snapshotter.store, dist.get_rank(), self.hosts, decided[1],
                                            self.snapshotter.group,
                                            frozenset(decided[2]) if decided[2] is not None else None)
        if state is not None:
            apply(model, optim, trainer_state, state)
        if dist.get_rank() == 0 and self.control_dir is not None:
            ledger.append(self.control_dir, ledger.SnapshotRestore(self.attempt_id, time.time(), step, why,
                                                                   round(time.monotonic() - started, 3)))
        return dict(state["extra"], step=step, why=why) if state is not None else None

    def after_step(self, step: int, model: Any, optim: Any, trainer_state: Optional[TrainerState],
                   extra: Mapping[str, Any]) -> None:
        """A snapshot when one is due (every rank at the same step); failed ones, and a new interval,
        said by rank 0. Step times are measured between calls, a snapshot's own stall left out."""
        now = time.monotonic()
        if self._last_step_t is not None:
            self._step_times_s.append(now - self._last_step_t)
        if self.snapshotter.due(step):
            every, stall_before = self.snapshotter.every_steps, self.snapshotter.stall_s
            step_s = statistics.median(self._step_times_s) if self._step_times_s else None
            self.snapshotter.take(step, capture(model, optim, trainer_state, dict(extra, step=step)), step_s=step_s,
                                  optimizer=optim)
            self._prepared = True
            if self.snapshotter.every_steps != every and dist.get_rank() == 0:
                print(f"slurmtools: snapshots every {self.snapshotter.every_steps} steps from now (rank 0's "
                      f"snapshot stalled training {self.snapshotter.stall_s - stall_before:.3f} s, a step takes "
                      f"{step_s or 0:.3f} s, at most {self.snapshotter.max_overhead_pct:g}% of training time)",
                      file=sys.stderr, flush=True)
        elif not self._prepared and getattr(optim, "state", None):
            self.snapshotter.prepare(capture(model, optim, trainer_state, dict(extra, step=step)))
            self._prepared = True
        self._last_step_t = time.monotonic()
        self._say_failures()

    def before_requested_save(self, step: int, model: Any, optim: Any, trainer_state: Optional[TrainerState],
                              extra: Mapping[str, Any]) -> bool:
        """A requested stop (Slurm's SIGTERM, a warning, a swap) keeps this step in node memory
        first, sealed and replicated, before the persistent save begins: a save of hundreds of GB
        that KillWait cuts short then loses nothing on the same nodes (the next run restores this
        snapshot, newer than the checkpoint; a save that finishes is as new and wins). Collective:
        every rank calls it after after_step. Whether this step's snapshot is kept."""
        if self.snapshotter.taken_step != step:
            self.snapshotter.take(step, capture(model, optim, trainer_state, dict(extra, step=step)), optimizer=optim)
        self.snapshotter.wait()         # after_step said and cleared the failures before this step's
        failed = {failed_step for failed_step, _ in self.snapshotter.failures}
        kept = self.snapshotter.taken_step == step and step not in failed
        self._say_failures()
        return not agree(not kept)

    def _say_failures(self) -> None:
        for failed, why in self.snapshotter.failures:
            if dist.get_rank() == 0:
                print(f"slurmtools: snapshot of step {failed} not kept: {why}", file=sys.stderr, flush=True)
        self.snapshotter.failures.clear()

    def finish(self) -> None:
        """Training completed (its final checkpoint sealed): every rank removes its own snapshots and
        the replicas it keeps, once no peer sends any more (collective: every rank calls it)."""
        self.snapshotter.close(wait=True)
        dist.barrier(group=self.snapshotter.group)
        self.snapshotter.store.remove(self.snapshotter.rank, self.snapshotter.sources)

    def exit(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        """For an ExitStack: the snapshot in flight finished, unless training failed (its peer may
        be gone: nothing waits for it then)."""
        self.snapshotter.close(wait=exc_type is None)
        return False
