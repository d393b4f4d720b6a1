"""The bytes of snapshots between ranks, over the snapshots' own gloo group (snapshot_torch.py
says when): the replication exchange (each rank sends its snapshot to its peer and receives the
ones it keeps) and a pull (a lost node's rank takes its replica from the rank that serves it).

A pull is pipelined in chunks: the holder reads chunk k+1 from node memory into one of two send
buffers while chunk k is on the wire, and the puller checks chunk k against the digest the copy's
manifest records while chunk k+1 arrives, into one buffer of the copy's size that torch.load
then reads in place (the caller's: snapshot_torch receives into a file in node memory and maps
it; ViewReader reads a plain buffer without copying it first). Measured before (bench/snapshot_peer.py, 268 MB): the holder
read and hashed the file, then prefixed the digest (a copy), the puller hashed it again and
torch.load copied it once more: 1.38 s.
"""
from __future__ import annotations

import io
import json
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from slurmtools.checkpoint import digests
from slurmtools.common.fsutil import bounded_json
from slurmtools.errors import CheckpointError

CHUNK_BYTES = 16 * 1024 * 1024      # large enough that gloo runs at the link's rate, small enough to overlap
_HEADER_BYTES = 256                  # "<algorithm>:<hex digest>" of the copy, zero-padded; empty: none


def as_tensor(data: Any) -> torch.Tensor:
    """data (bytes or a buffer) as a uint8 tensor without a copy (gloo only reads what it sends)."""
    if not len(data):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(data, dtype=torch.uint8)


def _wait(requests: Sequence[Any]) -> None:
    for request in requests:
        request.wait()


def exchange_sizes(own_bytes: int, peer: Optional[int], sources: Sequence[int], group: Any) -> Dict[int, int]:
    """Tell peer how many bytes this rank sends it; hear the same from each source."""
    sizes = {source: torch.zeros(1, dtype=torch.int64) for source in sources}
    sends = [dist.isend(torch.tensor([own_bytes], dtype=torch.int64), peer, group=group)] if peer is not None else []
    _wait(sends + [dist.irecv(sizes[source], source, group=group) for source in sources])
    return {source: int(size.item()) for source, size in sizes.items()}


# what a peer may announce it sends: a replica is one rank's shard (a terabyte is far past any);
# a negative or absurd size is refused before anything is allocated for it
MAX_PEER_BYTES = 1 << 40


def plausible_size(size: int) -> bool:
    return 0 <= size <= MAX_PEER_BYTES


MAC_BYTES = 64                 # job_secret.copy_mac's hex


