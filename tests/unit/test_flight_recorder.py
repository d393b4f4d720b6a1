"""Collective hangs attributed by the flight recorder: the parser on dumps in torch's format
(version 2.10: entries with pg_id, collective_seq_id, profiling_name, state), the restricted
unpickler, and for real: three gloo ranks of the tiny trainer, one of which never enters the
step's loss all-reduce, dump on request and the dumps name that rank."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import time
from pathlib import Path

import pytest

from slurmtools.common.control_dir import FLIGHT_RECORDER_REQUEST_FILE, flight_recorder_prefix
from slurmtools.common.ledger import Cause
from slurmtools.requeue import flightrec, watchdog
from slurmtools.requeue.policy import Evidence, classify
from slurmtools.train import fr_dump, node_beat
from tests.unit.ranks import rank_argv

HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def entry(seq, name="nccl:all_reduce", pg=0, state="completed", p2p=False):
    return {"record_id": seq, "pg_id": pg, "process_group": (str(pg), "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": 1, "input_sizes": [[10]],
            "output_sizes": [[10]], "state": state, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": p2p, "frames": []}


def laggard(dumps, hosts):
    """flightrec.laggard over full dumps, each reduced as a rank reduces its own."""
    return flightrec.laggard({rank: fr_dump.reduce(one) for rank, one in dumps.items()}, hosts)


def dump(*entries):
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {}, "entries": list(entries)}


def test_the_rank_that_never_entered_the_collective_is_named_with_its_node():
    waiting = dump(entry(41), entry(42, "nccl:all_gather"), entry(43, "nccl:reduce_scatter", state="started"))
    behind = dump(entry(41), entry(42, "nccl:all_gather"))
    found = laggard({0: waiting, 1: waiting, 2: behind, 3: waiting}, HOSTS)
    assert (found.rank, found.host, found.collective, found.seq, found.group, found.waiting) == (
        2, "node2", "nccl:reduce_scatter", 43, "0", (0, 1, 3))
    assert found.detail == ("rank 2 on node2 never entered nccl:reduce_scatter #43 of process group 0 that "
                            "ranks 0,1,3 wait in (flight recorder)")


def test_no_single_laggard_names_nobody():
    same = dump(entry(7), entry(8))
    assert laggard({0: same, 1: same, 2: same}, HOSTS) is None             # a true deadlock
    two_behind = dump(entry(7))
    assert laggard({0: same, 1: two_behind, 2: two_behind}, HOSTS) is None
    assert laggard({0: same}, HOSTS) is None                                 # one dump compares nothing


def test_p2p_entries_and_other_groups_do_not_confuse_it():
    # rank 1 is behind only in group 1 (a sub-group rank 2 is not in); p2p entries are ignored
    ahead = dump(entry(5), entry(3, pg=1), entry(99, "nccl:send", p2p=True))
    behind = dump(entry(5), entry(2, pg=1))
    other = dump(entry(5))
    found = laggard({0: ahead, 1: behind, 2: other}, HOSTS)
    assert (found.rank, found.group, found.seq, found.waiting) == (1, "1", 3, (0,))


def test_dumps_are_read_without_running_any_code_and_bad_files_are_skipped(tmp_path):
    (tmp_path / "rank_0").write_bytes(pickle.dumps(dump(entry(1))))
    (tmp_path / "rank_1").write_bytes(pickle.dumps(os.system))                         # a class reference
    (tmp_path / "rank_2").write_bytes(b"\x80\x04torn")
    (tmp_path / "rank_3").write_bytes(pickle.dumps({"entries": "not a list"}))
    (tmp_path / "notes.txt").write_bytes(pickle.dumps(dump()))
    (tmp_path / "rank_4").symlink_to(tmp_path / "rank_0")
    assert flightrec.read_reduced(tmp_path) == {0: {"0": (1, "nccl:all_reduce", "completed")}}
    assert flightrec.read_reduced(tmp_path / "absent") == {}


def test_the_flight_recorder_account_becomes_the_diagnosis():
    hang = classify(Evidence(exit_code=None, hang_detected=True, hang_rank=2, hang_node="node2",
                             hang_detail="rank 2 on node2 never entered gloo:all_reduce #9 ..."))
    assert (hang.cause, hang.node, hang.fatal_for_node) == (Cause.HANG, "node2", True)
    assert hang.detail.startswith("rank 2 on node2 never entered")
    timeout = classify(Evidence(exit_code=1, log_tail="Watchdog caught collective operation timeout host=node1",
                                collective_laggard_node="node2", collective_laggard_detail="rank 2 on node2 ..."))
    assert (timeout.cause, timeout.node, timeout.detail) == (
        Cause.COLLECTIVE_TIMEOUT, "node2", "collective timeout: rank 2 on node2 ...")


RANK_SCRIPT = """
import datetime, os, torch.distributed as dist
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
train(TrainConfig(steps=10, skip_collective_at="2:3"), TrainingControl(rank=dist.get_rank()), log=lambda r: None)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("per_node", [False, True], ids=["per-rank", "gathered-per-node"])
def test_real_gloo_ranks_dump_on_request_and_name_the_one_that_skipped(tmp_path, per_node):
    """Each rank reduces its own dump; with a local rank (one node of three ranks) local rank 0
    gathers them into one node file, and no rank writes a file of its own in the control dir."""
    pytest.importorskip("torch")
    control = tmp_path / "control"
    port = _free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3",
               SLURMTOOLS_CONTROL_DIR=str(control), SLURMTOOLS_ATTEMPT_ID="5.0", TORCH_FR_BUFFER_SIZE="2000")
    for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
        env.pop(name, None)
    errors = tmp_path / "ranks.err"
    with errors.open("w") as err:
        procs = [subprocess.Popen(rank_argv(RANK_SCRIPT, fsdp=True),
                                  env=dict(env, RANK=str(rank), **({"LOCAL_RANK": str(rank)} if per_node else {})),
                                  stdout=subprocess.DEVNULL, stderr=err) for rank in range(3)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:       # every rank announced step 2, the step rank 2 skips out of
            beats = watchdog.read_heartbeats(control)
            if len(beats) == 3 and all(beat.step == 2 for beat in beats):
                break
            assert all(proc.poll() is None for proc in procs), errors.read_text()
            time.sleep(0.2)
        else:
            pytest.fail(f"the ranks never reached step 2: {watchdog.read_heartbeats(control)}")
        time.sleep(1.0)                            # ranks 0 and 1 are now inside the all-reduce
        recorder = Path(flight_recorder_prefix(control, "5.0")).parent
        dumps = flightrec.collect(control, recorder, 3, wait_s=20)
        assert sorted(dumps) == [0, 1, 2] and (control / FLIGHT_RECORDER_REQUEST_FILE).exists()
        found = flightrec.laggard(dumps, {beat.rank: beat.host for beat in beats})
        assert (found.rank, found.collective, found.waiting) == (2, "gloo:all_reduce", (0, 1))
        assert found.host == socket.gethostname()
        written = sorted(path.name for path in recorder.iterdir())
        assert written == ([node_beat.node_file_name(socket.gethostname())] if per_node else
                           ["rank_0.json", "rank_1.json", "rank_2.json"])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
