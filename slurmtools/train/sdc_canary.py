"""The silent-data-corruption canary of a training loop: every rank's digest of one fixed batch's
forward pass on the current weights, compared across ranks (slurmtools.train.sdc decides), with the
device canary as tie-breaker when there is no majority."""
from __future__ import annotations

import hashlib
import socket
from typing import Any, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from slurmtools.preflight import canary as preflight_canary
from slurmtools.preflight import judge as preflight_judge
from slurmtools.train import sdc


def reference_digest(model: nn.Module, tokens: torch.Tensor, corrupt: bool = False) -> str:
    """sha256 of the logits and loss of one fixed batch (the same on every rank) on the current
    weights; a forward pass without gradients or dropout (collective: FSDP gathers the weights;
    eval mode: the check draws no random numbers, so it leaves training's RNG streams alone)."""
    training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits, tokens[:, 1:].reshape(-1))
    model.train(training)
    if corrupt:
        logits = logits.clone()
        logits.view(-1)[0] += 1e-3
    digest = hashlib.sha256(logits.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digest.update(loss.detach().cpu().reshape(1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def canary(model: nn.Module, tokens: torch.Tensor, device: torch.device, step: int,
           corrupt: bool) -> Optional[sdc.Verdict]:
    """Every rank's reference digest, all-gathered; the verdict when they do not all agree. Without
    a majority every rank also runs the device canary (a float64 reference) to say which side is
    wrong (corrupt: the test-only fault makes this rank's device wrong there too, as a GPU's would)."""
    vote = sdc.Vote(dist.get_rank(), socket.gethostname(), reference_digest(model, tokens, corrupt))
    votes: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(votes, vote)
    found = sdc.verdict(votes, step)
    if found is None or found.odd_ranks:
        return found
    kind = "cuda" if device.type == "cuda" else "cpu"
    shape = preflight_canary.SHAPES[kind]
    mine = preflight_canary.run_on(str(device), shape, fault=corrupt, rank=dist.get_rank())
    results: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(results, mine)
    findings = preflight_judge.judge_canary(results, shape.size, shape.chain, preflight_canary.DTYPE)
    return sdc.by_reference(found, votes, [finding.node for finding in findings if finding.node])
