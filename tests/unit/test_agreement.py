"""Every rank acts on a checkpoint request at the same step (slurmtools.train.agreement): the check's
spacing, and two real gloo ranks with different step times and the request on one rank only."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from slurmtools.train.agreement import MAX_STEPS_BETWEEN_CHECKS, RequestAgreement, agree, steps_until_next_check
from tests.unit.ranks import rank_argv


@pytest.mark.parametrize(("step_s", "expected"), [
    (0.1, 5), (0.5, 1), (2.0, 1), (0.001, MAX_STEPS_BETWEEN_CHECKS), (0.0, 1), (-1.0, 1), (float("nan"), 1),
    (float("inf"), 1),
])
def test_checks_are_about_interval_s_apart_within_bounds(step_s: float, expected: int):
    assert steps_until_next_check(step_s, 0.5) == expected


def test_without_torch_distributed_a_rank_agrees_with_itself_at_each_check():
    agreement = RequestAgreement(interval_s=0.5)
    seen = [(step, agreement.check(step, step >= 7, 0.1)) for step in range(1, 13)]
    # checks at 1, 6, 11 (every 5 steps of 0.1 s): the request from step 7 acted on at 11
    assert [step for step, requested in seen if requested] == [11]
    assert agreement.next_check_step == 16
    assert agree(True) and not agree(False)


RANKS = """
import datetime, json, sys, torch.distributed as dist
from slurmtools.train.agreement import RequestAgreement
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
agreement = RequestAgreement(interval_s=0.5)
step_s = 0.1 if rank == 0 else 0.05          # rank 1 would check every 10 steps alone, rank 0 every 5
acted = [step for step in range(1, 40) if agreement.check(step, rank == 1 and step >= 17, step_s)]
print(json.dumps(acted), flush=True)
dist.barrier()
dist.destroy_process_group()     # gloo torn down by the interpreter's exit aborts now and then
"""


def test_two_ranks_act_at_the_same_step_on_a_request_only_one_of_them_got(tmp_path: Path):
    pytest.importorskip("torch")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    procs = [subprocess.Popen(rank_argv(RANKS), env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in outs]
    acted = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # the earliest proposal wins: checks at 1, 6, 11, 16, 21, ... on both ranks
    assert acted == [[21, 26, 31, 36], [21, 26, 31, 36]]
