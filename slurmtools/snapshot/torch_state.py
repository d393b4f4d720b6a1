"""In-memory snapshots of a torch trainer's state, replicated to a peer node (snapshot.py says
where, who keeps whose, and which to restore). The training thread copies the rank's state to
host memory at a step boundary (the only stall); a background thread serializes it into the
node's store (snapshot_io.SnapshotStore) and sends it to its peer over a gloo group of its own,
receiving the replicas this rank keeps. A restart restores every rank from the newest step all
ranks have a verified copy of on the living nodes, a lost node's ranks pulled from their replicas,
or says why the persistent checkpoint is used instead.

The state is torch.save'd and loaded with weights_only (tensors and plain containers, nothing a
pickle could run): the trainer passes its shard's tensors (DTensors as their local shards) and
plain numbers. Transfers go over a gloo group made for them (`side_group`), so they never mix with
the training's collectives (an NCCL group in production) and run from a background thread.
"""
from __future__ import annotations

import datetime
import io
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, Dict, FrozenSet, List, Mapping, Optional, Tuple, cast

import torch
import torch.distributed as dist

from slurmtools.checkpoint import digests
from slurmtools.errors import CheckpointError
from slurmtools.snapshot.host_copy import HostCopier, tensors
from slurmtools.snapshot.rules import (Copy, interval_for, over_limit, pack_copies, peer_of, plan_restore,
                                       replicas_kept_by, unpack_copies)
from slurmtools.snapshot.store import SnapshotStore, open_regular
from slurmtools.snapshot.wire import (ViewReader, agree_max, exchange, exchange_macs, exchange_sizes, first_rank_over,
                                      gather_json, pull, serve)

STATE_FILE = "state.pt"


# a transfer's wait on its peer at most: a rank that failed to serialize (or died) leaves its peer
# waiting this long, not the collective timeout (30 minutes by default); a chunk of a pull takes
# well under a second
EXCHANGE_TIMEOUT_S = 120.0


