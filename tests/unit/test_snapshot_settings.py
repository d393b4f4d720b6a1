"""The snapshot settings a rank reads from its environment (issue 51, bad input): a value that is
no number in the spec's range is one line naming the variable, never a traceback; a share of
training time too small to represent spaces snapshots out as far as they go, never divides by 0."""
import pytest

from slurmtools.common.control_dir import SNAPSHOT_EVERY_ENV, SNAPSHOT_MAX_OVERHEAD_ENV, SNAPSHOT_MEMORY_GB_ENV
from slurmtools.errors import UsageError
from slurmtools.snapshot.rules import (DEFAULT_MAX_OVERHEAD_PCT, DEFAULT_MEMORY_GB, MAX_INTERVAL_STEPS, interval_for,
                                       settings_from_env)
from tests.unit.ranks import rank_argv

NAMES = (SNAPSHOT_EVERY_ENV, SNAPSHOT_MEMORY_GB_ENV, SNAPSHOT_MAX_OVERHEAD_ENV)


def read(**env):
    return settings_from_env(env, *NAMES)


def test_unset_is_off_with_the_defaults_and_set_values_are_read():
    assert read() == (0, DEFAULT_MEMORY_GB, DEFAULT_MAX_OVERHEAD_PCT)
    assert read(SLURMTOOLS_SNAPSHOT_EVERY="20", SLURMTOOLS_SNAPSHOT_MEMORY_GB="1.5",
                SLURMTOOLS_SNAPSHOT_MAX_OVERHEAD_PCT="0") == (20, 1.5, 0.0)


@pytest.mark.parametrize("name, value, message", [
    (SNAPSHOT_EVERY_ENV, "abc", "SLURMTOOLS_SNAPSHOT_EVERY='abc': expected a whole number from 0 to 1e+09"),
    (SNAPSHOT_EVERY_ENV, "1e3", "SLURMTOOLS_SNAPSHOT_EVERY='1e3': expected a whole number from 0 to 1e+09"),
    (SNAPSHOT_EVERY_ENV, "-1", "SLURMTOOLS_SNAPSHOT_EVERY='-1': expected a whole number from 0 to 1e+09"),
    (SNAPSHOT_MEMORY_GB_ENV, "8GB", "SLURMTOOLS_SNAPSHOT_MEMORY_GB='8GB': expected a number from 0.001 to 100000"),
    (SNAPSHOT_MEMORY_GB_ENV, "nan", "SLURMTOOLS_SNAPSHOT_MEMORY_GB='nan': expected a number from 0.001 to 100000"),
    (SNAPSHOT_MEMORY_GB_ENV, "inf", "SLURMTOOLS_SNAPSHOT_MEMORY_GB='inf': expected a number from 0.001 to 100000"),
    (SNAPSHOT_MAX_OVERHEAD_ENV, "1%", "SLURMTOOLS_SNAPSHOT_MAX_OVERHEAD_PCT='1%': expected a number from 0 to 100"),
])
def test_a_bad_value_is_one_line_naming_the_variable(name, value, message):
    with pytest.raises(UsageError) as caught:
        read(**{name: value})
    assert str(caught.value) == message


def test_a_share_too_small_to_represent_spaces_snapshots_as_far_as_they_go():
    assert interval_for(2.0, 0.5, 10, 1e-320) == MAX_INTERVAL_STEPS
    assert interval_for(2.0, 0.5, 10, 5e-324) == MAX_INTERVAL_STEPS
    assert interval_for(2.0, 0.5, 10, 1.0) == 400          # 2 s stall, 1% of 0.5-s steps: every 400 steps


def test_a_peer_announcing_an_implausible_size_is_refused_before_anything_is_allocated():
    """A pull header or a replica size of -5 or 2**50 bytes raised from torch.empty; now the
    copy is refused (the restore falls back to the checkpoint) or the snapshot is not kept."""
    from slurmtools.snapshot.wire import MAX_PEER_BYTES, plausible_size
    assert plausible_size(0) and plausible_size(8 << 30) and plausible_size(MAX_PEER_BYTES)
    assert not plausible_size(-5) and not plausible_size(2 ** 50) and not plausible_size(-(2 ** 63))