def exchange_macs(mac: str, peer: Optional[int], sources: Sequence[int], group: Any) -> Dict[int, str]:
    """Send peer the MAC of what this rank sent it; hear each source's (fixed size: text that is not
    a MAC simply fails the check)."""
    incoming = {source: torch.zeros(MAC_BYTES, dtype=torch.uint8) for source in sources}
    mine = torch.zeros(MAC_BYTES, dtype=torch.uint8)
    encoded = mac.encode()[:MAC_BYTES]
    if encoded:
        mine[:len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    sends = [dist.isend(mine, peer, group=group)] if peer is not None else []
    _wait(sends + [dist.irecv(incoming[source], source, group=group) for source in sources])
    return {source: bytes(buffer.numpy().tobytes()).rstrip(b"\0").decode("ascii", errors="replace")
            for source, buffer in incoming.items()}


def exchange(data: Any, peer: Optional[int], sources: Sequence[int], group: Any) -> Dict[int, memoryview]:
    """Send data to peer and receive each source's (their sizes first), all at once; what came in
    is a view of the received buffer, not a copy. A source announcing an implausible size is a
    CheckpointError (this snapshot is not kept), not an error of torch.empty."""
    sizes = exchange_sizes(len(data), peer, sources, group)
    bad = sorted(source for source in sources if not plausible_size(sizes[source]))
    if bad:
        raise CheckpointError(f"rank {bad[0]} announced a replica of {sizes[bad[0]]} bytes (at most "
                              f"{MAX_PEER_BYTES}): not received")
    buffers = {source: torch.empty(sizes[source], dtype=torch.uint8) for source in sources}
    sends = [dist.isend(as_tensor(data), peer, group=group)] if peer is not None else []
    _wait(sends + [dist.irecv(buffers[source], source, group=group) for source in sources])
    return {source: buffers[source].numpy().data for source in sources}


MAX_JSON_BYTES = 1 << 24       # one rank's part of a JSON collective (an inventory of its copies)


# a JSON collective's first round: every rank's length and the first bytes of its value, so a
# small value (a host name, a decision, a node's inventory of a few copies) takes one all_gather,
# not two; a longer one sends the rest in a second round (at 32 ranks on 2 cores each round of a
# recovery's collectives cost ~0.1-0.2 s; 1 KiB a rank is ~10 MB a round at 9,600 ranks)
FIRST_ROUND_BYTES = 1024
_LENGTH_BYTES = 8


def gather_json(value: Any, group: Any = None) -> List[Any]:
    """dist.all_gather_object without pickle: every rank's value as JSON (a peer's bytes are parsed
    as JSON, never unpickled: a process that joined the job's transport runs no code here)."""
    data = json.dumps(value, sort_keys=True, allow_nan=False).encode()
    device = _device(group)
    inline = FIRST_ROUND_BYTES - _LENGTH_BYTES
    first = torch.frombuffer(bytearray((len(data).to_bytes(_LENGTH_BYTES, "little") + data[:inline]).ljust(
        FIRST_ROUND_BYTES, b"\0")), dtype=torch.uint8)
    firsts = [torch.zeros(FIRST_ROUND_BYTES, dtype=torch.uint8, device=device)
              for _ in range(dist.get_world_size(group))]
    dist.all_gather(firsts, first.to(device), group=group)
    raw = [part.cpu().numpy().tobytes() for part in firsts]
    lengths = [int.from_bytes(part[:_LENGTH_BYTES], "little") for part in raw]
    if not all(0 < length <= MAX_JSON_BYTES for length in lengths):
        raise CheckpointError(f"a rank sent {max(lengths)} bytes of JSON (at most {MAX_JSON_BYTES})")
    heads = [part[_LENGTH_BYTES:_LENGTH_BYTES + min(length, inline)] for part, length in zip(raw, lengths)]
    longest_rest = max(lengths) - inline
    if longest_rest <= 0:                   # every value was whole in the first round
        return [_parsed(part) for part in heads]
    mine = torch.zeros(longest_rest, dtype=torch.uint8)
    rest = data[inline:]
    if rest:
        mine[:len(rest)] = torch.frombuffer(bytearray(rest), dtype=torch.uint8)
    parts = [torch.zeros(longest_rest, dtype=torch.uint8, device=device) for _ in lengths]
    dist.all_gather(parts, mine.to(device), group=group)
    return [_parsed(part_head + part[:max(0, length - inline)].cpu().numpy().tobytes())
            for part_head, part, length in zip(heads, parts, lengths)]


def _device(group: Any) -> torch.device:
    """Where a collective's tensors live: the current GPU for NCCL, else host memory."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _parsed(raw: bytes) -> Any:
    try:
        return bounded_json(raw)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"a rank sent what is no JSON of ours: {exc}") from None


def first_rank_over(over: bool, rank: int, group: Any) -> Optional[int]:
    """Collective: the lowest rank of the group that says it is over (its snapshot does not fit),
    or None: every rank learns it before anything is serialized or sent."""
    flag = torch.tensor([-rank if over else -(1 << 62)], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    lowest = -int(flag.item())
    return None if lowest == 1 << 62 else lowest


def agree_max(value: int, group: Any) -> int:
    """Collective: the largest value any rank of the group proposes (every rank learns it)."""
    proposed = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(proposed, op=dist.ReduceOp.MAX, group=group)
    return int(proposed.item())


def serve(handle: Optional[io.FileIO], size: int, digest: Tuple[str, str], mac: str, target: int,
          group: Any) -> None:
    """Send a copy's file (handle, size bytes, its recorded digest, the job's MAC of it) to target in
    chunks; handle None: the copy cannot be read here, and target is told so (it never waits for
    bytes that will not come). A file shorter than it was sealed is sent zero-filled: the puller's
    digest refuses it."""
    header = torch.zeros(_HEADER_BYTES + 8, dtype=torch.uint8)
    if handle is not None:
        label = f"{digest[0]}:{digest[1]}:{mac}".encode()[:_HEADER_BYTES]
        header[:len(label)] = torch.frombuffer(bytearray(label), dtype=torch.uint8)
        header[_HEADER_BYTES:] = torch.tensor([size], dtype=torch.int64).view(torch.uint8)
    dist.send(header, target, group=group)
    if handle is None:
        return
    buffers = [torch.empty(min(CHUNK_BYTES, size), dtype=torch.uint8) for _ in range(2)]
    in_flight: List[Any] = [None, None]
    for index, start in enumerate(range(0, size, CHUNK_BYTES)):
        length = min(CHUNK_BYTES, size - start)
        slot = index % 2
        if in_flight[slot] is not None:
            in_flight[slot].wait()                 # the buffer's previous chunk has left
        chunk = buffers[slot][:length]
        view = chunk.numpy().data
        filled = 0
        while filled < length:
            got = handle.readinto(view[filled:]) or 0
            if got <= 0:
                chunk[filled:] = 0
                break
            filled += got
        in_flight[slot] = dist.isend(chunk, target, group=group)
    _wait([request for request in in_flight if request is not None])


def pull(server: int, group: Any, allocate: Callable[[int], torch.Tensor],
         authentic: Callable[[int, Tuple[str, str], str], bool]) -> Tuple[Optional[torch.Tensor], str]:
    """(the copy's bytes, "") from server, received into allocate(size) (a uint8 tensor) and
    checked against the digest its manifest records as they arrive, then the MAC sent with them
    (authentic(size, digest, mac)), or (None, "unreadable": the server could not read it; "size":
    an implausible size; "mismatch": the bytes do not match their digest; "mac": no MAC of the
    job's: the server does not hold the job's key)."""
    header = torch.empty(_HEADER_BYTES + 8, dtype=torch.uint8)
    dist.recv(header, server, group=group)
    label = bytes(header[:_HEADER_BYTES].numpy().tobytes()).rstrip(b"\0").decode(errors="replace")
    if not label:
        return None, "unreadable"
    size = int(header[_HEADER_BYTES:].view(torch.int64).item())
    if not plausible_size(size):
        return None, "size"
    algorithm, _, rest = label.partition(":")
    expected, _, mac = rest.partition(":")
    buffer = allocate(size)
    starts = list(range(0, size, CHUNK_BYTES))
    receives: List[Any] = [dist.irecv(buffer[start:start + CHUNK_BYTES], server, group=group) for start in starts[:2]]
    try:
        digest = digests.new(algorithm)
    except ValueError:
        digest = None
    for index, start in enumerate(starts):
        receives[index].wait()
        if index + 2 < len(starts):
            following = starts[index + 2]
            receives.append(dist.irecv(buffer[following:following + CHUNK_BYTES], server, group=group))
        if digest is not None:
            digest.update(buffer[start:start + CHUNK_BYTES].numpy().data)
    if digest is None or digest.hexdigest() != expected:
        return None, "mismatch"
    if not authentic(size, (algorithm, expected), mac):
        return None, "mac"
    return buffer, ""


class ViewReader(io.RawIOBase):
    """A read-only file over a buffer, for torch.load: it reads records straight into their
    storages through readinto (io.BytesIO copies a buffer that is not bytes first)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._position = view.cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, target: Any) -> int:
        count = max(0, min(len(target), len(self._view) - self._position))
        memoryview(target).cast("B")[:count] = self._view[self._position:self._position + count]
        self._position += count
        return count
