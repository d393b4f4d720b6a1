"""Resharding on load, for real: a checkpoint saved by 4 ranks (FSDP2 + DCP through
checkpoint_torch) loads on 2 and on 6 ranks with every parameter and optimizer tensor
bit-identical, right after the load. This is what lets a job go on with fewer nodes (or more).
Ranks are local processes over gloo on CPU."""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from slurmtools.checkpoint import torch_dcp as checkpoint_torch
from slurmtools.checkpoint.manager import CheckpointManager  # noqa: E402
from slurmtools.common.leave import leave_without_teardown  # noqa: E402
from slurmtools.reference import state_digest  # noqa: E402

STEPS = 3


def _free_port() -> int:
    """A free port below Linux's ephemeral range (32768+): an ephemeral one, free when asked, may be
    taken by any outgoing connection before rank 0's store binds it (seen once in a full run)."""
    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


def _flatten(prefix, obj, out):
    if isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _flatten(f"{prefix}.{key}", obj[key], out)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            _flatten(f"{prefix}.{index}", value, out)
    else:
        out[prefix] = obj.clone() if isinstance(obj, torch.Tensor) else obj
    return out


def join_with_tiny_model(rank: int, world: int, port: int):
    """This process as gloo rank `rank` of `world`, with the tiny FSDP model and its optimizer
    (cfg, device, model, optim); the caller destroys the process group."""
    from slurmtools.reference import tiny_model
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = tiny_model.TrainConfig()
    device = torch.device("cpu")
    return (cfg, device, *tiny_model.build(cfg, world, device))


def spawn_ranks(worker, world: int, *args) -> None:
    """worker(rank, world, *args) in `world` spawned processes, each left without interpreter
    finalization once its worker returned: FSDP2 keeps the gloo group alive past
    destroy_process_group, and its C++ teardown at exit aborted a rank whose peer had left first
    ("terminate called without an active exception", SIGABRT: seen in a full run;
    slurmtools/common/leave.py). A worker's error reaches the caller as before."""
    mp.start_processes(_leaving_after, args=(worker, world, *args), nprocs=world, start_method="spawn", join=True)


def _leaving_after(rank: int, worker, world: int, *args) -> None:
    worker(rank, world, *args)
    leave_without_teardown(0)


def _worker(rank: int, world: int, port: int, ckpt: str, out: str, save: bool) -> None:
    from slurmtools.reference import tiny_model
    cfg, device, model, optim = join_with_tiny_model(rank, world, port)
    try:
        manager = CheckpointManager(ckpt)
        if save:
            for step in range(STEPS):
                tiny_model.train_step(model, optim, step, rank, world, cfg, device)
            checkpoint_torch.save(manager, STEPS, model, optim)
        else:
            extra = checkpoint_torch.load_latest(manager, model, optim)
            assert extra is not None and int(extra["step"]) == STEPS
        msd, osd = state_digest.full_state(model, optim)
        if rank == 0:
            torch.save(_flatten("", {"model": msd, "optim": osd}, {}), out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, ckpt: Path, out: Path, save: bool) -> dict:
    spawn_ranks(_worker, world, _free_port(), str(ckpt), str(out), save)
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def saved_at_four(tmp_path_factory):
    work = tmp_path_factory.mktemp("reshard")
    return work, _run(4, work / "ckpt", work / "saved.pt", save=True)


@pytest.mark.parametrize("world", [2, 6])
def test_a_checkpoint_of_4_ranks_loads_bit_identical_on(world, saved_at_four):
    work, saved = saved_at_four
    loaded = _run(world, work / "ckpt", work / f"loaded-{world}.pt", save=False)
    assert sorted(loaded) == sorted(saved)
    assert any(key.startswith(".optim.state") for key in saved)       # Adam's moments, not just weights
    for key, value in saved.items():
        other = loaded[key]
        if isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and other.shape == value.shape, key
            assert torch.equal(other.view(-1).view(torch.uint8), value.view(-1).view(torch.uint8)), key
        else:
            assert other == value, key
