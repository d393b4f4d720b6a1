"""A Lightning fit's state kept in memory for a recovery in place (slurmtools/integrations/
lightning_memory.py): which copy every rank resumes from, the cadence from the spec's snapshot
settings, and a copy over the memory share not kept."""
from __future__ import annotations

import io
import stat

import pytest

pytest.importorskip("lightning")
import torch  # noqa: E402

from slurmtools.common.control_dir import (NODE_LOCAL_DIR_ENV, SNAPSHOT_EVERY_ENV,  # noqa: E402
                                           SNAPSHOT_MAX_OVERHEAD_ENV, SNAPSHOT_MEMORY_GB_ENV)
from slurmtools.errors import UsageError  # noqa: E402
from slurmtools.integrations.lightning_memory import (NONE_HELD, MemoryCopy, keeps_copy,  # noqa: E402
                                                      resume_choice, write_scratch)


@pytest.mark.parametrize("held, sealed, choice", [
    ([9, NONE_HELD], [8, 8], (9, 0)),                    # a survivor's copy past the checkpoint
    ([NONE_HELD, 9, 9], [8, 8, 8], (9, 1)),              # the lowest rank holding it sends it
    ([9, 10, NONE_HELD], [8, 8, 8], (10, 1)),            # the newest: under DDP every copy is everyone's
    ([8, NONE_HELD], [8, 8], None),                      # the checkpoint as new: read it
    ([9, NONE_HELD], [8, 12], None),                     # a rank sees a newer checkpoint
    ([NONE_HELD, NONE_HELD], [NONE_HELD, NONE_HELD], None),   # a first start
    ([3, NONE_HELD], [NONE_HELD, NONE_HELD], (3, 0)),    # no checkpoint yet
])
def test_every_rank_resumes_from_the_newest_copy_when_it_is_newer_than_the_checkpoint(held, sealed, choice):
    assert resume_choice(held, sealed) == choice


@pytest.mark.parametrize("node_count", [1, 2, 4])
@pytest.mark.parametrize("ranks_per_node", [1, 2, 8])
def test_one_rank_a_node_keeps_a_copy_and_any_one_failure_leaves_one(node_count, ranks_per_node):
    keepers = {(node, local) for node in range(node_count) for local in range(ranks_per_node)
               if keeps_copy(local, node_count)}
    # one a node; a job of one node keeps two, when it has two ranks
    assert len(keepers) == (node_count if node_count > 1 else min(2, ranks_per_node))
    if node_count * ranks_per_node == 1:
        return                   # a job of one rank: nothing survives its loss
    for lost_node in range(node_count):
        assert node_count == 1 or any(node != lost_node for node, _ in keepers)
        for lost_local in range(ranks_per_node):
            assert keepers - {(lost_node, lost_local)}, (lost_node, lost_local)


def test_the_copy_follows_the_specs_snapshot_settings_and_is_off_without_them():
    assert MemoryCopy.from_env({}) is None
    assert MemoryCopy.from_env({SNAPSHOT_EVERY_ENV: "0"}) is None
    copy = MemoryCopy.from_env({SNAPSHOT_EVERY_ENV: "3", SNAPSHOT_MEMORY_GB_ENV: "2", SNAPSHOT_MAX_OVERHEAD_ENV: "0"})
    assert copy is not None and (copy.every_steps, copy.limit_bytes, copy.max_overhead_pct) == (3, 2 * 10**9, 0.0)
    assert [step for step in range(1, 10) if copy.due(step)] == [3, 6, 9]
    with pytest.raises(UsageError, match=SNAPSHOT_EVERY_ENV):
        MemoryCopy.from_env({SNAPSHOT_EVERY_ENV: "often"})


def test_a_kept_copy_loads_back_as_the_dict_and_only_newer_steps_are_due():
    copy = MemoryCopy(every_steps=1, memory_gb=1, max_overhead_pct=0)
    state = {"global_step": 7, "state_dict": {"w": torch.arange(4.0)}}
    copy.keep(7, state, step_s=0.1)
    state["state_dict"]["w"].add_(1)                     # training goes on: the copy does not move
    loaded = torch.load(io.BytesIO(copy.blob), weights_only=True)
    assert copy.step == 7 and loaded["global_step"] == 7 and loaded["state_dict"]["w"].tolist() == [0, 1, 2, 3]
    assert not copy.due(7) and copy.due(8)


def test_a_copy_over_the_memory_share_is_not_kept_and_said_once(capsys):
    copy = MemoryCopy(every_steps=1, memory_gb=1e-5, max_overhead_pct=0)          # 10 kB: 5 kB a copy
    copy.keep(1, {"w": torch.zeros(10)}, step_s=0.1)                               # ~1.5 kB
    copy.keep(2, {"w": torch.zeros(10000)}, step_s=0.1)                            # 40 kB
    copy.keep(3, {"w": torch.zeros(10000)}, step_s=0.1)
    assert copy.step == 1 and torch.load(io.BytesIO(copy.blob), weights_only=True)["w"].numel() == 10
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "not kept in memory" in said[0] and "2x at a copy's peak) is over snapshot_memory_gb (1e-05 GB)" in said[0]


def test_the_stall_spaces_copies_out_by_the_overhead_bound():
    copy = MemoryCopy(every_steps=2, memory_gb=1, max_overhead_pct=1)
    copy.keep(2, {"w": torch.zeros(1000)}, step_s=1e-9)       # any copy is > 1% of a nanosecond step
    assert copy.interval_steps > 2 and copy.interval_steps % 2 == 0


def test_the_agreed_copy_is_a_new_private_file_in_the_nodes_memory_dir_never_a_planted_name(tmp_path):
    victim = tmp_path / "victims-own-file"
    victim.write_bytes(b"mine")
    for name in ("slurmtools-lightning-rank3-step12-.ckpt", "slurmtools-lightning-rank3-step12.ckpt"):
        (tmp_path / name).symlink_to(victim)               # another user's names, planted beforehand
    path = write_scratch({NODE_LOCAL_DIR_ENV: str(tmp_path)}, 3, 12, b"state")
    assert path.parent == tmp_path and path.name.startswith("slurmtools-lightning-rank3-step12-")
    assert path.read_bytes() == b"state" and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert victim.read_bytes() == b"mine"