def side_group(timeout_s: float = EXCHANGE_TIMEOUT_S) -> Any:
    """A gloo group of every rank, for snapshots only (collective: every rank calls it, in order);
    its own timeout bounds every wait on a peer (EXCHANGE_TIMEOUT_S)."""
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def tensor_bytes(state: Any) -> int:
    """The bytes of state's tensors as a host copy holds them (a DTensor: its local shard): what
    serializing the copy writes, but for a little framing."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors(state))


def serialize(state: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def deserialize(data: Any) -> Any:
    """The state in data: bytes, a received buffer (read in place), or a file in node memory, by
    path or open (mapped: its tensors use the file's pages, no copy; the file may be removed or
    closed once loaded)."""
    if isinstance(data, Path):
        return torch.load(str(data), mmap=True, weights_only=True)
    if isinstance(data, io.FileIO):        # a checked file of node memory, loaded by its open file
        return torch.load(f"/proc/self/fd/{data.fileno()}", mmap=True, weights_only=True)
    source = io.BytesIO(data) if isinstance(data, bytes) else ViewReader(memoryview(data))
    return torch.load(cast(IO[bytes], source), weights_only=True)


def _receive_buffer(store: SnapshotStore, rank: int, size: int, incoming: List[Path]) -> torch.Tensor:
    """Where a pull of size bytes lands: a file in the job's node memory, mapped (shared: what is
    received is in the file, and loading maps the same pages), noted in incoming; in process
    memory when there is no such file to be had."""
    if size > 0:
        try:
            path = store.incoming(rank, size)
        except (CheckpointError, OSError) as exc:
            return _in_process_memory(rank, size, exc)
        try:
            buffer = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        except (RuntimeError, OSError) as exc:
            path.unlink(missing_ok=True)
            return _in_process_memory(rank, size, exc)
        incoming.append(path)
        return buffer
    return torch.empty(0, dtype=torch.uint8)


def _in_process_memory(rank: int, size: int, why: BaseException) -> torch.Tensor:
    """Said, not silent: the rank now holds the pulled replica in its own memory as well."""
    print(f"slurmtools: rank {rank}: a pull of {size} bytes is received into process memory (node memory has no "
          f"room for it: {why})", file=sys.stderr, flush=True)
    return torch.empty(size, dtype=torch.uint8)


def _failure_text(exc: BaseException) -> str:
    """How a snapshot that was not kept is said (the same whether skipped before or failed after
    the host copy)."""
    return f"{type(exc).__name__}: {exc}"


class Snapshotter:
    """One rank's snapshots: take() at a step boundary every rank reaches at the same step."""

    def __init__(self, store: SnapshotStore, rank: int, hosts: Mapping[int, str], every_steps: int, group: Any,
                 limit_bytes: Optional[int] = None, max_overhead_pct: float = 0.0, attempt_id: str = "") -> None:
        """limit_bytes: this rank's share of node memory for its snapshots and the replicas it keeps;
        max_overhead_pct: the share of training time a snapshot's stall may take (0: the interval
        stays every_steps), the interval agreed by the ranks at each snapshot (snapshot.interval_for);
        attempt_id: recorded with each copy, its lineage (snapshot.timeline)."""
        self.store, self.rank, self.world, self.every_steps, self.group = store, rank, len(hosts), every_steps, group
        self.attempt_id = attempt_id
        self.min_every_steps, self.max_overhead_pct = every_steps, max_overhead_pct
        self.limit_bytes = limit_bytes
        self.peer = peer_of(rank, hosts)
        self.sources = replicas_kept_by(rank, hosts)
        self.stall_s = 0.0                           # what the training thread waited, in all
        self.failures: List[Tuple[int, str]] = []    # (step, why): a snapshot that did not complete
        # a daemon thread per snapshot, not an executor: a rank that crashes while its peer is gone
        # must not wait at exit for an exchange that never ends (executors are joined at exit)
        self._pending: Optional[Tuple[int, threading.Thread, List[str]]] = None
        self.copier = HostCopier()  # the host copy, written over by the next snapshot
        self.taken_step: Optional[int] = None   # the newest snapshot taken (sealing, or sealed: wait())

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    def prepare(self, state: Any) -> None:
        """Host buffers for state's shapes allocated in the background, before the first snapshot."""
        self.copier.prepare(state)

    def take(self, step: int, state: Any, step_s: Optional[float] = None, optimizer: Any = None) -> None:
        """Copy state to host memory now (on a GPU: started, finished in the background; optimizer,
        when given, waits on the device for what its step changes: host_copy); seal and replicate
        it in the background. A snapshot still replicating is waited for first: the next never
        overtakes it on the wire. step_s: this rank's training step time, for the interval (with
        max_overhead_pct), which follows the stall measured: the host's now, the device's so far."""
        started = time.monotonic()
        self.wait()                 # the previous copy is serialized: its buffers are free again
        try:
            self._agree_fit(state)
        except CheckpointError as exc:      # every rank skips it, before any host memory is taken
            self.failures.append((step, _failure_text(exc)))
            self.stall_s += time.monotonic() - started
            return
        try:
            host_state: Any = self.copier.start(state, optimizer)
        except (RuntimeError, MemoryError) as exc:    # no pinned memory to be had: a shortcut lost
            host_state = None
            self.failures.append((step, f"the host copy failed: {_failure_text(exc)}"))
        stall_s = time.monotonic() - started + self.copier.device_stall_s()
        if self.max_overhead_pct > 0:       # every rank, in the training thread: the group is free
            self.every_steps = agree_max(interval_for(stall_s, step_s or 0.0, self.min_every_steps,
                                                      self.max_overhead_pct), self.group)
        self.stall_s += stall_s
        if host_state is None:              # its peer's exchange gives up after EXCHANGE_TIMEOUT_S
            return
        errors: List[str] = []
        thread = threading.Thread(target=self._run, args=(step, host_state, errors), name="snapshot", daemon=True)
        thread.start()
        self._pending = (step, thread, errors)
        self.taken_step = step

    def _run(self, step: int, state: Any, errors: List[str]) -> None:
        try:
            self.copier.finish()
            self._write_and_replicate(step, state)
        except Exception as exc:      # a snapshot is a shortcut: the persistent checkpoint still stands
            errors.append(_failure_text(exc))

    def wait(self) -> None:
        if self._pending is None:
            return
        step, thread, errors = self._pending
        self._pending = None
        thread.join()
        self.failures += [(step, why) for why in errors]

    def close(self, wait: bool = True) -> None:
        """The snapshot in flight finished (its peer waits for it); wait=False after a crash."""
        if wait:
            self.wait()
        self.copier.close()

    def _agree_fit(self, state: Any) -> None:
        """Collective, in the training thread before the host copy: the ranks agree whether every
        snapshot and replica fits node memory, by the tensors' bytes (known on the device, before
        any copy), so a shard too large is never copied to host memory, serialized nor sent.
        Raises CheckpointError on every rank when one does not fit."""
        estimate = tensor_bytes(state)
        estimates = exchange_sizes(estimate, self.peer, self.sources, self.group)
        too_large = over_limit(estimate, list(estimates.values()), self.limit_bytes)
        over = first_rank_over(too_large is not None, self.rank, self.group)
        if over is not None:
            raise CheckpointError(too_large or f"rank {over}'s snapshot or the replicas it keeps do not fit its "
                                               f"share of node memory: every rank skips this one")

    def host_bytes(self) -> int:
        """Host memory this rank holds in its snapshot copy (0 before the first one)."""
        return tensor_bytes(self.copier.host) if self.copier.host is not None else 0

    def _write_and_replicate(self, step: int, state: Any) -> None:
        """In the background: serialize, exchange with the peers (its peer waits for it), keep. A
        replica is kept only with the job's MAC of it (its sender holds the job's key: a process
        outside the job that joined the transport cannot make one), checked over the bytes received."""
        data = serialize(state)
        digest = digests.of_buffer(data)
        own = Copy(self.rank, step, self.store.host, True, self.world, self.attempt_id)
        received = exchange(data, self.peer, self.sources, self.group)
        macs = exchange_macs(self.store.mac(own, len(data), (digests.ALGORITHM, digest)), self.peer, self.sources,
                             self.group)
        too_large = over_limit(len(data), [len(payload) for payload in received.values()], self.limit_bytes)
        if too_large:               # the serialized framing alone took it over: rare, and not kept
            raise CheckpointError(too_large)
        self.store.save_own(self.rank, step, {STATE_FILE: data},
                            {"world": self.world, "rank": self.rank, "attempt": self.attempt_id}, {STATE_FILE: digest})
        refused: List[int] = []
        for source, payload in received.items():
            got = digests.of_buffer(payload)
            replica = Copy(source, step, self.store.host, False, self.world, self.attempt_id)
            if not self.store.authentic(replica, len(payload), (digests.ALGORITHM, got), macs[source]):
                refused.append(source)
                continue
            self.store.save_replica(source, step, {STATE_FILE: payload},
                                    {"world": self.world, "rank": source, "attempt": self.attempt_id}, {STATE_FILE: got})
        if refused:
            raise CheckpointError(f"the replica of rank {refused[0]}'s step {step} does not carry the job's MAC (sent "
                                  f"by a process without the job's key, or spoiled on the wire): not kept")


