"""bench/inplace_resume.py's flat line: a recovery in place's figures over node counts, the time
after the detection in the job's own step times (the mini-cluster's ranks share its cores)."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import inplace_resume  # noqa: E402  (bench/ is no package)


def test_the_flat_line_gives_each_series_over_the_counts_and_its_largest_distance_from_the_mean():
    figures = {16: {"total": 7.9, "detect": 2.7, "step time": 2.9},
               4: {"total": 3.9, "detect": 2.5, "step time": 0.6},
               8: {"total": 5.2, "detect": 3.0, "step time": 1.04}}
    assert inplace_resume.flat_line("node-kill", figures) == (
        "flat inplace node-kill 4/8/16 nodes: total 3.9/5.2/7.9 s (±39%); detect 2.5/3.0/2.7 s (±10%); "
        "after detection 2.3/2.1/1.8 step times (±14%); step time 0.60/1.04/2.90 s")


def test_the_spread_is_the_largest_distance_from_the_mean_over_the_mean():
    assert inplace_resume.spread([1.0, 1.0]) == 0.0
    assert inplace_resume.spread([0.8, 1.2]) == pytest.approx(0.2)
    assert inplace_resume.spread([1.0, 2.0, 3.0]) == pytest.approx(0.5)


def test_the_steady_step_time_is_the_median_gap_between_step_lines_before_the_fault():
    evts = [{"loss": "x", "step": 1, "t": 10.0}, {"loss": "x", "step": 2, "t": 11.0},
            {"event": "checkpoint", "t": 11.5}, {"loss": "x", "step": 3, "t": 13.0},
            {"loss": "x", "step": 4, "t": 14.0}, {"loss": "x", "step": 5, "t": 30.0}]
    assert inplace_resume.steady_step_s(evts, fault_t=20.0) == 1.0
