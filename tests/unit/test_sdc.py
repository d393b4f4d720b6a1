"""The silent-data-corruption canary: majority and attribution (pure), the marker the supervisor
reads and the decision it leads to, and for real: three gloo ranks of the tiny trainer, one of
which computes a wrong reference result from step 3, stop before that state is sealed, and the
marker names that rank."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurmtools.checkpoint.manager import CheckpointManager
from slurmtools.common.control_dir import SDC_FILE
from slurmtools.common.ledger import Cause
from slurmtools.requeue import step
from slurmtools.requeue.policy import Action, Capacity, Evidence, classify, decide
from slurmtools.spec import RequeueSpec, spec_from_dict
from slurmtools.train import sdc
from tests.unit.ranks import rank_argv


def votes(*digests, hosts=("node1", "node1", "node2", "node2")):
    return [sdc.Vote(rank, hosts[rank], digest) for rank, digest in enumerate(digests)]


def test_all_agree_is_no_verdict_and_one_odd_rank_is_named_with_its_node():
    assert sdc.verdict(votes("a", "a", "a", "a"), 6) is None
    found = sdc.verdict(votes("a", "a", "a", "b"), 6)
    assert (found.step, found.odd_ranks, found.node) == (6, [3], "node2")
    assert found.detail == "rank 3 on node2 disagree(s) with 3 of 4 ranks on the reference batch at step 6"


def test_odd_ranks_on_two_nodes_name_both_and_no_majority_names_nobody_by_itself():
    spread = sdc.verdict(votes("a", "b", "a", "a", "c", hosts=("n1", "n1", "n2", "n2", "n3")), 9)
    assert (spread.odd_ranks, spread.node, spread.nodes) == ([1, 4], "n1", ("n1", "n3"))
    assert spread.detail == "ranks 1,4 on n1,n3 disagree(s) with 3 of 5 ranks on the reference batch at step 9"
    split = sdc.verdict(votes("a", "a", "b", "b"), 9)
    assert (split.odd_ranks, split.node, split.nodes) == ([], None, ())
    assert split.detail == "2 different results of the reference batch among 4 ranks at step 9, no majority"


def test_without_a_majority_the_float64_reference_names_the_wrong_side():
    """A node-wide fault on a 2-node job (2 against 2), and one rank against one."""
    split_votes = votes("a", "a", "b", "b")
    decided = sdc.by_reference(sdc.verdict(split_votes, 9), split_votes, ["node2", "node2"])
    assert (decided.odd_ranks, decided.node, decided.nodes) == ([2, 3], "node2", ("node2",))
    assert decided.detail == ("2 different results of the reference batch among 4 ranks at step 9, no majority; "
                              "the device canary on node2 misses the float64 reference")
    pair = votes("a", "b", hosts=("node1", "node2"))
    assert sdc.by_reference(sdc.verdict(pair, 3), pair, ["node1"]).nodes == ("node1",)
    undecided = sdc.verdict(pair, 3)
    assert sdc.by_reference(undecided, pair, []) == undecided              # nobody misses it: still nobody
    majority = sdc.verdict(votes("a", "a", "a", "b"), 6)
    assert sdc.by_reference(majority, votes("a", "a", "a", "b"), ["node1"]) == majority   # a majority stands


def test_the_device_canary_decides_one_rank_against_one():
    """The device canary's results as judge_canary sees them: one device missing the reference."""
    from slurmtools.preflight import canary as device_canary
    from slurmtools.preflight.judge import judge_canary
    shape = device_canary.Shape(384, 4, 1)
    good = device_canary.run_on("cpu", shape, rank=0)
    bad = device_canary.run_on("cpu", shape, fault=True, rank=1)
    bad = type(bad)(**{**bad.__dict__, "node": "node2"})
    findings = judge_canary([good, bad], shape.size, shape.chain, device_canary.DTYPE)
    assert [f.node for f in findings if f.node] == ["node2"]