def lists_node(rank: int, hosts: Mapping[int, str]) -> bool:
    """Whether rank is the first of its node, the one that lists the node's copies in the
    inventory: its node's other ranks see the same node memory, and each listing it would read its
    manifests once per rank and make every rank decode the node's list once per rank."""
    return rank == min(other for other, host in hosts.items() if host == hosts[rank])


def gather_inventory(store: SnapshotStore, group: Any, leader_value: Any = None, *,
                     lists: bool) -> Tuple[List[Copy], Any]:
    """Every node's verified copies (manifests read, not the data; listed by the ranks that
    `lists`, one a node: lists_node) and the group's first rank's leader_value (what it decided for
    every rank: carried in the same round, one collective less at every rank of a recovery).
    Collective."""
    listed = store.inventory(checksums=False) if lists else []
    gathered = gather_json({"copies": pack_copies(listed), "leader": leader_value}, group)
    try:
        copies = {copy for part in gathered for copy in unpack_copies(part["copies"])}
    except (TypeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"a rank sent an inventory that is none of ours: {exc}") from None
    return sorted(copies, key=lambda c: (c.step, c.of_rank, c.host, c.own)), gathered[0]["leader"]


def restore(store: SnapshotStore, rank: int, hosts: Mapping[int, str], checkpoint_step: Optional[int],
            group: Any, lineage: Optional[FrozenSet[str]] = None) -> Tuple[Optional[int], Any, str]:
    """restore_from the copies every node holds (gather_inventory, then restore_from)."""
    copies, _ = gather_inventory(store, group, lists=lists_node(rank, hosts))
    return restore_from(copies, store, rank, hosts, checkpoint_step, group, lineage)


