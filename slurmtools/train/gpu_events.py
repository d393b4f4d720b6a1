"""GPU XID events the job sees while it runs, so that a GPU fault names its node (issue 46).

An XID that crashes a rank (79: fallen off the bus, 48: double-bit ECC, 94/95: contained or
uncontained ECC, ...) is written only to that node's kernel log, which the job's user may not read;
the step then fails like any crash and the restart lands on the same node. NVML's event API gives
the same events to an ordinary process of the node (no root): one process per node, its local
rank 0, waits for them in a daemon thread (`GpuEventWatch`) and writes each one at once -- the rank
may die a moment later -- into the control dir, `gpu-events/node-<host>.json`. The supervisor reads
those files when the step ends (`read_events`) and blames a node whose GPU reported an XID that
NVIDIA's catalogue puts on the hardware (xid.NODE_ACTIONS: drain or reboot).

Sources (`distributed.gpu_events`, SLURMTOOLS_GPU_EVENTS): `nvml` (the default; a node without
NVIDIA's driver library has no NVIDIA GPU to watch and says nothing), `none`, or `fixture:<path>`:
a JSON-lines file of events (`{"host": "node2", "gpu": 0, "xid": 79}`) for rehearsals and tests,
read from its end as NVML gives only events after registration, never chosen unless named.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

from slurmtools.common import xid
from slurmtools.common.fsutil import json_object, read_small_regular, write_json_atomic
from slurmtools.train.node_beat import local_rank, node_file_name

GPU_EVENTS_ENV = "SLURMTOOLS_GPU_EVENTS"  # distributed.gpu_events: nvml, none, or fixture:NAME (rehearsals, tests)
DEFAULT_SOURCE = "nvml"
FIXTURE_PREFIX = "fixture:"
GPU_EVENTS_DIR = "gpu-events"         # in the control dir: one file per node that saw an event
MAX_EVENTS_PER_NODE = 64
MAX_RECORD_BYTES = 64 * 1024
MAX_NODE_FILES = 100_000
WAIT_S = 1.0                          # one wait of the watch thread (NVML's timeout, the fixture's poll)
FIXTURE_POLL_S = 0.2
MAX_FIXTURE_READ_BYTES = 64 * 1024


class EventSourceError(Exception):
    """The events cannot be watched (no driver, no GPU accepts the registration, a bad source)."""


@dataclass(frozen=True)
class GpuEvent:
    host: str
    gpu: int
    xid: int
    time_s: float

    @property
    def node_fault(self) -> bool:
        """NVIDIA's catalogue puts this XID on the hardware: drain or reboot the node."""
        return xid.default_action(self.xid) in xid.NODE_ACTIONS


class EventSource(Protocol):
    def wait(self, timeout_s: float) -> Optional[GpuEvent]: ...


def source_problem(source: str) -> Optional[str]:
    """Why a source setting is not one (for the spec's check), or None."""
    if source in ("nvml", "none") or (source.startswith(FIXTURE_PREFIX) and len(source) > len(FIXTURE_PREFIX)
                                      and source.isprintable()):
        return None
    return f"must be nvml, none or fixture:<path>; got {source!r}"


class NvmlEvents:
    """XID events of every GPU of the node that accepts the registration (a job confined to its own
    GPUs gets handles to those only)."""

    def __init__(self, host: str) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise EventSourceError(f"pynvml: {exc}") from None
        self.nv: Any = pynvml
        self.host = host
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise EventSourceError("") from None     # no NVIDIA driver: no NVIDIA GPU to watch
        except pynvml.NVMLError as exc:
            raise EventSourceError(f"NVML: {exc}") from None
        self.event_set = pynvml.nvmlEventSetCreate()
        registered = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self.event_set)
                registered += 1
            except pynvml.NVMLError:
                continue             # not this job's GPU, or events not supported on it
        if not registered:
            raise EventSourceError("no GPU of this node accepts an XID event registration")

    def wait(self, timeout_s: float) -> Optional[GpuEvent]:
        try:
            data = self.nv.nvmlEventSetWait_v2(self.event_set, int(timeout_s * 1000))
        except self.nv.NVMLError_Timeout:
            return None
        except self.nv.NVMLError as exc:
            raise EventSourceError(f"NVML: {exc}") from None
        try:
            gpu = int(self.nv.nvmlDeviceGetIndex(data.device))
        except self.nv.NVMLError:
            gpu = -1
        return GpuEvent(self.host, gpu, int(data.eventData), time.time())


