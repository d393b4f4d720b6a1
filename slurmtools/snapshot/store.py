"""A node's snapshot store in node memory (the layout and rules are snapshot.py's): a rank saves
its own state and the replicas its peers send it, each sealed as a checkpoint is (a
CheckpointManager per copy directory: staging, manifest last, rename, the two newest kept); the
node's inventory of verified copies feeds snapshot.plan_restore; a copy is read back whole, or
checked where it lies and mapped (open_verified: a restore's own copy).

Only this user's private directory is used (node_beat.own_private_dir: ours, nobody else can
write it): a snapshot another user could plant is never restored. What comes over the wire (a
replica, a pull) is another matter: the store makes and checks its MAC under the job's key
(slurmtools.common.job_secret).
"""
from __future__ import annotations

import io
import mmap
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from slurmtools.checkpoint import digests
from slurmtools.checkpoint.manager import CheckpointManager, open_regular_fd, seal_own_files, verify_dir
from slurmtools.common import job_secret
from slurmtools.errors import CheckpointError
from slurmtools.snapshot.rules import KEEP, SNAPSHOTS_SUBDIR, Copy, own_dir, parse_copy_dir, replica_dir
from slurmtools.train import node_sweep
from slurmtools.train.node_beat import own_private_dir, user_root


Bytes = Union[bytes, memoryview]      # a received replica is a view of the receive buffer
# a job writes its snapshots every few steps; one nobody wrote for a day ended without removing them
STALE_AFTER_S = 24 * 3600.0


