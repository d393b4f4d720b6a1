"""Preflight's pure parts: the canary's reference and fault setting, the judges, the pair
rounds, the step's command line, the spec/flags round trip and the policy's verdicts."""
from __future__ import annotations

import argparse
import json

import pytest

from slurmtools.common import ledger
from slurmtools.common.control_dir import PREFLIGHT_ENV
from slurmtools.errors import MiniClusterError, SpecError
from slurmtools.minicluster import degrade
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.preflight import canary
from slurmtools.preflight.canary import CanaryResult, Shape
from slurmtools.preflight.judge import (Finding, LinkResult, Settings, judge_canary, judge_links, judge_throughput,
                                        named, pair_rounds)
from slurmtools.requeue import preflight_inprocess as inprocess, preflight_launch as launch
from slurmtools.requeue import flags, policy
from slurmtools.slurm import drain
from slurmtools.spec import RequeueSpec, spec_from_dict

SMALL = Shape(32, 2, 2)


def result(node, digest="aa", gflops=10.0, rank=0, kind="cpu", summary=canary.REFERENCE[("float32", 384, 4)],
           consistent=True):
    return CanaryResult(node, rank, "cpu", kind, digest, summary, consistent, 1.0, gflops * 1e9)


# ---- canary ---------------------------------------------------------------------------
def test_the_recorded_cpu_reference_is_the_float64_computation():
    assert canary.reference(canary.SHAPES["cpu"]) == pytest.approx(
        canary.REFERENCE[(canary.DTYPE, canary.SHAPES["cpu"].size, canary.SHAPES["cpu"].chain)], rel=1e-12)


def test_the_canary_matches_its_reference_and_repeats_itself():
    got = canary.run_on("cpu", Shape(384, 4, 2))
    ref = canary.REFERENCE[("float32", 384, 4)]
    assert got.consistent and got.device_kind == "cpu" and got.flops == 2.0 * 384 ** 3 * 4 * 2
    assert all(abs(a - b) <= canary.TOLERANCE["float32"] * ref[0] for a, b in zip(got.summary, ref))
    assert canary.run_on("cpu", Shape(384, 4, 1)).digest == got.digest


def test_the_injected_fault_changes_the_checksum_and_misses_the_reference():
    good, bad = canary.run_on("cpu", SMALL), canary.run_on("cpu", SMALL, fault=True)
    assert bad.digest != good.digest and bad.consistent
    assert abs(bad.summary[0] - good.summary[0]) > 0.5


@pytest.mark.parametrize("value,host,expected", [
    ("", "node2", None), ("node2", "node2", 0), ("node1,node2@6", "node2", 6), ("node2@6", "node1", None),
    (" node3 , node2@x", "node2", 0), ("node22", "node2", None)])
def test_the_fault_setting_names_a_host_and_an_optional_step(value, host, expected):
    assert canary.fault_from_step({canary.CANARY_FAULT_ENV: value}, host) == expected


# ---- judges ---------------------------------------------------------------------------
def test_a_device_disagreeing_with_the_majority_is_named():
    found = judge_canary([result("n1", "aa"), result("n2", "bb", rank=1), result("n3", "aa", rank=2)], 384, 4)
    assert found == [Finding("canary", "n2", "sha256:bb", "sha256:aa", "rank 1 cpu (cpu) disagrees with 2 of 3 devices")]


def test_without_a_majority_the_reference_decides_and_otherwise_nobody_is_named():
    ref = canary.REFERENCE[("float32", 384, 4)]
    off = (ref[0] + 10.0, ref[1], ref[2])
    found = judge_canary([result("n1", "aa", summary=ref), result("n2", "bb", rank=1, summary=off)], 384, 4)
    assert [(f.test, f.node) for f in found] == [("canary", "n2")]
    tie = judge_canary([result("n1", "aa", summary=ref), result("n2", "bb", rank=1, summary=ref)], 384, 4)
    assert [(f.test, f.node) for f in tie] == [("canary", None)]


def test_devices_of_different_kinds_are_not_compared_bit_for_bit():
    ref = canary.REFERENCE[("float32", 384, 4)]
    assert judge_canary([result("n1", "aa", kind="A", summary=ref), result("n2", "bb", kind="B", summary=ref)],
                        384, 4) == []


def test_devices_that_agree_but_all_miss_the_reference_are_reported_not_named():
    found = judge_canary([result("n1", summary=(1.0, 1.0, 0.0)), result("n2", summary=(1.0, 1.0, 0.0))], 384, 4)
    assert [(f.node, f.detail) for f in found] == [(None, "cpu: all 2 devices agree but miss the float64 reference")]


