"""The reference trainer's injected faults (slurmtools.reference.tiny_faults): which fire on which attempt,
rank and host."""
from __future__ import annotations

import pytest

from slurmtools.common.control_dir import ATTEMPT_NUMBER_ENV
from slurmtools.preflight.canary import CANARY_FAULT_ENV
from slurmtools.reference.tiny_faults import Faults
from slurmtools.reference.tiny_model import TrainConfig

CFG = TrainConfig(fail_at_step=6, fail_again_at_step=9, faults_on_attempt=0, hang_at_step="1:5",
                  skip_collective_at="3:7", slow_checkpoint_at=8, slow_node="node2:0.5", sdc_fault="2:4",
                  slow_requested_checkpoint=True)


def test_the_faults_fire_on_their_attempt_and_a_second_crash_on_the_next():
    first = Faults.of(CFG, 1, {ATTEMPT_NUMBER_ENV: "0"}, host="node2")
    assert first == Faults(6, (1, 5), (3, 7), 8, 0.5, (2, 4), slow_requested_checkpoint=True)
    assert Faults.of(CFG, 1, {ATTEMPT_NUMBER_ENV: "0"}, host="node1").slower_s == 0.0
    assert Faults.of(CFG, 1, {ATTEMPT_NUMBER_ENV: "1"}, host="node2") == Faults(fail_at=9)
    assert Faults.of(CFG, 1, {ATTEMPT_NUMBER_ENV: "2"}, host="node2") == Faults()
    every = TrainConfig(fail_at_step=3, faults_on_attempt=-1)
    assert Faults.of(every, 0, {ATTEMPT_NUMBER_ENV: "5"}, host="h").fail_at == 3


def test_a_wrong_results_node_corrupts_its_first_rank_from_its_step():
    env = {ATTEMPT_NUMBER_ENV: "3", CANARY_FAULT_ENV: "node3@6", "LOCAL_RANK": "0"}
    faults = Faults.of(TrainConfig(), 4, env, host="node3")
    assert faults.sdc == (4, 6) and faults.corrupts(4, 6) and not faults.corrupts(4, 5) and not faults.corrupts(5, 9)
    assert Faults.of(TrainConfig(), 5, dict(env, LOCAL_RANK="1"), host="node3").sdc is None


def test_before_and_after_a_step():
    faults = Faults(fail_at=6)
    faults.before_step(0, 5)
    with pytest.raises(RuntimeError, match="injected failure at step 6"):
        faults.before_step(0, 6)
    Faults(skip=(3, 7)).after_update(2, 7)          # another rank: nothing happens
