"""A shuffled, rank-sharded, multi-worker data loader whose position is part of the checkpoint.

Why not the sampler's own counter: a multi-worker DataLoader draws indices ahead of the batches
the trainer has taken (prefetch_factor x num_workers batches), so a sampler's position is ahead
of training. The position saved here is what the trainer consumed: the epoch and the samples
taken in it by all ranks together. On resume the epoch's permutation (seeded by seed and epoch
alone) is rebuilt and the batches already taken are skipped, so the trainer sees exactly the
batches an uninterrupted run would have. The permutation is cut into global batches and rank r
takes the r-th part of each, so a global batch holds the same samples at any world size (a
resume on fewer nodes continues from the same sample, rounded down to its global batch) (the same documented rule as torchdata's StatefulDataLoader:
per-sample randomness must come from the sample index and epoch, not from a worker's RNG,
because after a resume batch k may be built by another worker).

Loader workers ignore Slurm's warning and stop signals (SIGTERM, SIGUSR1, SIGUSR2): Slurm signals
every process of a step, and a worker killed by one makes the trainer raise "DataLoader worker
exited unexpectedly" (from torch's SIGCHLD handler, at any point, a checkpoint save included)
before it can checkpoint. The workers end when told (close(), also at interpreter exit: before
multiprocessing's own exit hook, which would SIGTERM them and wait for ever), when their trainer
dies (they watch their parent), or with the step's SIGKILL.
"""
from __future__ import annotations

import atexit
import signal
import weakref
from typing import Any, Dict, Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

# the signals a loader worker ignores (runtime.CHECKPOINT_SIGNALS: the trainer's to handle)
WORKER_IGNORED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def quiet_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: leave Slurm's signals to the trainer (see the module's doc)."""
    for sig in WORKER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


_OPEN_LOADERS: "weakref.WeakSet[ResumableLoader]" = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    """Registered after torch's and multiprocessing's exit hooks, so it runs before them (atexit
    runs last-registered first): workers are stopped through their queues while torch still can."""
    for loader in list(_OPEN_LOADERS):
        loader.close()


MAX_EPOCH = 1 << 31          # a loader state past it is no state this loader saved


class EpochShardSampler(Sampler[int]):
    """Rank `rank`'s share of a permutation of range(size) that depends only on (seed, epoch):
    of each global batch (world x batch_size samples) its rank-th part, from batch
    `skip_batches` of the epoch on."""

    def __init__(self, size: int, rank: int, world: int, seed: int, batch_size: int) -> None:
        if world < 1 or batch_size < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} of world {world} with batch size {batch_size}: needs world >= 1, "
                             f"batch size >= 1 and 0 <= rank < world (else another rank's shard)")
        if size < world * batch_size:
            raise ValueError(f"dataset of {size} samples is smaller than one global batch "
                             f"({world} ranks x {batch_size})")
        self.size, self.rank, self.world, self.seed, self.batch_size = size, rank, world, seed, batch_size
        self.epoch = 0
        self.skip_batches = 0

    def batches_per_epoch(self) -> int:
        return self.size // (self.world * self.batch_size)

    def __len__(self) -> int:
        return (self.batches_per_epoch() - self.skip_batches) * self.batch_size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator)
        batches = self.batches_per_epoch()
        global_batches = order[:batches * self.world * self.batch_size].view(batches, self.world, self.batch_size)
        return iter(global_batches[self.skip_batches:, self.rank].reshape(-1).tolist())


class ResumableLoader:
    """Batches for one rank, forever (epoch after epoch); a torch `Stateful` (state_dict /
    load_state_dict) holding the epoch and the samples all ranks took in it."""

    def __init__(self, dataset: "Dataset[Any]", *, batch_size: int, rank: int, world: int, seed: int,
                 num_workers: int = 0) -> None:
        size = len(dataset)  # type: ignore[arg-type]
        self.dataset = dataset
        self.sampler = EpochShardSampler(size, rank, world, seed, batch_size)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.world = world
        self.seed = seed
        self.epoch = 0
        self.batches_taken = 0
        self._batches: Optional[Iterator[Any]] = None
        _OPEN_LOADERS.add(self)

    def _open(self) -> Iterator[Any]:
        self.sampler.epoch, self.sampler.skip_batches = self.epoch, self.batches_taken
        # the loader's own generator: worker seeds follow (seed, epoch), never the trainer's RNG
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.sampler, drop_last=True,
                            num_workers=self.num_workers, generator=generator,
                            worker_init_fn=quiet_worker if self.num_workers else None)
        return iter(loader)

    def next_batch(self) -> Any:
        while True:
            if self._batches is None:
                self._batches = self._open()
            try:
                batch = next(self._batches)
            except StopIteration:
                self._batches = None
                self.epoch, self.batches_taken = self.epoch + 1, 0
                continue
            self.batches_taken += 1
            return batch

    def close(self) -> None:
        """Stop the workers of the epoch in progress."""
        self._batches = None

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "samples_taken": self.batches_taken * self.batch_size * self.world}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """The epoch and samples taken a checkpoint saved (at any world size: a count that is not a
        whole number of this world's global batches resumes at the next one); a value that is no
        whole number from 0 to the dataset's samples (a negative count; one past the dataset:
        silently another epoch) or an epoch past MAX_EPOCH is a ValueError naming it, before
        anything changes."""
        epoch, taken = state_dict.get("epoch"), state_dict.get("samples_taken")
        if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"loader state: epoch {epoch!r} is not a whole number from 0 to {MAX_EPOCH}")
        if type(taken) is not int or not 0 <= taken <= self.sampler.size:
            raise ValueError(f"loader state: samples_taken {taken!r} is not a whole number from 0 to "
                             f"{self.sampler.size} (the dataset's samples)")
        self.close()
        self.epoch = epoch
        # a larger world's last batches past this world's epoch: the epoch is done
        self.batches_taken = min(taken // (self.batch_size * self.world), self.sampler.batches_per_epoch())
