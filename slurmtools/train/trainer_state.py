"""The trainer's own state beside the model and optimizer: RNG streams, the data loader's position,
the LR scheduler, the grad scaler and user extras, saved with every checkpoint (sync and async)
and restored exactly on resume.

The protocol is torch's `Stateful` (an object with `state_dict()` and `load_state_dict()`), the one
DCP, LR schedulers, `GradScaler` and torchdata's `StatefulDataLoader` already speak. Each rank
writes its own small file, `trainer-state-<rank>.pt`, into the checkpoint beside its DCP shards;
the file is sealed (hashed) with that rank's shards and listed in the manifest, so a checkpoint is
complete only with every rank's trainer state in it. The file is read back with
`torch.load(weights_only=True)`: a checkpoint on a shared file system is never unpickled.

RNG states are per rank (dropout masks differ per rank); on a different world size (a resume on
fewer nodes) rank r takes the shared parts from rank 0's file and its RNG streams are re-seeded
from (seed, rank, step) by the trainer: the event says so, nothing is silently mixed.
"""
from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple, cast

import torch

STATE_FILE_PREFIX = "trainer-state-"
STATE_FILE_SUFFIX = ".pt"


def state_file_name(rank: int) -> str:
    return f"{STATE_FILE_PREFIX}{rank}{STATE_FILE_SUFFIX}"


class Stateful(Protocol):
    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...


def rng_state() -> Dict[str, Any]:
    """Every RNG stream a trainer draws from: Python's, numpy's global one (when numpy is there),
    torch's CPU generator and each CUDA device's (when CUDA is initialised)."""
    state: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    name, keys, pos, has_gauss, cached = cast(Tuple[str, Any, int, int, float], numpy.random.get_state(legacy=True))
    state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy
        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


class TrainerState:
    """The parts of a trainer's state that are not model or optimizer, under fixed names.

    parts: Stateful objects (scheduler=..., scaler=..., loader=...); extras: plain values the
    trainer wants back (a token count, a best loss), updated in place on restore."""

    def __init__(self, parts: Optional[Mapping[str, Stateful]] = None, extras: Optional[Dict[str, Any]] = None,
                 *, rng: bool = True) -> None:
        self.parts: Dict[str, Stateful] = dict(parts or {})
        self.extras: Dict[str, Any] = extras if extras is not None else {}
        self.rng = rng

    def snapshot(self) -> Dict[str, Any]:
        """A copy of the state now (an async save writes it later, while training moves on)."""
        return {"rng": rng_state() if self.rng else None,
                "parts": {name: copy.deepcopy(part.state_dict()) for name, part in self.parts.items()},
                "extras": copy.deepcopy(self.extras)}

    def restore(self, snapshot: Mapping[str, Any], *, rng: bool = True, skip: Tuple[str, ...] = ()) -> List[str]:
        """Load snapshot into the parts (and the RNG streams when rng); returns the names this
        trainer has that the snapshot lacks (restored from nothing: the trainer reports them).
        skip: names left as they are (a test shows what losing one of them does)."""
        missing = []
        saved_parts = snapshot.get("parts") or {}
        for name, part in self.parts.items():
            if name in skip:
                continue
            if name not in saved_parts:
                missing.append(name)
                continue
            part.load_state_dict(saved_parts[name])
        if "extras" not in skip:
            self.extras.update(snapshot.get("extras") or {})
        if self.rng and "rng" not in skip:
            if rng and snapshot.get("rng") is not None:
                set_rng_state(snapshot["rng"])
            else:
                missing.append("rng")
        return missing


def write(directory: Path, rank: int, snapshot: Mapping[str, Any]) -> str:
    """This rank's trainer-state file in a checkpoint being written; returns its name (the caller
    seals it with the rank's shards)."""
    name = state_file_name(rank)
    torch.save(dict(snapshot), directory / name)
    return name


def read(directory: Path, rank: int) -> Optional[Dict[str, Any]]:
    """Rank's trainer-state file of a (verified) checkpoint, or None when it has none (one
    written before trainer state was saved, or by a trainer that saves none)."""
    path = directory / state_file_name(rank)
    if not path.exists():
        return None
    loaded = torch.load(path, weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: not a trainer-state record")
    return loaded
