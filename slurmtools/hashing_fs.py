"""DCP's file system with the digest of every file computed while it is written, not read back
afterwards: a checkpoint's integrity record costs no second pass over hundreds of GB.

Each file DCP writes goes through a raw stream that hands every written chunk (at most CHUNK_BYTES,
copied: the writer's buffer is reused) to one hashing thread per file, so hashing overlaps the
write and its fsync (the hash releases the GIL for large buffers); close() waits for the digest. A
stream that seeks backwards (a rewrite: not what DCP does) drops its digest, and the file is hashed
from disk by the seal instead, so a digest recorded here is always the file's.
"""
from __future__ import annotations

import io
import os
import queue
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Generator, Optional, Tuple, Union

from torch.distributed.checkpoint.filesystem import FileSystem

from slurmtools import digests

# the largest piece one raw write takes (BufferedWriter loops for the rest) and the pieces queued
# for hashing at once: at most CHUNK_BYTES x (QUEUED_CHUNKS + 1) extra memory per file being written
CHUNK_BYTES = 16 << 20
QUEUED_CHUNKS = 4

Digest = Tuple[int, str]          # (size in bytes, hex digest of digests.ALGORITHM)


class _HashingFileIO(io.FileIO):
    """A raw file whose written bytes are hashed in order by a thread of its own."""

    def __init__(self, path: Union[str, Path], on_digest: Any) -> None:
        super().__init__(path, "wb")
        self._on_digest = on_digest
        self._path = Path(path)
        self._hash = digests.new()
        self._size = 0
        self._valid = True
        self._chunks: "queue.Queue[Optional[bytes]]" = queue.Queue(maxsize=QUEUED_CHUNKS)
        self._hasher = threading.Thread(target=self._consume, name="checkpoint-hash", daemon=True)
        self._hasher.start()

    def _consume(self) -> None:
        while True:
            chunk = self._chunks.get()
            if chunk is None:
                return
            self._hash.update(chunk)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")[:CHUNK_BYTES]
        if self._valid and super().tell() != self._size:
            self._valid = False              # written after a seek: the running hash is not the file's
        written = super().write(view)
        if written:
            self._size += written
            if self._valid:
                self._chunks.put(bytes(view[:written]))
        return written or 0

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            self._chunks.put(None)
            self._hasher.join()
            if self._valid:
                self._on_digest(self._path, (self._size, self._hash.hexdigest()))


class HashingFileSystem(FileSystem):
    """FileSystem for FileSystemWriter (`writer.fs = HashingFileSystem()`): files opened for
    writing are hashed as they are written; digests() gives {file name: (size, digest)}."""

    def __init__(self) -> None:
        super().__init__()
        self._digests: Dict[Path, Digest] = {}
        self._lock = threading.Lock()

    def _record(self, path: Path, digest: Digest) -> None:
        with self._lock:
            self._digests[path] = digest

    @contextmanager
    def create_stream(self, path: Union[str, "os.PathLike[str]"], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with io.BufferedWriter(_HashingFileIO(Path(path), self._record), buffer_size=1 << 20) as stream:
            yield stream

    def rename(self, path: Union[str, "os.PathLike[str]"], new_path: Union[str, "os.PathLike[str]"]) -> None:
        super().rename(path, new_path)
        with self._lock:
            digest = self._digests.pop(Path(path), None)
            if digest is not None:
                self._digests[Path(new_path)] = digest

    def digests(self) -> Dict[str, Digest]:
        with self._lock:
            return {path.name: digest for path, digest in self._digests.items()}
