"""A JSON collective (slurmtools/snapshot/wire.gather_json) for real, three gloo ranks: every
rank's value comes back exact, in one all_gather when every value fits the first round (a recovery
pays each round at every rank), in two when one does not (the rest of the longer ones), and what
no rank of ours would send is refused on every rank with one line."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from slurmtools.snapshot.wire import FIRST_ROUND_BYTES
from tests.unit.test_flight_recorder import _free_port
from tests.unit.ranks import rank_argv

RANK_SCRIPT = r"""
import datetime, json, os, sys, torch.distributed as dist
from slurmtools.errors import CheckpointError
from slurmtools.snapshot import wire
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rounds = []
real_all_gather = dist.all_gather
def counted(*args, **kwargs):
    rounds.append(1)
    return real_all_gather(*args, **kwargs)
dist.all_gather = counted
value = json.loads(os.environ["VALUES"])[dist.get_rank()]
if isinstance(value, dict) and "long" in value:     # too long for an environment variable
    value = "b" * value["long"]
try:
    gathered = wire.gather_json(value)
    print(json.dumps({"gathered": gathered, "rounds": len(rounds)}))
except CheckpointError as exc:
    print(json.dumps({"error": str(exc)}))
dist.destroy_process_group()
"""

# the longest value that still fits the first round: its JSON is the round less the length's 8 bytes
FITS = "x" * (FIRST_ROUND_BYTES - 8 - 2)


def _gather(values: list) -> list:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(len(values)),
               VALUES=json.dumps(values))
    procs = [subprocess.Popen(rank_argv(RANK_SCRIPT), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(len(values))]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(values), [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.parametrize("values, rounds", [
    (["node1", {"step": 11, "why": ""}, [1, 2.5, None]], 1),
    ([FITS, "", {"a": []}], 1),
    ([FITS + "y", "node2", None], 2),
    (["node1", "z" * (3 * FIRST_ROUND_BYTES), "é" * FIRST_ROUND_BYTES], 2),
], ids=["small", "at-the-bound", "one-byte-over", "two-long"])
def test_every_ranks_value_comes_back_exact_in_one_round_when_all_fit(values, rounds):
    said = _gather(values)
    assert [rank["gathered"] for rank in said] == [values] * 3
    assert [rank["rounds"] for rank in said] == [rounds] * 3       # the gather's all_gathers


def test_a_part_over_the_bound_is_refused_on_every_rank():
    said = _gather(["a", {"long": 1 << 24}, "c"])
    assert [rank.get("error") for rank in said] == [f"a rank sent {(1 << 24) + 2} bytes of JSON (at most {1 << 24})"] * 3