HOSTILE_SERVER = r"""
import datetime, os, sys, torch, torch.distributed as dist
from slurmtools.snapshot import wire as snapshot_wire
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
if dist.get_rank() == 0:        # a hostile peer: a header with a label and a size of -5 (or 2**50)
    header = torch.zeros(snapshot_wire._HEADER_BYTES + 8, dtype=torch.uint8)
    label = b"xxh3:00"
    header[:len(label)] = torch.frombuffer(bytearray(label), dtype=torch.uint8)
    header[snapshot_wire._HEADER_BYTES:] = torch.tensor([int(sys.argv[1])], dtype=torch.int64).view(torch.uint8)
    dist.send(header, 1)
else:
    buffer, why = snapshot_wire.pull(0, None, lambda size: torch.empty(size, dtype=torch.uint8), lambda *_: True)
    print("PULLED", buffer is None, why, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("size", [-5, 2 ** 50])
def test_a_pull_from_a_peer_announcing_an_implausible_size_is_refused_on_real_gloo_ranks(tmp_path, size):
    import os
    import subprocess
    import sys

    from tests.unit.test_flight_recorder import _free_port
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    ranks = [subprocess.Popen(rank_argv(HOSTILE_SERVER, str(size)), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outs
    assert "PULLED True size" in outs[1][0]


def test_no_peer_bytes_are_unpickled_anywhere_in_the_snapshot_path():
    """all_gather_object / broadcast_object_list pickle.loads a peer's bytes: code execution as the
    job's user for any process that joined the job's transport (issue 51, finding 8). The snapshot
    modules exchange JSON (snapshot_wire.gather_json) and tensors only."""
    import re
    from pathlib import Path
    import slurmtools
    paths = sorted((Path(slurmtools.__file__).parent / "snapshot").glob("*.py"))
    assert {path.name for path in paths} >= {"rules.py", "fsdp.py", "store.py", "torch_state.py", "wire.py"}
    for path in paths:
        name = path.name
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        code = re.sub(r'"""[\s\S]*?"""', "", code)          # docstrings may name what is not used
        assert not re.search(r"all_gather_object|broadcast_object_list|gather_object|scatter_object_list|"
                             r"pickle\.loads?|import pickle", code), name


def test_a_peers_json_that_is_not_json_of_ours_is_a_checkpoint_error():
    from slurmtools.errors import CheckpointError
    from slurmtools.snapshot.wire import _parsed
    assert _parsed(b'{"a": [1, 2]}') == {"a": [1, 2]}
    for raw in (b"\x80\x04cos\nsystem\n", b"NaN", b'{"a": Infinity}', b"[" * 100000 + b"]" * 100000):
        with pytest.raises(CheckpointError, match="a rank sent what is no JSON of ours"):
            _parsed(raw)


ONE_RANK_SESSION = r"""
import os, pathlib, sys, torch.distributed as dist
from slurmtools.snapshot import fsdp as snapshot_fsdp
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
control = pathlib.Path(sys.argv[2]) if sys.argv[2] else None
session = snapshot_fsdp.Session.open(5, control, "9.0", dict(os.environ, SLURM_JOB_ID="9"))
print("SESSION", session is not None, flush=True)
dist.destroy_process_group()
"""


def _open_session(tmp_path, control: str):
    import os
    import subprocess
    import sys
    memory = tmp_path / "memory"
    memory.mkdir(exist_ok=True)
    done = subprocess.run(rank_argv(ONE_RANK_SESSION, str(tmp_path / "rendezvous"), control),
                          env=dict(os.environ, SLURMTOOLS_NODE_LOCAL_DIR=str(memory)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    return done.stdout.split("SESSION ")[-1].strip(), [line for line in done.stderr.splitlines() if "slurmtools" in line]


def test_snapshots_need_the_jobs_key_and_say_so_in_one_line_when_there_is_none(tmp_path):
    """The replicas' MAC needs the job's key, kept in the control dir: without one (no supervisor,
    no SLURMTOOLS_CONTROL_DIR) snapshots are off, said once; with one, rank 0 makes the key; a key
    others can read turns them off on the rank that finds it so."""
    pytest.importorskip("torch")
    assert _open_session(tmp_path, "") == ("False", [
        "slurmtools: snapshots off: no control dir (the job's key, which authenticates replicas, is kept there): run "
        "under `slurmtools run` or set SLURMTOOLS_CONTROL_DIR"])
    control = tmp_path / "control"
    control.mkdir()
    assert _open_session(tmp_path, str(control)) == ("True", [])
    assert (control / "job.key").stat().st_mode & 0o777 == 0o600
    (control / "job.key").chmod(0o640)
    assert _open_session(tmp_path, str(control)) == ("False", [
        f"slurmtools: rank 0: snapshots off: job key {control}/job.key: not this user's alone (owner uid "
        f"{(control / 'job.key').stat().st_uid}, mode 0640)"])
