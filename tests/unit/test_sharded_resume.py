"""Sharded integrity for real: 2 gloo ranks save steps 2 (sync) and 4 (async) through
checkpoint_torch; each rank sealed its own shards (two writers' records merged into the
manifest), and after a byte of a rank-1 shard of step 4 flips, both ranks verify their shares,
agree, quarantine step 4 and load step 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from slurmtools.checkpoint import torch_dcp as checkpoint_torch  # noqa: E402
from slurmtools.checkpoint.manager import MANIFEST, CheckpointManager  # noqa: E402
from tests.unit.test_reshard import _free_port, join_with_tiny_model, spawn_ranks  # noqa: E402


def _worker(rank: int, world: int, port: int, ckpt: str, out: str, save: bool) -> None:
    from slurmtools.reference import tiny_model
    cfg, device, model, optim = join_with_tiny_model(rank, world, port)
    try:
        manager = CheckpointManager(ckpt)
        if save:
            for step in range(4):
                tiny_model.train_step(model, optim, step, rank, world, cfg, device)
                if step == 1:
                    checkpoint_torch.save(manager, 2, model, optim)
            saver = checkpoint_torch.AsyncCheckpointer(manager)
            saver.save(4, model, optim)
            saver.close()
        else:
            extra = checkpoint_torch.load_latest(manager, model, optim)
            if rank == 0:
                Path(out).write_text(json.dumps({"step": extra["step"], "path": extra["path"],
                                                 "refused": extra["refused"]}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(ckpt: Path, out: Path, save: bool) -> None:
    spawn_ranks(_worker, 2, _free_port(), str(ckpt), str(out), save)


def test_each_rank_seals_its_shards_and_a_corrupt_newest_is_refused_by_all(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(ckpt, tmp_path / "unused", save=True)
    for step in (2, 4):
        files = json.loads((ckpt / f"step_{step}" / MANIFEST).read_text())["files"]
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(files), files
        assert not (ckpt / f"step_{step}" / ".shard-hashes").exists()
    shard = ckpt / "step_4" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    _run(ckpt, tmp_path / "loaded.json", save=False)
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["step"] == 2 and loaded["path"].endswith("step_2")
    assert loaded["refused"] == [[str(ckpt / "step_4"), "checksum mismatch in __1_0.distcp"]]
    assert [p.name.split(".bad-")[0] for p in ckpt.iterdir() if ".bad-" in p.name] == ["step_4"]
