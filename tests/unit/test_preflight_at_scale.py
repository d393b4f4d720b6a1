"""The preflight's pair rounds at 128 and 1,000 nodes: still two rounds (three for an odd count),
and a node whose link is slow found among them. (On the mini-cluster the preflight runs with torch
on a few nodes, tests/cluster/test_preflight.py: a process with torch.distributed imported holds
~220 MB of its own here (USS, measured 2026-12-03) and ~1.6 s of CPU to start, so 128 of them need
~28 GB, more than this machine's 23 GB; the light trainer's 128-node test, tests/cluster/test_scale.py,
runs without preflight.)"""
from __future__ import annotations

import random

import pytest

from slurmtools.preflight.judge import LinkResult, Settings, best_of, judge_links, pair_rounds


def _measure(rounds, capacity_gbps, rng):
    """A pair's bus bandwidth: its slower end's, with +-10% noise (another job's traffic)."""
    return [LinkResult(pair, min(capacity_gbps[node] for node in pair) * rng.uniform(0.9, 1.1), 10.0)
            for pairs in rounds for pair in pairs]


@pytest.mark.parametrize("count", [128, 129, 1000])
def test_a_slow_nic_among_many_nodes_is_found_by_two_rounds_of_pairs(count):
    rng = random.Random(count)
    nodes = [f"node{index}" for index in range(1, count + 1)]
    rounds = pair_rounds(nodes)
    assert len(rounds) == (2 if count % 2 == 0 else 3)
    assert sum(len(pairs) for pairs in rounds) == count               # each node meets both neighbours
    capacity = {node: 200.0 for node in nodes}
    capacity["node77"] = 40.0                                          # its NIC trained down to a fifth
    first, again = _measure(rounds, capacity, rng), _measure(rounds, capacity, rng)
    found = judge_links(nodes, best_of(first, again), None, Settings(300, 2.0))
    assert [(finding.test, finding.node) for finding in found] == [("busbw", "node77")]
    assert found[0].detail.startswith("every pair with node77 is slow (best ")


def test_one_slow_cable_between_two_healthy_nodes_names_neither():
    """Each end has a healthy pair with its other neighbour: a node is named only when every pair
    with it is slow (a cable or switch port between two nodes is for the fabric's own tools)."""
    rng = random.Random(7)
    nodes = [f"node{index}" for index in range(1, 129)]
    measured = [LinkResult(result.nodes, 20.0 if set(result.nodes) == {"node40", "node41"} else result.busbw_gbps,
                           10.0) for result in _measure(pair_rounds(nodes), {node: 200.0 for node in nodes}, rng)]
    assert judge_links(nodes, measured, None, Settings(300, 2.0)) == []
