"""Checkpoint interval advice (Young/Daly) and predicted goodput; pure arithmetic.

With checkpoint cost C, job MTBF M (one node's MTBF / nodes) and restart cost R:
  Young:  tau = sqrt(2 C M)
  Daly:   tau = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + C / 18M) - C      (C < 2M), else M
  waste fraction ~= C / tau  +  (tau / 2 + C + R) / M    (checkpoints; lost work + restart per failure)
  goodput = 1 - waste
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple


@dataclass(frozen=True)
class Plan:
    checkpoint_cost_s: float
    restart_cost_s: float
    job_mtbf_s: float
    young_interval_s: float
    daly_interval_s: float
    goodput: float
    table: List[Tuple[float, float]]   # (interval_s, predicted goodput)


def predicted_goodput(interval_s: float, checkpoint_cost_s: float, job_mtbf_s: float, restart_cost_s: float) -> float:
    waste = checkpoint_cost_s / interval_s + (interval_s / 2 + checkpoint_cost_s + restart_cost_s) / job_mtbf_s
    return max(0.0, 1.0 - waste)


# The ranges the arithmetic is asked about (a week's checkpoint, a million nodes, a node that fails
# every 36 s to once in 100,000 years): outside them an answer is meaningless or the floats break
# (a 5e-324 h MTBF over 10**12 nodes divides by zero).
MAX_NODES = 1_000_000
MIN_NODE_MTBF_H, MAX_NODE_MTBF_H = 0.01, 1e9
MAX_COST_S = 7 * 24 * 3600.0


def plan(*, checkpoint_cost_s: float, nodes: int, node_mtbf_h: float, restart_cost_s: float = 60.0) -> Plan:
    if not 0 < checkpoint_cost_s <= MAX_COST_S:
        raise ValueError(f"checkpoint cost must be > 0 and <= {MAX_COST_S:g} s, got {checkpoint_cost_s:g}")
    if not 0 <= restart_cost_s <= MAX_COST_S:
        raise ValueError(f"restart cost must be >= 0 and <= {MAX_COST_S:g} s, got {restart_cost_s:g}")
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if not MIN_NODE_MTBF_H <= node_mtbf_h <= MAX_NODE_MTBF_H:
        raise ValueError(f"node MTBF must be between {MIN_NODE_MTBF_H:g} and {MAX_NODE_MTBF_H:g} hours, got {node_mtbf_h:g}")
    mtbf_s = node_mtbf_h * 3600.0 / nodes
    cost_s = checkpoint_cost_s
    young = math.sqrt(2 * cost_s * mtbf_s)
    daly = young * (1 + math.sqrt(cost_s / (2 * mtbf_s)) / 3 + cost_s / (18 * mtbf_s)) - cost_s if cost_s < 2 * mtbf_s else mtbf_s
    daly = max(daly, cost_s)
    table = [(t, predicted_goodput(t, cost_s, mtbf_s, restart_cost_s)) for t in (300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0)]
    return Plan(cost_s, restart_cost_s, mtbf_s, young, daly, predicted_goodput(daly, cost_s, mtbf_s, restart_cost_s), table)


def format_plan(result: Plan) -> str:
    lines = [
        f"job MTBF: {result.job_mtbf_s / 3600:.2f} h",
        f"checkpoint every: {result.daly_interval_s / 60:.1f} min (Daly; Young: {result.young_interval_s / 60:.1f} min)",
        f"predicted goodput: {result.goodput:.1%} (checkpoint {result.checkpoint_cost_s:g} s, restart {result.restart_cost_s:g} s)",
        "other intervals:",
    ]
    lines += [f"  every {t / 60:5.0f} min -> {g:.1%}" for t, g in result.table]
    return "\n".join(lines)
