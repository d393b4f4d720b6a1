"""A snapshot's copy of the rank's state into host memory, at device speed: the only part of a
snapshot the training waits for (torch_state.Snapshotter serializes and replicates the copy in the
background).

On a GPU a copy into pageable memory runs at about a quarter of the link's rate on the training
thread (measured on an H200: 16 GB in 1.07 s reused, 10.6 s the first time, which faults in every
page), so:

- host buffers are pinned, allocated once and written over by every later snapshot; prepare()
  allocates them in the background from the state's shapes before the first snapshot is due;
- with room on the device that the job never used (its peak reservation so far, plus a margin),
  the state is first copied into a staging copy there, in the training stream (at the device's
  memory rate: milliseconds), then drained to the pinned buffers on a side stream while training
  goes on; the staging memory goes back to the caching allocator once drained (decided at the
  first snapshot: a staging copy raises the peak it is judged by; an out-of-memory error on the
  way falls back to the path below for good);
- without that room, tensors that only the optimizer step changes (the parameters it updates and
  its own state) are copied on a side stream, overlapped with the next step's forward and
  backward, and the optimizer's next step waits for them on the device (a step pre-hook: a stream
  wait, no host stall); any other tensor (a buffer the forward pass updates) is copied in the
  training stream, ordered before anything that changes it.

A tensor in host memory (every tensor on a CPU-only machine) is copied at once, as before: the same
path, no stream. The stall counted for the snapshot interval is the host's time plus the device's
measured share of the training stream (device_stall_s).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch

# spare device memory kept free beside a staging copy: the allocator's fragmentation, a new peak
STAGING_MARGIN_BYTES = 2 << 30


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what a rank snapshots), any other tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def tensors(state: Any) -> Iterator[torch.Tensor]:
    """Every tensor of state (its local shards), in a fixed order."""
    if isinstance(state, torch.Tensor):
        yield local(state)
    elif isinstance(state, dict):
        for value in state.values():
            yield from tensors(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from tensors(value)


def _fits(buffer: Any, source: torch.Tensor) -> bool:
    return (isinstance(buffer, torch.Tensor) and buffer.shape == source.shape and buffer.dtype == source.dtype
            and buffer.device.type == "cpu" and buffer.is_contiguous())


def _host_buffer(source: torch.Tensor) -> torch.Tensor:
    """Where a tensor's copy goes: pinned when it lives on a GPU (the DMA engine's full rate)."""
    return torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)


def structure(state: Any, reuse: Any, copy: Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]) -> Any:
    """state's shape with copy(tensor, its previous buffer) for every tensor; other values as they are."""
    if isinstance(state, torch.Tensor):
        return copy(local(state), reuse if isinstance(reuse, torch.Tensor) else None)
    if isinstance(state, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        return {key: structure(value, previous.get(key), copy) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        items = list(reuse) if isinstance(reuse, (list, tuple)) and len(reuse) == len(state) else [None] * len(state)
        return type(state)(structure(value, items[i], copy) for i, value in enumerate(state))
    return state


def optimizer_tensors(optimizer: Any) -> Set[int]:
    """The storage addresses of what only optimizer.step() changes: its parameters' local shards
    and its state's tensors (a tensor a snapshot may copy while the next forward and backward run)."""
    if optimizer is None:
        return set()
    found: Set[int] = set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            found.add(local(param).data_ptr())
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                found.add(local(value).data_ptr())
    return found


def staging_room(device_bytes: int) -> bool:
    """Whether a staging copy of device_bytes fits in device memory the job has never reserved."""
    if device_bytes <= 0 or not torch.cuda.is_available():
        return False
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return total - torch.cuda.max_memory_reserved() - STAGING_MARGIN_BYTES >= device_bytes


def _side_stream() -> Any:
    return torch.cuda.Stream()  # type: ignore[no-untyped-call]


def _event(timing: bool) -> Any:
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


class HostCopier:
    """One rank's host copies: start() at a step boundary, finish() before the copy is read."""

    def __init__(self) -> None:
        self._host: Any = None                   # the last copy's buffers, written over by the next
        self._allocating: Optional[threading.Thread] = None
        self._side: Any = None                   # the side stream (made at the first GPU snapshot)
        self._copied: Any = None                 # recorded on the side stream after its copies
        self._staging: List[torch.Tensor] = []   # device copies held until drained
        self._hooked: Dict[int, Any] = {}        # id(optimizer) -> its pre-hook's handle
        # (started, ended) pairs of timing events around the training stream's share of a copy:
        # its in-order copies, and its wait at the optimizer step
        self._stalls: List[Tuple[Any, Any]] = []
        self._events: List[Any] = []             # what finish() waits for
        self.staged = False                      # whether the last copy went through a staging copy
        self._use_staging: Optional[bool] = None # decided at the first GPU snapshot

    @property
    def host(self) -> Any:
        return self._host

    def prepare(self, state: Any) -> None:
        """Allocate pinned buffers for state's GPU tensors in the background (pinning GBs takes
        seconds): the first snapshot then only copies. Nothing to do on a CPU-only machine."""
        if self._host is not None or self._allocating is not None or not any(t.is_cuda for t in tensors(state)):
            return
        skeleton = structure(state, None, lambda source, _: torch.empty(source.shape, dtype=source.dtype,
                                                                        device="meta"))
        pinned = iter([t.is_cuda for t in tensors(state)])     # structure() visits in tensors()' order

        def allocate() -> None:
            try:
                self._host = structure(skeleton, None, lambda meta, _: torch.empty(
                    meta.shape, dtype=meta.dtype, pin_memory=next(pinned)))
            except (RuntimeError, MemoryError):
                pass            # no pinned memory now: the snapshot's own copy tries, and says so
        self._allocating = threading.Thread(target=allocate, name="snapshot-pin", daemon=True)
        self._allocating.start()

    def start(self, state: Any, optimizer: Any = None, staging: Optional[bool] = None) -> Any:
        """state's copy in host memory, the GPU's copies possibly still in flight (finish() waits
        for them). The previous copy must be finished and read: its buffers are written over.
        staging: through a staging copy on the device or not (None: when there is room)."""
        if self._allocating is not None:
            self._allocating.join()
            self._allocating = None
        gpu_bytes = sum(t.numel() * t.element_size() for t in tensors(state) if t.is_cuda)
        if gpu_bytes == 0:
            self.staged = False
            self._host = structure(state, self._host, copy_now)
            return self._host
        if self._side is None:
            self._side = _side_stream()
        if self._use_staging is None:            # decided once: a staging copy raises the peak itself
            self._use_staging = staging_room(gpu_bytes)
        self.staged = self._use_staging if staging is None else staging
        try:
            return self._start_on_gpu(state, optimizer)
        except torch.cuda.OutOfMemoryError:
            if not self.staged:
                raise
            self._staging, self._use_staging, self.staged = [], False, False   # the room is gone: overlap
            return self._start_on_gpu(state, optimizer)

    def _start_on_gpu(self, state: Any, optimizer: Any) -> Any:
        late = set() if self.staged else optimizer_tensors(optimizer)
        side_work: List[Tuple[torch.Tensor, torch.Tensor]] = []

        def copy(source: torch.Tensor, buffer: Optional[torch.Tensor]) -> torch.Tensor:
            fits = _fits(buffer, source) and (not source.is_cuda or bool(buffer is not None and buffer.is_pinned()))
            target = buffer if fits and buffer is not None else _host_buffer(source)
            if not source.is_cuda:
                return target.copy_(source.detach())
            if self.staged:                      # in the training stream: ordered, device speed
                staged = source.detach().clone()
                self._staging.append(staged)
                side_work.append((target, staged))
            elif source.data_ptr() in late:      # only the optimizer step changes it: overlapped
                side_work.append((target, source.detach()))
            else:                                # the forward may change it: copied in order
                target.copy_(source.detach(), non_blocking=True)
            return target
        current = torch.cuda.current_stream()
        begun = _event(timing=True)
        begun.record(current)
        self._host = structure(state, self._host, copy)
        in_order = _event(timing=True)
        in_order.record(current)                 # the training stream's share, before the next forward
        self._stalls.append((begun, in_order))
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            for target, source in side_work:
                source.record_stream(self._side)     # staging freed once drained, not reused before
                target.copy_(source, non_blocking=True)
        self._copied = _event(timing=False)
        self._copied.record(self._side)
        self._events = [self._copied, in_order]
        if late and optimizer is not None and id(optimizer) not in self._hooked:
            self._hooked[id(optimizer)] = optimizer.register_step_pre_hook(self._before_optimizer_step)
        return self._host

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step waits on the device for the side stream's copies of what it changes."""
        if self._copied is None or self.staged:
            return
        current = torch.cuda.current_stream()
        started, ended = _event(timing=True), _event(timing=True)
        started.record(current)
        current.wait_event(self._copied)
        ended.record(current)
        self._stalls.append((started, ended))
        self._copied = None                          # one wait per snapshot

    def finish(self) -> None:
        """Wait (off the training thread) until the copy is in host memory; staging memory freed."""
        for event in self._events:
            event.synchronize()
        self._events = []
        self._staging = []

    def device_stall_s(self) -> float:
        """The training stream's time spent on snapshot copies measured since the last call (its
        in-order copies and its wait at the optimizer step); a pair not yet reached on the device is
        counted at a later call."""
        total_s, pending = 0.0, []
        for started, ended in self._stalls:
            if ended.query():
                total_s += float(started.elapsed_time(ended)) / 1000.0
            else:
                pending.append((started, ended))
        self._stalls = pending
        return total_s

    def close(self) -> None:
        """The optimizer hooks removed (a later optimizer or a restart registers its own)."""
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()


def copy_now(source: torch.Tensor, buffer: Optional[torch.Tensor]) -> torch.Tensor:
    """A host tensor's copy, now (over buffer when it fits)."""
    if buffer is not None and _fits(buffer, source):
        return buffer.copy_(source.detach())
    return source.detach().to("cpu", copy=True)