class FixtureEvents:
    """Events appended to a JSON-lines file after the watch began, this host's only."""

    def __init__(self, path: Path, host: str) -> None:
        self.path, self.host = path, host
        self.pending: List[GpuEvent] = []
        self.partial = b""
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0          # not written yet: every line it will have is news

    def _read_new(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(MAX_FIXTURE_READ_BYTES)
        except OSError:
            return
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            data = json_object(line.decode("utf-8", "replace"))
            if data is not None and data.get("host") == self.host:
                event = _event(data, self.host)
                if event is not None:
                    self.pending.append(replace(event, time_s=time.time()))

    def wait(self, timeout_s: float) -> Optional[GpuEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.pending:
                self._read_new()
            if self.pending:
                return self.pending.pop(0)
            if time.monotonic() >= deadline:
                return None
            time.sleep(FIXTURE_POLL_S)


def open_source(source: str, host: str) -> Optional[EventSource]:
    """The source a setting names; None for `none`. EventSourceError when it cannot be watched."""
    problem = source_problem(source)
    if problem:
        raise EventSourceError(problem)
    if source == "none":
        return None
    if source.startswith(FIXTURE_PREFIX):
        return FixtureEvents(Path(source[len(FIXTURE_PREFIX):]), host)
    return NvmlEvents(host)


def _event(data: Mapping[str, Any], host: str) -> Optional[GpuEvent]:
    gpu, code, time_s = data.get("gpu"), data.get("xid"), data.get("time_s", 0.0)
    if not (isinstance(gpu, int) and isinstance(code, int) and isinstance(time_s, (int, float))):
        return None
    if isinstance(gpu, bool) or isinstance(code, bool) or not (-1 <= gpu < 4096 and 1 <= code <= 9999):
        return None
    return GpuEvent(host, gpu, code, float(time_s))


def node_file(control_dir: Path, host: str) -> Path:
    return control_dir / GPU_EVENTS_DIR / node_file_name(host)


def write_events(control_dir: Path, host: str, attempt_id: str, events: List[GpuEvent]) -> None:
    """This node's events so far, replacing the file (atomic: the reader sees all or the last)."""
    path = node_file(control_dir, host)
    path.parent.mkdir(exist_ok=True)
    write_json_atomic(path, {"host": host, "attempt_id": attempt_id,
                             "events": [{"gpu": e.gpu, "xid": e.xid, "time_s": round(e.time_s, 3)}
                                        for e in events[-MAX_EVENTS_PER_NODE:]]})


def read_events(control_dir: Path, attempt_id: str) -> List[GpuEvent]:
    """Every well-formed event this attempt's nodes wrote, oldest first (a file of another attempt,
    torn or malformed, is skipped: the control dir is the job's own, written by its processes)."""
    found: List[GpuEvent] = []
    try:
        # node files only: a writer's temp file beside them (write_json_atomic's, between its write
        # and its rename) holds the same events again
        names = sorted(name for name in os.listdir(control_dir / GPU_EVENTS_DIR)
                       if not name.startswith("."))[:MAX_NODE_FILES]
    except OSError:
        return found
    for name in names:
        raw = read_small_regular(control_dir / GPU_EVENTS_DIR / name, MAX_RECORD_BYTES)
        data = json_object(raw.decode("utf-8", "replace")) if raw is not None else None
        if data is None or data.get("attempt_id") != attempt_id or not isinstance(data.get("host"), str):
            continue
        listed = data.get("events")
        for item in (listed if isinstance(listed, list) else [])[:MAX_EVENTS_PER_NODE]:
            event = _event(item, data["host"]) if isinstance(item, dict) else None
            if event is not None:
                found.append(event)
    return sorted(found, key=lambda event: (event.time_s, event.host))


def node_faults(events: List[GpuEvent]) -> List[Tuple[str, GpuEvent]]:
    """(node, its first hardware-class event) for each node that had one, the earliest node first."""
    first: Dict[str, GpuEvent] = {}
    for event in events:
        if event.node_fault and event.host not in first:
            first[event.host] = event
    return sorted(first.items(), key=lambda item: item[1].time_s)


_WATCHES: Dict[Tuple[str, str], Optional["GpuEventWatch"]] = {}


def fault_detail(faults: List[Tuple[str, GpuEvent]]) -> str:
    """The evidence line of the first node's event ("" for none)."""
    if not faults:
        return ""
    node, event = faults[0]
    action = xid.default_action(event.xid)
    return f"xid={event.xid} on GPU {event.gpu} of {node} ({action}-class in NVIDIA's catalogue; NVML event)"


class GpuEventWatch:
    """The node's watch: a daemon thread that writes each event into the control dir at once."""

    def __init__(self, source: EventSource, control_dir: Path, host: str, attempt_id: str) -> None:
        self.source, self.control_dir, self.host, self.attempt_id = source, control_dir, host, attempt_id
        self.events: List[GpuEvent] = []
        self.thread = threading.Thread(target=self._run, name="slurmtools-gpu-events", daemon=True)

    @classmethod
    def for_rank(cls, control_dir: Path, rank: int, host: str, attempt_id: str,
                 environ: Mapping[str, str]) -> Optional["GpuEventWatch"]:
        """The node's one watch, in its local rank 0 (rank 0 when the launcher gives no local rank),
        started once per process and attempt."""
        node_rank = local_rank(environ)
        if (node_rank if node_rank is not None else rank) != 0:
            return None
        key = (str(control_dir), attempt_id)
        if key not in _WATCHES:
            _WATCHES[key] = cls.start(control_dir, host, attempt_id, environ)
        return _WATCHES[key]

    @classmethod
    def start(cls, control_dir: Path, host: str, attempt_id: str,
              environ: Mapping[str, str]) -> Optional["GpuEventWatch"]:
        """The running watch, or None (source `none`, no NVIDIA driver, or a problem it says in one line)."""
        setting = environ.get(GPU_EVENTS_ENV) or DEFAULT_SOURCE
        try:
            source = open_source(setting, host)
        except EventSourceError as exc:
            if str(exc):
                print(f"slurmtools: {host}: GPU XID events not watched: {exc}", file=sys.stderr, flush=True)
            return None
        if source is None:
            return None
        watch = cls(source, control_dir, host, attempt_id)
        watch.thread.start()
        return watch

    def _run(self) -> None:
        while True:
            try:
                event = self.source.wait(WAIT_S)
            except EventSourceError as exc:
                print(f"slurmtools: {self.host}: GPU XID events no longer watched: {exc}", file=sys.stderr, flush=True)
                return
            if event is None:
                continue
            self.events.append(event)
            print(f"slurmtools: {self.host}: GPU {event.gpu} reported XID {event.xid}", file=sys.stderr, flush=True)
            try:
                write_events(self.control_dir, self.host, self.attempt_id, self.events)
            except OSError as exc:
                print(f"slurmtools: {self.host}: cannot record GPU XID {event.xid}: {exc.strerror}",
                      file=sys.stderr, flush=True)