def restore_from(copies: List[Copy], store: SnapshotStore, rank: int, hosts: Mapping[int, str],
                 checkpoint_step: Optional[int], group: Any, lineage: Optional[FrozenSet[str]] = None
                 ) -> Tuple[Optional[int], Any, str]:
    """(step, this rank's state, why) from the snapshots, or (None, None, why): restore from the
    persistent checkpoint. Collective: every rank of the new step calls it at its start, with the
    same copies (gather_inventory).

    The inventory reads manifests only, one rank a node (reading every snapshot's data there
    would cost the node's memory bandwidth before training goes on); each copy used is verified as
    it is read, and a copy that fails is left out of a new plan (an older snapshot, else the
    checkpoint), every rank agreeing."""
    refused: List[str] = []
    while True:
        plan = plan_restore(copies, hosts, checkpoint_step, lineage)
        if plan.step is None:
            return None, None, "; ".join(refused + [plan.why])
        data, bad = _fetch(store, rank, hosts, plan, group)
        problems = gather_json(bad, group)
        failed = [problem for problem in problems if problem]
        if not failed:
            pulls = plan.pulls(hosts)
            pulled = f", ranks {','.join(map(str, sorted(pulls)))} pulled from their replicas" if pulls else ""
            earlier = f" ({'; '.join(refused)})" if refused else ""
            try:
                state = deserialize(data)
            finally:
                _release(data)                      # its pages live on in the loaded tensors only
            return plan.step, state, f"{plan.why}{pulled}{earlier}"
        _release(data)                              # another rank's refusal made it useless
        refused.append(f"snapshot of step {plan.step} refused: {failed[0][0]}")
        unusable = {Copy(**fields) for _, fields in failed}
        copies = [copy for copy in copies if copy not in unusable]


def _fetch(store: SnapshotStore, rank: int, hosts: Mapping[int, str], plan: Any, group: Any
           ) -> Tuple[Any, Optional[Tuple[str, Dict[str, Any]]]]:
    """This rank's bytes of the plan: its own node's copy, or pulled from the node that holds it
    (each pull served by another rank of that node in turn, so a lost node's ranks pull in
    parallel; snapshot_wire pipelines it); (data, None), or (b"", (why, the copy that failed))."""
    pulls = plan.pulls(hosts)
    data: Any = b""
    problem: Optional[Tuple[str, Dict[str, Any]]] = None
    served: Dict[str, int] = {}
    for target in sorted(pulls):
        copy = pulls[target]
        holders = sorted(other for other, host in hosts.items() if host == copy.host)
        server = holders[served.get(copy.host, 0) % len(holders)]
        served[copy.host] = served.get(copy.host, 0) + 1
        if rank == server:
            _serve(store, copy, target, group)
        elif rank == target:
            incoming: List[Path] = []
            received, failure = pull(server, group, lambda size: _receive_buffer(store, rank, size, incoming),
                                     lambda size, digest, mac: store.authentic(copy, size, digest, mac))
            if received is not None:
                data = incoming[0] if incoming else received.numpy().data
            else:
                for path in incoming:
                    path.unlink(missing_ok=True)
            if failure == "unreadable":
                problem = (f"rank {rank}: {copy.host} could not read its replica of step {copy.step}", asdict(copy))
            elif failure == "size":
                problem = (f"rank {rank}: {copy.host} announced an implausible size for its replica of step "
                           f"{copy.step}", asdict(copy))
            elif failure == "mac":
                problem = (f"rank {rank}: the replica of step {copy.step} pulled from {copy.host} does not carry "
                           f"the job's MAC", asdict(copy))
            elif failure:
                problem = (f"rank {rank}: the replica of step {copy.step} pulled from {copy.host} does not match "
                           f"its digest", asdict(copy))
    # its own copy after the pulls it serves: a puller waits for them, nobody waits for this read
    # (and a rank whose own copy fails has served them all the same)
    if rank not in pulls:
        try:
            data = store.open_verified(plan.sources[rank], STATE_FILE)
        except CheckpointError as exc:
            problem = (f"rank {rank}: {exc}", asdict(plan.sources[rank]))
    return data, problem


def _release(data: Any) -> None:
    """A pull's file in node memory is removed, a copy's open file closed (the copy stays)."""
    if isinstance(data, Path):
        data.unlink(missing_ok=True)
    elif isinstance(data, io.FileIO):
        data.close()


def _serve(store: SnapshotStore, copy: Copy, target: int, group: Any) -> None:
    """Send copy's state to target; one this node cannot find or open is sent as unreadable."""
    try:
        path, size, digest = store.locate(copy, STATE_FILE)
    except CheckpointError:
        serve(None, 0, ("", ""), "", target, group)
        return
    handle = open_regular(path, size)
    try:
        serve(handle, size, digest, store.mac(copy, size, digest), target, group)
    finally:
        if handle is not None:
            handle.close()