def test_an_unrepeatable_device_is_named():
    found = judge_canary([result("n1"), result("n2", consistent=False), result("n3")], 384, 4)
    assert [(f.node, f.measured) for f in found] == [("n2", "unrepeatable")]


def test_a_device_slower_than_the_median_by_the_factor_is_named():
    found = judge_throughput([result("n1", gflops=60), result("n2", gflops=28), result("n3", gflops=58)], 2.0)
    assert [(f.test, f.node, f.measured, f.expected) for f in found] == [
        ("throughput", "n2", "28GFLOP/s", ">=29GFLOP/s")]
    assert judge_throughput([result("n1", gflops=60), result("n2", gflops=31), result("n3", gflops=58)], 2.0) == []


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9])
def test_pair_rounds_are_disjoint_and_meet_both_neighbours(count):
    nodes = [f"n{i}" for i in range(count)]
    rounds = pair_rounds(nodes)
    assert len(rounds) == (1 if count == 2 else 2 if count % 2 == 0 else 3)
    for pairs in rounds:
        members = [node for pair in pairs for node in pair]
        assert len(members) == len(set(members))
    met = {frozenset(pair) for pairs in rounds for pair in pairs}
    assert met == {frozenset((nodes[i], nodes[(i + 1) % count])) for i in range(count)}


def _pairs(busbw):
    return [LinkResult(tuple(key.split("-")), value, 100.0) for key, value in busbw.items()]


def test_a_node_slow_with_both_neighbours_is_named():
    pairs = _pairs({"n1-n2": 0.09, "n2-n3": 0.09, "n3-n1": 5.6})
    found = judge_links(["n1", "n2", "n3"], pairs, None, Settings(300, 2.0))
    assert [(f.test, f.node, f.measured, f.expected) for f in found] == [("busbw", "n2", "0.09Gbps", ">=2.8Gbps")]


def test_healthy_pairs_and_two_node_jobs_name_nobody():
    pairs = _pairs({"n1-n2": 5.0, "n2-n3": 4.0, "n3-n1": 6.0})
    assert judge_links(["n1", "n2", "n3"], pairs, None, Settings(300, 2.0)) == []
    assert judge_links(["n1", "n2"], _pairs({"n1-n2": 0.01}), None, Settings(300, 2.0)) == []


def test_below_a_floor_without_a_culprit_is_reported_not_named():
    two = judge_links(["n1", "n2"], _pairs({"n1-n2": 1.0}), None, Settings(300, 2.0, min_busbw_gbps=10))
    assert [(f.node, f.expected) for f in two] == [(None, ">=10Gbps")]
    ring = judge_links(["n1", "n2", "n3"], _pairs({"n1-n2": 20, "n2-n3": 20, "n3-n1": 20}),
                       LinkResult(("n1", "n2", "n3"), 5.0, 1.0), Settings(300, 2.0, min_busbw_gbps=10))
    assert [(f.node, f.measured) for f in ring] == [(None, "5Gbps")]


def test_too_many_slow_nodes_are_reported_not_named():
    pairs = _pairs({"n1-n2": 0.1, "n2-n3": 0.1, "n3-n4": 0.1, "n4-n1": 5.0})
    found = judge_links(["n1", "n2", "n3", "n4"], pairs, None, Settings(300, 2.0, min_busbw_gbps=1.0))
    assert [(f.node, f.detail) for f in found] == [(None, "slow pairs on n2,n3: too many to name one node")]


def test_each_named_node_keeps_its_first_finding_by_test_order():
    findings = [Finding("busbw", "n2", "1", "2"), Finding("throughput", "n2", "3", "4"), Finding("canary", None, "", ""),
                Finding("busbw", "n3", "5", "6")]
    assert {node: f.test for node, f in named(findings).items()} == {"n2": "throughput", "n3": "busbw"}
    assert list(named(findings)) == ["n2", "n3"]


# ---- the step, the spec, the flags ---------------------------------------------------------
def test_the_preflight_step_copies_the_training_launch_options():
    train = ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--cpus-per-task=1", "--ntasks-per-node=2", "bash", "-c",
             "exec x", "t", "python", "train.py"]
    argv = launch.worker_argv(train, ["n1", "n2", "n3"], launch.Path("/c/preflight.json"), Settings(300, 2.0, 5.0),
                              python="/py")
    assert argv == ["srun", "--nodelist=n1,n2,n3", "--kill-on-bad-exit=1", "--nodes=3", "--cpus-per-task=1",
                    "--ntasks-per-node=2", "/py", "-m", "slurmtools.preflight.worker", "--report=/c/preflight.json",
                    "--budget-s=300", "--slow-factor=2.0", "--min-busbw-gbps=5.0"]
    assert launch.worker_argv(["python", "train.py"], ["n1"], launch.Path("/r"), Settings(300, 2.0)) is None


