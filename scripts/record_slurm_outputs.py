"""Record what one Slurm release's commands print, for the parsers' unit tests.

    python scripts/record_slurm_outputs.py --slurm 24.11      (as root; about a minute)

Brings up a mini-cluster `rec` of that release, sets a known scene (node3 drained with a known
reason; a 2-node job running; one job exited 3; one completed), records the commands slurmtools
reads into tests/unit/slurm_outputs/<release>/, with expected.json saying what the scene was
(not what a parser made of it), and takes the cluster down. Never hand-edit the recordings:
record them again.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurmtools.errors import SlurmCommandError, SlurmToolsError  # noqa: E402
from slurmtools.minicluster import cluster, debroot  # noqa: E402
from slurmtools.minicluster.release import RELEASES  # noqa: E402
from slurmtools.slurm import commands as slurm  # noqa: E402

DRAIN_REASON = "slurmtools: CRITICAL recorded.check node=node3 measured=1 expected=0"
CLUSTER_NAME = "rec"


def wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except SlurmCommandError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"record_slurm_outputs: timed out waiting for {what}")


def submit(script: str, *args: str) -> int:
    return slurm.submit(f"#!/bin/sh\n{script}\n", ["-o", "/dev/null", "-e", "/dev/null", *args])


def record(out_dir: Path, release: str) -> None:
    slurm.drain_node("node3", DRAIN_REASON)
    running = submit("sleep 600", "-N2", "--job-name=running")
    failed = submit("exit 3", "-N1", "--job-name=failed")
    completed = submit("true", "-N1", "--job-name=completed")
    wait(lambda: slurm.job_state(running).state == "RUNNING", 60, "the 2-node job to run")
    for job, state in ((failed, "FAILED"), (completed, "COMPLETED")):
        wait(lambda: any(row["State"] == state for row in slurm.sacct_rows(job)), 90, f"sacct to say {state}")
    outputs: Dict[str, List[str]] = {
        "version.txt": ["scontrol", "--version"],
        "scontrol_show_node.txt": ["scontrol", "-o", "show", "node"],
        "scontrol_show_job_running.txt": ["scontrol", "-o", "show", "job", str(running)],
        "sinfo.json": ["sinfo", "--json"],
        "squeue.json": ["squeue", "--json"],
        "sacct_failed.json": ["sacct", "--json", "-j", str(failed)],
        "sacct_completed.json": ["sacct", "--json", "-j", str(completed)],
        "scontrol_show_node.json": ["scontrol", "show", "node", "--json"],
        "scontrol_show_node_node3.json": ["scontrol", "show", "node", "node3", "--json"],
        "scontrol_show_job_running.json": ["scontrol", "show", "job", str(running), "--json"],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    refused = {}
    for name, argv in outputs.items():
        try:
            (out_dir / name).write_text(slurm.run_slurm(argv, retry=None))
        except SlurmCommandError as exc:   # 22.05's scontrol has no --json: that refusal is recorded too
            refused[name] = exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else str(exc.returncode)
            (out_dir / name).unlink(missing_ok=True)
    expected = {"release": release, "jobs": {"running": running, "failed": failed, "completed": completed},
                "running_nodes": 2, "failed_exit_code": "3:0", "completed_exit_code": "0:0",
                "drained": {"node3": DRAIN_REASON}, "drained_by": "root", "refused": refused}
    (out_dir / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    slurm.cancel(running)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", choices=list(RELEASES), required=True)
    parser.add_argument("--out", default=str(REPO / "tests" / "unit" / "slurm_outputs"))
    args = parser.parse_args()
    layout = cluster.layout_for_up(CLUSTER_NAME, None, nodes=3, gpus_per_node=4, prolog_dir=REPO / "prolog.d",
                                   epilog_dir=REPO / "epilog.d", slurm_release=args.slurm)
    try:
        cluster.up(layout, install=True, wait_s=90)
        with slurm.using_conf(layout.slurm_conf, layout.client_bin_dir):
            release = args.slurm if layout.slurm_root else (debroot.host_release() or args.slurm)
            record(Path(args.out) / release, release)
    except SlurmToolsError as exc:
        print(f"record_slurm_outputs: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.down(layout, purge=True)
    print(f"recorded Slurm {args.slurm} into {args.out}/{args.slurm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
