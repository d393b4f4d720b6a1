"""One number for "the same training state": sha256 over the full (unsharded) model and optimizer
state, what the recovery tests compare between an interrupted and an uninterrupted run."""
from __future__ import annotations

import hashlib
from typing import Any, Dict

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict


def full_state(model: nn.Module, optim: torch.optim.Optimizer) -> "tuple[Dict[str, Any], Dict[str, Any]]":
    """The unsharded model and optimizer state on the CPU (collective)."""
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return msd, osd


def state_hash(model: nn.Module, optim: torch.optim.Optimizer) -> str:
    """sha256 over the full (unsharded) model + optimizer state, in key order; collective."""
    msd, osd = full_state(model, optim)
    digest = hashlib.sha256()

    def feed(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key in sorted(obj, key=str):
                feed(f"{prefix}.{key}", obj[key])
        elif isinstance(obj, (list, tuple)):
            for index, value in enumerate(obj):
                feed(f"{prefix}.{index}", value)
        elif isinstance(obj, torch.Tensor):
            digest.update(prefix.encode())
            digest.update(obj.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{prefix}={obj!r}".encode())

    feed("model", msd)
    feed("optim", osd)
    return digest.hexdigest()
