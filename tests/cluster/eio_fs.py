"""A storage target failing over, for real: a read-only FUSE file system laid over one directory
(a complete checkpoint) whose reads of data files fail with EIO for `window_s` seconds from the
first one, then succeed; the kernel hands each reader the EIO, as a parallel file system's client
does while a storage target fails over. No FUSE library: the kernel's protocol (linux/fuse.h) over
/dev/fuse, the few requests a reader makes.

Run as root inside the mount namespace of the node whose readers it serves (each mini-cluster node
has its own: nsenter --mount=/proc/<slurmd pid>/ns/mnt):

    python eio_fs.py DIR WINDOW_S READY_FILE

It opens DIR before mounting over it (the files are read through that descriptor, under the
mount), writes READY_FILE once mounted, logs each EIO it returns to stderr, and on SIGTERM
detaches the mount and exits.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

IN_HEADER = struct.Struct("<IIQQIIIHH")          # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")               # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")        # fuse_attr (88 bytes)
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 36, 38, 42
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}
FOPEN_DIRECT_IO = 1          # no page cache: every read reaches this server (and its EIO window)
MS_RDONLY, MS_NOSUID, MS_NODEV, MNT_DETACH = 1, 2, 4, 2
UNFAILED = ("MANIFEST.json",)        # the manifest reads fine: the shards' storage target fails over


class Server:
    def __init__(self, root: Path, window_s: float) -> None:
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.window_s = window_s
        self.paths: Dict[int, str] = {1: ""}
        self.ids: Dict[str, int] = {"": 1}
        self.first_read_t: Optional[float] = None
        self.names: Dict[int, str] = {}           # open file handle -> name

    def _stat(self, rel: str) -> os.stat_result:
        return os.fstat(self.root_fd) if not rel else os.stat(rel, dir_fd=self.root_fd, follow_symlinks=False)

    def _attr(self, node: int) -> bytes:
        st = self._stat(self.paths[node])
        return ATTR.pack(node, st.st_size, st.st_blocks, int(st.st_atime), int(st.st_mtime), int(st.st_ctime),
                         0, 0, 0, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, 0, 4096, 0)

    def _node(self, rel: str) -> int:
        if rel not in self.ids:
            self.ids[rel] = len(self.paths) + 1
            self.paths[self.ids[rel]] = rel
        return self.ids[rel]

    def handle(self, opcode: int, node: int, body: bytes) -> Tuple[int, bytes]:
        """(negative errno or 0, reply body) for one request."""
        if opcode == INIT:
            major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
            return 0, struct.pack("<IIIIHHIIHH", 7, min(minor, 31), readahead, 0, 16, 12, 4096, 1, 0, 0) + bytes(32)
        if opcode == LOOKUP:
            name = body.split(b"\0", 1)[0].decode()
            rel = os.path.join(self.paths[node], name) if self.paths[node] else name
            try:
                self._stat(rel)
            except OSError as exc:
                return -(exc.errno or errno.EIO), b""
            child = self._node(rel)
            return 0, struct.pack("<QQQQII", child, 0, 1, 1, 0, 0) + self._attr(child)
        if opcode == GETATTR:
            return 0, struct.pack("<QII", 1, 0, 0) + self._attr(node)
        if opcode == OPEN:
            flags = struct.unpack_from("<I", body)[0]
            if flags & (os.O_WRONLY | os.O_RDWR):
                return -errno.EROFS, b""
            fd = os.open(self.paths[node], os.O_RDONLY, dir_fd=self.root_fd)
            self.names[fd] = os.path.basename(self.paths[node])
            return 0, struct.pack("<QII", fd, FOPEN_DIRECT_IO, 0)
        if opcode == READ:
            fh, offset, size = struct.unpack_from("<QQI", body)
            if self.names.get(fh) not in UNFAILED:
                now = time.monotonic()
                self.first_read_t = self.first_read_t if self.first_read_t is not None else now
                if now - self.first_read_t < self.window_s:
                    print(f"eio_fs: EIO for {self.names.get(fh)} at {now - self.first_read_t:.2f} s",
                          file=sys.stderr, flush=True)
                    return -errno.EIO, b""
            return 0, os.pread(fh, size, offset)
        if opcode == RELEASE:
            fh = struct.unpack_from("<Q", body)[0]
            if self.names.pop(fh, None) is not None:
                os.close(fh)
            return 0, b""
        if opcode in (FLUSH, RELEASEDIR):
            return 0, b""
        if opcode == OPENDIR:
            return 0, struct.pack("<QII", 0, 0, 0)
        if opcode == READDIR:
            return 0, self._readdir(node, *struct.unpack_from("<QQI", body)[1:])
        if opcode == STATFS:
            return 0, struct.pack("<QQQQQIIII", 1 << 20, 0, 0, 1 << 20, 0, 4096, 255, 4096, 0) + bytes(24)
        return -errno.ENOSYS, b""

    def _readdir(self, node: int, offset: int, size: int) -> bytes:
        rel = self.paths[node]
        fd = os.open(rel or ".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root_fd)
        try:
            names: List[str] = sorted(os.listdir(fd))
        finally:
            os.close(fd)
        out = b""
        for index, name in enumerate(names[offset:], start=offset):
            child_rel = os.path.join(rel, name) if rel else name
            kind = 4 if stat.S_ISDIR(self._stat(child_rel).st_mode) else 8
            raw = name.encode()
            entry = struct.pack("<QQII", self._node(child_rel), index + 1, len(raw), kind) + raw
            entry += bytes(-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return out


def main(argv: List[str]) -> int:
    target, window_s, ready = Path(argv[0]), float(argv[1]), Path(argv[2])
    server = Server(target, window_s)
    fuse_fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fuse_fd},rootmode={stat.S_IFDIR:o},user_id=0,group_id=0,allow_other,default_permissions"
    if libc.mount(b"slurmtools-eio", str(target).encode(), b"fuse", MS_RDONLY | MS_NOSUID | MS_NODEV,
                  options.encode()) != 0:
        print(f"eio_fs: mount over {target}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        libc.umount2(str(target).encode(), MNT_DETACH)
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    ready.write_text(str(os.getpid()))
    while True:
        try:
            request = os.read(fuse_fd, 1 << 17)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.ENOENT, errno.EAGAIN):
                continue
            return 0 if exc.errno == errno.ENODEV else 1       # ENODEV: unmounted
        _, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
        if opcode in NO_REPLY:
            continue
        try:
            error, body = server.handle(opcode, node, request[IN_HEADER.size:])
        except OSError as exc:
            error, body = -(exc.errno or errno.EIO), b""
        try:
            os.write(fuse_fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), error, unique) + body)
        except OSError:
            pass          # the request was interrupted
        if opcode == DESTROY:
            return 0


def serve_in_namespace_of(pid: int, directory: Path, window_s: float, log: Path) -> "subprocess.Popen[bytes]":
    """This server over directory in process pid's mount namespace (a mini-cluster node's slurmd:
    its jobs share it), once mounted; stop it with terminate() (the mount goes with it)."""
    ready = log.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    with open(log, "ab") as sink:
        server = subprocess.Popen(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", sys.executable, __file__,
                                   str(directory), str(window_s), str(ready)], stdout=sink, stderr=sink)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"eio_fs over {directory} in {pid}'s namespace did not mount: {log.read_text()[-500:]}")
        time.sleep(0.05)
    return server


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
