"""The whole trainer state: RNG streams, the loader's position and the LR schedule come back
exactly after a resume (sync and async saves), and losing any one of them changes the result."""
from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess

import pytest

torch = pytest.importorskip("torch")
import numpy  # noqa: E402

from slurmtools.checkpoint.manager import MANIFEST  # noqa: E402
from slurmtools.reference.tiny_data import SequenceDataset, warmup_cosine  # noqa: E402
from slurmtools.train import trainer_state  # noqa: E402
from slurmtools.train.resumable_loader import ResumableLoader  # noqa: E402
from slurmtools.train.trainer_state import TrainerState  # noqa: E402
from tests.unit.ranks import rank_argv


def _draws() -> list:
    return [random.random(), float(numpy.random.rand()), float(torch.rand(1))]


def test_rng_state_brings_back_python_numpy_and_torch_streams():
    saved = trainer_state.rng_state()
    first = _draws()
    _draws()
    trainer_state.set_rng_state(saved)
    assert _draws() == first


def _loader(workers: int, rank: int = 0, world: int = 2) -> ResumableLoader:
    return ResumableLoader(SequenceDataset(48, 256, 8, seed=3), batch_size=4, rank=rank, world=world, seed=3,
                           num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_loader_yields_the_batches_an_uninterrupted_one_would_across_epochs(workers):
    whole = _loader(workers)
    expected = [whole.next_batch() for _ in range(14)]       # 6 batches per epoch: crosses two epochs
    whole.close()
    first = _loader(workers)
    taken = [first.next_batch() for _ in range(8)]
    state = first.state_dict()
    first.close()
    assert state == {"epoch": 1, "samples_taken": 16}
    resumed = _loader(workers)
    resumed.load_state_dict(state)
    rest = [resumed.next_batch() for _ in range(6)]
    resumed.close()
    assert all(torch.equal(a, b) for a, b in zip(taken + rest, expected))
    assert not torch.equal(expected[0], expected[6])           # each epoch is shuffled anew


def _rows(batch) -> list:
    return [tuple(row.tolist()) for row in batch]


def test_ranks_take_disjoint_parts_of_a_global_batch_that_is_the_same_at_any_world_size():
    dataset = SequenceDataset(48, 256, 8, seed=3)
    assert torch.equal(dataset[5], dataset[5])
    two = [_rows(_loader(0, rank, 2).next_batch()) for rank in range(2)]
    assert not set(two[0]) & set(two[1])
    one = ResumableLoader(dataset, batch_size=8, rank=0, world=1, seed=3)
    assert _rows(one.next_batch()) == two[0] + two[1]
    state = {"epoch": 0, "samples_taken": 28}                 # 3.5 global batches: resumed from the 4th
    one.load_state_dict(state)
    ranks = [_loader(0, rank, 2) for rank in range(2)]
    for loader in ranks:
        loader.load_state_dict(state)
    assert _rows(one.next_batch()) == _rows(ranks[0].next_batch()) + _rows(ranks[1].next_batch())
    assert one.state_dict() == ranks[0].state_dict() == {"epoch": 0, "samples_taken": 32}


def test_a_smaller_dataset_than_one_global_batch_is_refused_by_name():
    with pytest.raises(ValueError, match=r"dataset of 6 samples is smaller than one global batch \(2 ranks x 4\)"):
        ResumableLoader(SequenceDataset(6, 256, 8, seed=3), batch_size=4, rank=0, world=2, seed=3)


def test_scheduler_scaler_and_extras_round_trip_and_missing_parts_are_named(tmp_path):
    model = torch.nn.Linear(2, 2)
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = warmup_cosine(optim, 2, 10)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(3):
        optim.step()
        schedule.step()
    scaler.scale(torch.ones(1))
    scaler.update(new_scale=77.0)
    state = TrainerState({"scheduler": schedule, "scaler": scaler}, {"tokens_seen": 123})
    trainer_state.write(tmp_path, 0, state.snapshot())
    optim2 = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    schedule2, scaler2 = warmup_cosine(optim2, 2, 10), torch.amp.GradScaler("cpu")
    extras: dict = {}
    other = TrainerState({"scheduler": schedule2, "scaler": scaler2, "loader": _loader(0)}, extras)
    missing = other.restore(trainer_state.read(tmp_path, 0))
    assert missing == ["loader"]
    assert schedule2.last_epoch == 3 and schedule2.get_last_lr() == schedule.get_last_lr()
    assert scaler2.get_scale() == 77.0 and extras == {"tokens_seen": 123}
    assert trainer_state.read(tmp_path, 1) is None


RANK_SCRIPT = """
import datetime, json, shutil, sys, torch.distributed as dist
from pathlib import Path
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
work = Path(sys.argv[1])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
control = TrainingControl(rank=rank)
resumed = []
quiet = lambda record: resumed.append(record["step"]) if record.get("event") == "resumed" else None
hashes = {"whole": train(TrainConfig(steps=12, checkpoint_every=4), control, quiet)["state_sha256"]}
for mode, use_async in (("async", True), ("sync", False)):
    try:
        train(TrainConfig(steps=12, checkpoint_every=4, checkpoint_dir=str(work / mode), fail_at_step=8,
                          async_checkpoint=use_async), control, quiet)
    except RuntimeError:
        pass
    dist.barrier()
    for forget in ("", "rng", "loader", "scheduler"):
        if rank == 0:
            shutil.copytree(work / mode, work / f"{mode}-{forget}")
        dist.barrier()
        final = train(TrainConfig(steps=12, checkpoint_every=4, checkpoint_dir=str(work / f"{mode}-{forget}"),
                                  async_checkpoint=use_async, forget_on_resume=forget), control, quiet)
        hashes[f"{mode}-{forget or 'nothing'}"] = final["state_sha256"]
if rank == 0:
    (work / "hashes.json").write_text(json.dumps(dict(hashes, resumed=resumed)))
dist.barrier()
dist.destroy_process_group()
"""


def test_resumed_runs_end_bit_identical_and_losing_any_one_state_changes_the_hash(tmp_path):
    """Two gloo ranks with dropout, a 2-worker shuffled loader and warmup + cosine: a crash after
    step 8 (async saves: step 8 still in flight, finished as the trainer exits; sync saves: step 8
    committed),
    resumed, ends with the uninterrupted run's hash; resumed without the RNG streams, the loader
    position or the schedule, it does not."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               SLURMTOOLS_ATTEMPT_ID="9.0")
    env.pop("SLURMTOOLS_CONTROL_DIR", None)
    with (tmp_path / "ranks.err").open("w") as err:
        procs = [subprocess.Popen(rank_argv(RANK_SCRIPT, str(tmp_path), fsdp=True), env=dict(env, RANK=str(rank)),
                                  stdout=subprocess.DEVNULL, stderr=err) for rank in range(2)]
        codes = [proc.wait(timeout=300) for proc in procs]
    assert codes == [0, 0], (tmp_path / "ranks.err").read_text()[-3000:]
    hashes = json.loads((tmp_path / "hashes.json").read_text())
    assert hashes.pop("resumed") == [8, 8, 8, 8, 8, 8, 8, 8]
    for mode in ("async", "sync"):
        assert hashes[f"{mode}-nothing"] == hashes["whole"], mode
        for lost in ("rng", "loader", "scheduler"):
            assert hashes[f"{mode}-{lost}"] != hashes["whole"], (mode, lost)
    files = json.loads((tmp_path / "sync" / "step_4" / MANIFEST).read_text())["files"]
    assert {"trainer-state-0.pt", "trainer-state-1.pt"} <= set(files)


@pytest.mark.parametrize("state, problem", [
    ({"epoch": 0, "samples_taken": -4}, "samples_taken -4 is not a whole number from 0 to 48"),
    ({"epoch": 0, "samples_taken": 10 ** 6}, "samples_taken 1000000 is not a whole number from 0 to 48"),
    ({"epoch": 0, "samples_taken": "16"}, "samples_taken '16' is not a whole number"),
    ({"epoch": 10 ** 30, "samples_taken": 0}, "epoch 1000000000000000000000000000000 is not a whole number"),
    ({"epoch": -1, "samples_taken": 0}, "epoch -1 is not a whole number"),
    ({"samples_taken": 0}, "epoch None is not a whole number"),
])
def test_a_loader_state_that_is_no_state_of_this_dataset_is_refused_by_name(state, problem):
    loader = _loader(0)
    with pytest.raises(ValueError, match=re.escape(f"loader state: {problem}")):
        loader.load_state_dict(state)
    assert loader.state_dict() == {"epoch": 0, "samples_taken": 0}       # nothing changed


@pytest.mark.parametrize("rank, world, batch_size", [(2, 2, 4), (-1, 2, 4), (0, 0, 4), (0, 2, 0)])
def test_a_rank_outside_its_world_or_an_empty_batch_is_refused(rank, world, batch_size):
    with pytest.raises(ValueError, match="needs world >= 1, batch size >= 1 and 0 <= rank < world"):
        ResumableLoader(SequenceDataset(48, 256, 8, seed=3), batch_size=batch_size, rank=rank, world=world, seed=3)
