"""`slurmtools metrics relay`: the admin's side of job metrics (root).

    slurmtools metrics relay [--node N] [--config F]
        copy every job's vetted metrics from this node's inbox to node_exporter's directory now,
        and sweep finished jobs' files: what every periodic health run also does; as a
        HealthCheckProgram, cron job or systemd timer it sets how fresh the series are.
"""
from __future__ import annotations

import argparse
from typing import Any

from slurmtools.errors import UsageError
from slurmtools.health.admin_args import add_node_args, root_node_settings


def cmd_relay(args: argparse.Namespace) -> int:
    from slurmtools.metricsrelay import inbox
    host, node_settings = root_node_settings(args, "metrics relay", "node_exporter's directory is root's")
    settings = node_settings.job_metrics
    if not settings.enabled:
        raise UsageError("metrics relay: the health config sets no job_metrics.inbox_dir and textfile_dir")
    try:
        lines = inbox.relay_all(settings, host)
    except (OSError, inbox.InboxError) as exc:
        raise UsageError(f"metrics relay: {exc}") from None
    for line in lines:
        print(line)
    return 0


def add_metrics(sub: Any) -> None:
    parser = sub.add_parser("metrics", help="jobs' metrics to node_exporter through the root-owned relay")
    acts = parser.add_subparsers(dest="metrics_command", required=True)
    relay = acts.add_parser("relay", help="copy every job's vetted metrics on this node to node_exporter now (root)")
    add_node_args(relay)
    relay.set_defaults(func=cmd_relay)