def test_the_marker_becomes_a_drain_and_a_restart_without_the_node(tmp_path):
    (tmp_path / SDC_FILE).write_text(json.dumps({"step": 6, "ranks": [3], "node": "node2", "detail": "rank 3 on node2 x"}))
    node, detail, also = step.sdc_record(tmp_path)
    assert also == ()
    diag = classify(Evidence(exit_code=1, sdc_found=True, sdc_node=node, sdc_detail=detail,
                             log_tail="RuntimeError: silent data corruption: rank 3 on node2 x"))
    assert (diag.cause, diag.node, diag.fatal_for_node) == (Cause.SDC, "node2", True)
    verdict = decide(diag, [], RequeueSpec(), 4, Capacity(True, frozenset({"node2"})))
    assert (verdict.action, verdict.exclude_node, verdict.drain_node, verdict.counted) == (
        Action.RESTART, "node2", "node2", True)
    unattributed = classify(Evidence(exit_code=1, sdc_found=True, sdc_detail="no majority"))
    assert (unattributed.cause, unattributed.node, unattributed.fatal_for_node) == (Cause.SDC, None, False)
    (tmp_path / SDC_FILE).write_text("[1, 2]")
    assert step.sdc_record(tmp_path) is None


def test_the_spec_exports_the_interval_and_zero_turns_it_off():
    from slurmtools.job import sbatch
    base = {"name": "x", "command": ["train.py"]}
    assert ("SLURMTOOLS_SDC_CHECK_EVERY", "100") in sbatch.environment(spec_from_dict(base))
    off = spec_from_dict(dict(base, distributed={"sdc_check_every": 0}))
    assert ("SLURMTOOLS_SDC_CHECK_EVERY", "0") in sbatch.environment(off)


RANK_SCRIPT = """
import datetime, sys, torch.distributed as dist
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
train(TrainConfig(steps=8, checkpoint_every=2, checkpoint_dir=sys.argv[1], sdc_check_every=1, sdc_fault="2:3"),
      TrainingControl(rank=dist.get_rank()), log=lambda r: None)
"""


def test_real_ranks_stop_before_sealing_the_corrupted_state_and_name_the_rank(tmp_path):
    pytest.importorskip("torch")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    control = tmp_path / "control"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3",
               SLURMTOOLS_CONTROL_DIR=str(control), SLURMTOOLS_ATTEMPT_ID="9.0")
    with (tmp_path / "ranks.err").open("w") as err:
        procs = [subprocess.Popen(rank_argv(RANK_SCRIPT, str(tmp_path / "ckpt"), fsdp=True),
                                  env=dict(env, RANK=str(rank)), stdout=subprocess.DEVNULL, stderr=err)
                 for rank in range(3)]
        codes = [proc.wait(timeout=180) for proc in procs]
    assert all(code != 0 for code in codes)
    assert "silent data corruption: rank 2 on" in (tmp_path / "ranks.err").read_text()
    record = json.loads((control / SDC_FILE).read_text())
    assert (record["step"], record["ranks"], record["node"]) == (3, [2], socket.gethostname())
    assert CheckpointManager(tmp_path / "ckpt").latest().step == 2          # step 3's state never sealed


@pytest.mark.parametrize("flag,value,form", [("--sdc-fault", "3", "RANK:STEP"), ("--skip-collective-at", "a:6", "RANK:STEP"),
                                             ("--slow-node", "node2:x", "HOST:SECONDS")])
def test_a_malformed_fault_flag_of_the_example_trainer_is_a_one_line_usage_error(flag, value, form):
    train = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"
    out = subprocess.run([sys.executable, str(train), flag, value], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"train.py: error: argument {flag}: expected {form}, got {value!r}"


def test_a_marker_naming_two_nodes_blames_both(tmp_path):
    (tmp_path / SDC_FILE).write_text(json.dumps({"step": 9, "ranks": [1, 4], "node": "n1", "nodes": ["n1", "n3"],
                                                 "detail": "ranks 1,4 on n1,n3 disagree(s)"}))
    node, detail, also = step.sdc_record(tmp_path)
    assert (node, also) == ("n1", ("n3",))
    diag = classify(Evidence(exit_code=1, sdc_found=True, sdc_node=node, sdc_also=also, sdc_detail=detail))
    assert (diag.cause, diag.node, diag.also_nodes, diag.fatal_for_node) == (Cause.SDC, "n1", ("n3",), True)
    verdict = decide(diag, [], RequeueSpec(), 4, Capacity(True, frozenset({"n1", "n3"}), 1))
    assert (verdict.action, verdict.excluded, verdict.drained) == (Action.REQUEUE, ("n1", "n3"), ("n1", "n3"))


@pytest.mark.parametrize("flag", ["--local-work-s", "--step-sleep-s", "--slow-checkpoint-s"])
def test_a_negative_duration_of_the_example_trainer_is_a_one_line_usage_error(flag):
    train = Path(__file__).resolve().parents[2] / "examples" / "tiny_fsdp" / "train.py"
    out = subprocess.run([sys.executable, str(train), flag, "-0.5"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"train.py: error: argument {flag}: must be at least 0, got -0.5"