def test_preflight_is_on_for_multi_node_jobs_and_rendered_as_run_flags():
    single = spec_from_dict({"name": "a", "command": ["x.py"]})
    multi = spec_from_dict({"name": "a", "command": ["x.py"], "nodes": 2, "preflight_min_busbw_gbps": 2.5})
    spare = spec_from_dict({"name": "a", "command": ["x.py"], "requeue": {"spare_nodes": 1}})
    assert flags.render_preflight(single) == ["--no-preflight"]
    assert flags.render_preflight(spare)[0] == "--preflight"
    assert flags.render_preflight(multi) == ["--preflight", "--preflight-budget-s=300", "--preflight-slow-factor=2.0",
                                             "--preflight-min-busbw-gbps=2.5"]
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    args = parser.parse_args(flags.render_preflight(multi))
    assert flags.preflight_from_args(args) == Settings(300, 2.0, 2.5)
    assert flags.preflight_from_args(parser.parse_args(["--no-preflight"])) is None
    with pytest.raises(SpecError, match="preflight_budget_s"):
        flags.preflight_from_args(parser.parse_args(["--preflight", "--preflight-budget-s=5"]))


@pytest.mark.parametrize("key,value,message", [("preflight_slow_factor", 1.0, "preflight_slow_factor"),
                                               ("preflight", "yes", "preflight"),
                                               ("preflight_budget_s", 0, "preflight_budget_s")])
def test_bad_preflight_settings_are_one_line_errors(key, value, message):
    with pytest.raises(SpecError, match=message):
        spec_from_dict({"name": "a", "command": ["x.py"], key: value})


def test_the_notebook_path_carries_the_settings_in_one_variable():
    spec = spec_from_dict({"name": "a", "command": ["x.py"], "nodes": 3, "preflight_budget_s": 60})
    value = inprocess.env_value(spec)
    assert json.loads(value) == {"budget_s": 60, "slow_factor": 2.0, "min_busbw_gbps": None}
    assert inprocess.settings_from_env({PREFLIGHT_ENV: value}) == Settings(60, 2.0, None)
    assert inprocess.env_value(spec_from_dict({"name": "a", "nodes": 3, "preflight": False})) is None
    assert inprocess._port_beside("31999") == "20000" and inprocess._port_beside("20000") == "20001"


# ---- the verdicts ----------------------------------------------------------------------
def _evidence(node="node2"):
    return policy.Evidence(exit_code=None, progressed=False, preflight_node=node, preflight_check="preflight.busbw",
                           preflight_detail=f"node={node} measured=0.09Gbps expected=>=2.8Gbps")


def test_a_named_node_is_replaced_in_place_or_excluded_by_a_requeue_and_drained():
    diag = policy.classify(_evidence())
    assert (diag.cause, diag.node, diag.check, diag.fatal_for_node) == (
        policy.Cause.PREFLIGHT, "node2", "preflight.busbw", True)
    spare = policy.decide(diag, [], RequeueSpec(spare_nodes=1), None,
                          policy.Capacity(True, frozenset({"node2", "node3"})))
    assert (spare.action, spare.exclude_node, spare.drain_node, spare.counted) == (
        policy.Action.RESTART, "node2", "node2", True)
    queue = policy.decide(diag, [], RequeueSpec(), None, policy.Capacity())
    assert (queue.action, queue.exclude_node, queue.drain_node) == (policy.Action.REQUEUE, "node2", "node2")
    reason = drain.DrainReason("CRITICAL", diag.check, diag.detail, "42").render()
    assert reason == "slurmtools: CRITICAL preflight.busbw node=node2 measured=0.09Gbps expected=>=2.8Gbps job=42"


def test_repeated_preflight_failures_spend_the_restart_budget():
    diag = policy.classify(_evidence())
    history = [policy.AttemptRecord(policy.Cause.PREFLIGHT, True, None, f"node{i}") for i in range(3)]
    assert policy.decide(diag, history, RequeueSpec(max_restarts=3), None).action is policy.Action.STOP


def test_the_ledger_keeps_the_preflight_record(tmp_path):
    event = ledger.PreflightCheck("7.0", 1.5, "failed", "n1,n2,n3", 4.2, {"n2": "preflight.busbw node=n2"}, "")
    ledger.append(tmp_path, event)
    assert ledger.read(tmp_path) == [event]


