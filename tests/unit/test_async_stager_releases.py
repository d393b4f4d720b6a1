"""The reference trainer's default async checkpoint crashed at its second save on a real GPU (issue
47: torch 2.11, `KeyError: <class 'type'>` in DCP's staging): 2.11's DefaultStager closes its
copier at the end of every staging (its type dispatch table emptied), and the checkpointer reused
one stager across saves. Here torch 2.13 on CPU is made to stage as 2.11 does (the close it
added, nothing else): without the mend the second save's staging raises that KeyError; with it
both saves commit. And any error of a save's pipeline fails that save, never training."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from slurmtools.checkpoint import torch_dcp as checkpoint_torch  # noqa: E402
from slurmtools.checkpoint.manager import CheckpointManager  # noqa: E402
from tests.unit.test_reshard import _free_port, join_with_tiny_model, spawn_ranks  # noqa: E402


def _as_torch_2_11() -> None:
    """DefaultStager._stage as torch 2.11 has it: the StateDictStager closed after each staging."""
    from torch.distributed.checkpoint.staging import DefaultStager
    original = DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):
        staged = original(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged
    DefaultStager._stage = stage_then_close


def _worker(rank: int, world: int, port: int, ckpt: str, out: str, broken_copy: bool) -> None:
    from slurmtools.reference import tiny_model
    _as_torch_2_11()
    cfg, device, model, optim = join_with_tiny_model(rank, world, port)
    try:
        saver = checkpoint_torch.AsyncCheckpointer(CheckpointManager(ckpt))
        if broken_copy:                     # every copier fails outright: the save fails, not training
            from torch.distributed.checkpoint._state_dict_stager import StateDictStager
            StateDictStager.deepcopy_with_tensor_offload = _raise
        for step in range(1, 4):
            tiny_model.train_step(model, optim, step, rank, world, cfg, device, before_update=saver.wait_staged)
            saver.save(step, model, optim)
        saver.close()
        if rank == 0:
            Path(out).write_text(json.dumps({"failures": saver.take_failures()}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _raise(*args, **kwargs):
    raise KeyError(type)


@pytest.mark.parametrize("broken_copy", [False, True], ids=["closing-stager", "failing-copy"])
def test_async_saves_go_on_with_a_stager_that_closes_after_each_staging(tmp_path, broken_copy):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.json"
    spawn_ranks(_worker, 2, _free_port(), str(ckpt), str(out), broken_copy)
    failures = json.loads(out.read_text())["failures"]
    if broken_copy:
        assert [step for step, _ in failures] == [1, 2, 3] and all("KeyError" in why for _, why in failures)
        assert CheckpointManager(str(ckpt)).latest() is None
    else:
        assert failures == []
        assert CheckpointManager(str(ckpt)).latest().step == 3