class SnapshotStore:
    """The snapshots of one job on this node (every rank of the node uses the same directory)."""

    def __init__(self, node_memory: Path, job_key: str, host: str, mac_key: bytes) -> None:
        """job_key: the job's directory name (snapshot.job_key); mac_key: the job's secret
        (job_secret.read), for the MACs of what goes over the wire."""
        self.root = user_root(node_memory, os.geteuid()) / SNAPSHOTS_SUBDIR / job_key
        self.host = host
        self._mac_key = mac_key

    def mac(self, copy: Copy, size: int, digest: Tuple[str, str]) -> str:
        """The job's MAC of copy with size bytes of that digest, sent along with it."""
        return job_secret.copy_mac(self._mac_key, copy.of_rank, copy.step, copy.world, copy.attempt, size, digest)

    def authentic(self, copy: Copy, size: int, digest: Tuple[str, str], mac: str) -> bool:
        """Whether a copy received (size bytes, the digest computed over them here) came with the
        job's MAC of it: sent by a process that holds the job's key."""
        return job_secret.mac_matches(self._mac_key, mac, copy.of_rank, copy.step, copy.world, copy.attempt, size,
                                      digest)

    def usable(self) -> bool:
        """Whether the job's directory is (or could be made) ours alone."""
        parts = [self.root.parent.parent, self.root.parent, self.root]
        return all(own_private_dir(part) for part in parts)

    def _manager(self, directory: Path) -> CheckpointManager:
        if not self.usable():
            raise CheckpointError(f"{self.root}: not a directory of this user's own (missing, or others can write it)")
        return CheckpointManager(directory, keep=KEEP)

    def save_own(self, rank: int, step: int, files: Mapping[str, Bytes], meta: Optional[Mapping[str, Any]] = None,
                 hashed: Optional[Mapping[str, str]] = None) -> Path:
        """This rank's state at step, sealed; the older ones past the two newest go. hashed: {name:
        hex digest (digests.ALGORITHM)} of files already hashed in memory: not read back to seal."""
        return self._save(own_dir(self.root, rank), step, files, meta, hashed)

    def save_replica(self, of_rank: int, step: int, files: Mapping[str, Bytes],
                     meta: Optional[Mapping[str, Any]] = None, hashed: Optional[Mapping[str, str]] = None) -> Path:
        """A peer's state at step, as it sent it (its MAC checked by the caller), sealed here."""
        return self._save(replica_dir(self.root, of_rank), step, files, meta, hashed)

    def _save(self, directory: Path, step: int, files: Mapping[str, Bytes], meta: Optional[Mapping[str, Any]],
              hashed: Optional[Mapping[str, str]]) -> Path:
        manager = self._manager(directory)
        if manager.final_dir(step).exists():          # a step saved again (a restarted attempt): the new one
            manager.quarantine(manager.final_dir(step), "replaced by a newer save of the same step")
        staging = manager.begin(step)
        for name, data in files.items():
            if not name or "/" in name or name.startswith("."):
                raise CheckpointError(f"snapshot file name {name!r}: one plain name per file")
            (staging / name).write_bytes(data)
        known = {name: (len(files[name]), digest) for name, digest in (hashed or {}).items() if name in files}
        seal_own_files(staging, "snapshot", files, known)
        checkpoint = manager.commit(step, meta)
        for stale in directory.glob("step_*.bad-*"):      # memory is scarce: nothing kept for inspection
            shutil.rmtree(stale, ignore_errors=True)
        return checkpoint.path

    def incoming(self, rank: int, size: int) -> Path:
        """A file of size bytes in the job's directory (ours alone) for what rank pulls: received
        straight into its pages and loaded from them without a copy; the caller removes it."""
        if not self.usable():
            raise CheckpointError(f"{self.root}: not a directory of this user's own (missing, or others can write it)")
        path = incoming_path(self.root, rank)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            # its pages reserved now: a mapped file on a full tmpfs would SIGBUS the rank as the
            # bytes arrive, where a refused reservation is an OSError the caller falls back from
            os.posix_fallocate(fd, 0, size)
        except OSError:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return path

    def remove(self, rank: int, kept_for: List[int]) -> None:
        """This rank's own copies and the replicas it keeps for kept_for: the job is done with them
        (its training completed) and node memory is scarce; the job's directory goes when empty."""
        for directory in [own_dir(self.root, rank)] + [replica_dir(self.root, source) for source in kept_for]:
            shutil.rmtree(directory, ignore_errors=True)
        incoming_path(self.root, rank).unlink(missing_ok=True)    # a pull a crash left behind
        try:
            self.root.rmdir()
        except OSError:
            pass                  # another rank of this node still removes its own

    def sweep_stale(self, now: float, stale_after_s: float = STALE_AFTER_S,
                    live_jobs: Optional[node_sweep.LiveJobs] = None) -> List[str]:
        """Remove this user's other jobs' snapshots on this node that nobody wrote for
        stale_after_s and whose job Slurm no longer lists (a job that crashed or was cancelled
        never finished to remove them; one waiting in the queue after a requeue still needs them)."""
        return node_sweep.sweep(self.root.parent, node_sweep.JOB_KEY_DIR, self.root.name, now, stale_after_s,
                                live_jobs)

    def inventory(self, checksums: bool = True) -> List[Copy]:
        """Every verified copy on this node (own and replicas), newest first per rank."""
        copies: List[Copy] = []
        try:
            names = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir(follow_symlinks=False))
        except OSError:
            return []
        for name in names:
            parsed = parse_copy_dir(name)
            if parsed is None:
                continue
            own, rank = parsed
            for checkpoint in CheckpointManager(self.root / name, keep=KEEP).complete(checksums=checksums):
                world, attempt = checkpoint.manifest.get("world"), checkpoint.manifest.get("attempt")
                copies.append(Copy(rank, checkpoint.step, self.host, own, world if isinstance(world, int) else 0,
                                   attempt if isinstance(attempt, str) else ""))
        return copies

    def _sealed(self, copy: Copy) -> Tuple[Path, Dict[str, Any]]:
        """A copy's directory on this node and its manifest (the seal checked, not the bytes)."""
        directory = (own_dir if copy.own else replica_dir)(self.root, copy.of_rank) / f"step_{copy.step}"
        ok, why, manifest = verify_dir(directory, checksums=False, step=copy.step)
        if not ok:
            raise CheckpointError(f"snapshot {directory}: {why}")
        return directory, manifest

    def locate(self, copy: Copy, name: str) -> Tuple[Path, int, Tuple[str, str]]:
        """Where one file of a copy is, its size and the (algorithm, hex) digest its manifest
        records, for a pull: the holder sends the bytes unread by Python and the puller checks
        them against that digest, which catches a copy spoiled in memory and one spoiled on the wire."""
        directory, manifest = self._sealed(copy)
        info = manifest["files"].get(name)
        recorded = digests.entry_digest(info)
        if not isinstance(info, dict) or recorded is None or not isinstance(info.get("size"), int):
            raise CheckpointError(f"snapshot {directory}: no {name} in its manifest")
        return directory / name, info["size"], recorded

    def read(self, copy: Copy) -> Dict[str, bytes]:
        """The files of a copy on this node, each checked as open_verified checks it, read whole."""
        _, manifest = self._sealed(copy)
        out: Dict[str, bytes] = {}
        for name in manifest["files"]:
            with self.open_verified(copy, name) as handle:
                out[name] = handle.readall()
        return out

    def open_verified(self, copy: Copy, name: str) -> io.FileIO:
        """One file of a copy, open, its bytes checked against the manifest's digest where they lie
        (mapped, not read into this process), for torch.load to map the same pages: a restore
        from node memory copies the state once, into the model. The caller loads it by the open
        file (/proc/self/fd: the file checked is the file loaded) and closes it."""
        path, size, (algorithm, expected) = self.locate(copy, name)
        handle = open_regular(path, size)
        if handle is None:
            raise CheckpointError(f"snapshot {path.parent}: cannot read {name}")
        try:
            digest = digests.new(algorithm)
            if size:
                with mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as pages:
                    digest.update(pages)
            if digest.hexdigest() != expected:
                raise CheckpointError(f"snapshot {path.parent}: checksum mismatch in {name}")
        except (OSError, ValueError) as exc:
            handle.close()
            raise CheckpointError(f"snapshot {path.parent}: cannot read {name}: {exc}") from exc
        except CheckpointError:
            handle.close()
            raise
        return handle


def incoming_path(root: Path, rank: int) -> Path:
    """Where rank's pull lands in the job's directory (one at a time: a new pull starts afresh)."""
    return root / f".incoming-rank{rank}"


def open_regular(path: Path, size: int) -> Optional[io.FileIO]:
    """path opened unbuffered when it is a regular file of exactly size bytes (never a link, FIFO or
    device: a snapshot directory is ours alone, but what a node's memory holds is checked)."""
    try:
        fd = open_regular_fd(path)
    except (OSError, ValueError):
        return None
    try:
        same_size = os.fstat(fd).st_size == size
    except OSError:
        same_size = False
    if not same_size:
        os.close(fd)
        return None
    return io.FileIO(fd, "rb")