def test_degrade_refuses_out_of_range_values_before_touching_anything():
    layout = MiniClusterLayout(name="x")
    with pytest.raises(MiniClusterError, match="--rate-mbit must be 1 to 100000, got 0"):
        degrade.limit_rate(layout, "node1", 0)
    with pytest.raises(MiniClusterError, match="--cpu-percent must be 1 to 100, got 101"):
        degrade.cap_cpu(layout, "node1", 101)
    with pytest.raises(MiniClusterError, match="give --rate-mbit N, --cpu-percent P or both"):
        degrade.degrade(layout, "node1")


def test_the_command_outside_an_allocation_is_a_one_line_error(monkeypatch, capsys):
    from slurmtools.cli import main
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    assert main(["preflight"]) == 2
    assert capsys.readouterr().err == ("slurmtools: error: preflight: run it inside an allocation (salloc or an "
                                       "sbatch script): SLURM_JOB_ID / SLURM_JOB_NODELIST are not set\n")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert main(["preflight", "--tasks-per-node", "0"]) == 2
    assert "--tasks-per-node must be at least 1, got 0" in capsys.readouterr().err
    assert main(["preflight", "--preflight-slow-factor", "1"]) == 2
    assert "preflight_slow_factor" in capsys.readouterr().err


def test_a_link_is_slow_only_when_it_is_slow_twice():
    """A burst of other traffic slows one measurement; the worker measures every pair again before it
    names a node, and judges the better of the two."""
    from slurmtools.preflight.judge import LinkResult, Settings, best_of, judge_links
    nodes = ["node1", "node2", "node3"]
    first = [LinkResult(("node1", "node2"), 2.6, 90.0), LinkResult(("node2", "node3"), 2.5, 95.0),
             LinkResult(("node3", "node1"), 1.2, 300.0)]
    second = [LinkResult(("node1", "node2"), 2.4, 80.0), LinkResult(("node2", "node3"), 1.1, 99.0),
              LinkResult(("node3", "node1"), 2.7, 85.0)]
    settings = Settings(budget_s=60, slow_factor=2.0)
    assert [f.node for f in judge_links(nodes, [first[0], first[1], LinkResult(("node3", "node1"), 1.2, 300.0)],
                                        None, settings)] == []       # node3's best pair is fine
    assert best_of(first, second) == [LinkResult(("node1", "node2"), 2.6, 80.0),
                                      LinkResult(("node2", "node3"), 2.5, 95.0),
                                      LinkResult(("node3", "node1"), 2.7, 85.0)]
    slow_twice = [LinkResult(("node1", "node2"), 0.1, 900.0), LinkResult(("node2", "node3"), 0.1, 950.0),
                  LinkResult(("node3", "node1"), 2.7, 85.0)]
    assert [f.node for f in judge_links(nodes, best_of(slow_twice, slow_twice), None, settings)] == ["node2"]


def test_slow_devices_on_most_nodes_name_no_node():
    """The job's own load, not a node: two of three nodes read slow against the median."""
    found = judge_throughput([result("n1", gflops=60), result("n1", gflops=60, rank=1), result("n2", gflops=15),
                              result("n2", gflops=15, rank=1), result("n3", gflops=15), result("n3", gflops=61, rank=1)],
                             2.0)
    assert [(f.test, f.node, f.detail) for f in found] == [
        ("throughput", None, "cpu: slow devices on n2,n3: too many to name one node")]
    two_nodes = judge_throughput([result("n1", gflops=60), result("n1", gflops=60, rank=1), result("n2", gflops=10),
                                  result("n2", gflops=10, rank=1)], 2.0)
    assert [f.node for f in two_nodes] == ["n2", "n2"]      # one of two: the slow one is named


def test_a_device_is_slow_only_when_it_is_slow_twice():
    """A burst of the OS's work slows one timing; the worker runs the canary again before it names a
    node and keeps each device's faster timing (the first run's checksums)."""
    from dataclasses import replace
    from slurmtools.preflight.judge import fastest_of
    first = [result("n1", gflops=60), result("n2", gflops=20, rank=1, digest="bb"), result("n3", gflops=58, rank=2)]
    second = [replace(first[0], seconds=2.0), replace(first[1], seconds=1 / 3, digest="cc"), first[2]]
    best = fastest_of(first, second)
    assert [(r.rank, round(r.gflops), r.digest) for r in best] == [(0, 60, "aa"), (1, 60, "bb"), (2, 58, "aa")]
    assert judge_throughput(best, 2.0) == []
    assert [f.node for f in judge_throughput(fastest_of(first, first), 2.0)] == ["n2"]
