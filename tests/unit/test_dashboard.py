"""The Grafana dashboard (etc/grafana/slurmtools.json): three views as rows, every panel's PromQL
parses (promql-parser, a port of Prometheus's own parser) and names only metrics that the code's
own writers emit (health textfile, rank step metrics, supervisor job metrics)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, List, Set

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from slurmtools.common import ledger
from slurmtools.health import report
from slurmtools.health.model import CheckResult, Status
from slurmtools.requeue import job_metrics
from slurmtools.train import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "etc" / "grafana" / "slurmtools.json"
ROWS = ["Cluster health", "Training", "Communication and resilience"]


def panels() -> List[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def selectors(node: Any) -> Iterator[str]:
    """Every metric name an expression selects."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node.name
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from selectors(node.vector_selector)
    for child in ("expr", "lhs", "rhs", "param"):
        if isinstance(node, (promql_parser.AggregateExpr, promql_parser.BinaryExpr, promql_parser.ParenExpr,
                             promql_parser.UnaryExpr, promql_parser.SubqueryExpr)) and hasattr(node, child):
            value = getattr(node, child)
            if value is not None:
                yield from selectors(value)
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from selectors(arg)


def emitted(tmp_path: Path) -> Set[str]:
    """Metric names as Prometheus stores them, from files the code really writes."""
    report.write_textfile(str(tmp_path / "health.prom"), "node1", "periodic",
                          [CheckResult("gpu.xid", Status.CRITICAL, "xid=79")], 0.5)
    step = metrics.StepMetrics(tmp_path / "rank.prom", {"slurm_job": "1", "attempt": "1.0", "node": "node1", "rank": "0"})
    step.record(metrics.StepSample(1, 0.5, tokens=10, loss=1.0, grad_norm=1.0, collective_s=0.1, data_wait_s=0.0))
    events = [ledger.AttemptStart("1.0", 0.0), ledger.AttemptEnd("1.0", 10.0, "hang", last_step=5, first_step_t=1.0),
              ledger.AttemptStart("1.1", 12.0)]
    metrics.write(tmp_path / "job.prom", job_metrics.job_registry_from_ledger(events, {"slurm_job": "1", "node": "node1"}))
    names = set()
    for path in tmp_path.glob("*.prom"):
        for family in text_string_to_metric_families(path.read_text()):
            names.update(sample.name for sample in family.samples)
    return names


def test_the_three_views_are_rows_in_order():
    assert [p["title"] for p in panels() if p["type"] == "row"] == ROWS


def test_every_panel_query_parses_and_names_only_emitted_metrics(tmp_path):
    known = emitted(tmp_path)
    queried = set()
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = promql_parser.parse(target["expr"])        # raises on a syntax error
            names = set(selectors(expr))
            assert names, (panel["title"], target["expr"])
            assert names <= known, (panel["title"], sorted(names - known))
            queried |= names
    # every metric the dashboard promises on a view is one of ours
    assert {"slurmtools_train_tokens_per_second", "slurmtools_job_goodput_ratio",
            "slurmtools_job_restarts_total", "slurmtools_health_check_status"} <= queried


def test_a_broken_query_or_an_unknown_metric_would_fail(tmp_path):
    import pytest
    with pytest.raises(Exception):
        promql_parser.parse("sum by (job (slurmtools_train_loss)")
    names = set(selectors(promql_parser.parse('max(rate(slurmtools_nope_total[5m])) / on() slurmtools_train_loss')))
    assert names == {"slurmtools_nope_total", "slurmtools_train_loss"}
    assert not names <= emitted(tmp_path)


def test_the_user_guide_lists_the_dashboards_rows_and_panels():
    rows, current = {}, None
    for panel in panels():
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            current.append(panel["title"])
    readme = (Path(__file__).parents[2] / "docs" / "user-guide.md").read_text()
    listed = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) == 2 and cells[0] in rows:
            listed[cells[0]] = cells[1].split(" · ")
    assert listed == rows
