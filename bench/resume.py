#!/usr/bin/env python3
"""Recovery figures on the real mini-cluster (root), in one run, beside Slurm's own floor
(scontrol requeue -> running): for each fault -- a crash after progress, a hung rank, a node
kill, a node kill with a hot spare -- seconds from the fault to the first resumed step on the
in-allocation path (a new step, no requeue) and on the requeue path, each split into
detect / wait / launch / checkpoint load / first step, and a line `ratio <fault> <x>` (in
allocation / requeue). Then the goodput of a run of about --goodput-min minutes with three
injected failures of different kinds (crash, hung rank, node kill; one spare, min_nodes 1)
against the failure-free run of the same length; and the warning signal's path. Then failures
that come together, on a 3-node x 1-process job: two nodes killed at once (requeue excluding both;
two spares in the allocation) and the batch host killed (Slurm requeues the batch script), each
with its `ratio` line against one node killed on the requeue path of the same job. Then recovery
without relaunch (section inplace, per --inplace-nodes; bench/inplace_resume.py): N nodes x 1 rank
and a spare, snapshots every step, the middle node killed, then the middle node's rank killed,
then the middle node's rank hung: fault -> first resumed step in place (the survivors keep their
processes; split into detect / form and restore / first step) and on the relaunch path of the same
job, and `ratio inplace/relaunch <node-kill|rank-crash|hang> <N> nodes <x>` (for the hang also the
ratio after the hang timeout both wait); then the goodput simulator at 9,600
GPUs fed the largest job's figures (bench/inplace_goodput.py).

    .venv/bin/python bench/resume.py [--goodput-min 5] [--only SECTION,...] [--inplace-nodes 4,32]
        [--inplace-faults node-kill,rank-crash,hang]
    (brings its own cluster up and down: 5 nodes, or one more than the most --inplace-nodes;
    sections: floor, faults, warning, goodput, correlated, inplace)

The warning is delivered as Slurm delivers `--signal=B:USR1@lead` (scancel --batch --signal=USR1)
so its moment is known; the real time-limit path is covered by the fault tests.
"""
from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import inplace_resume  # bench/, beside this file
from resume_jobs import (BENCH_CLUSTER, BENCH_STATE_DIR, REPO, breakdown, current_nodes, events, finished,
                         resume_drained, show, signal_rank, spec, step_reached, submit, victim_of, wait)
from slurmtools.common import ledger
from slurmtools.common.control_dir import control_dir_for
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import faults as mc_faults
from slurmtools.requeue import goodput
from slurmtools.slurm import commands as slurm

SECTIONS = ("floor", "faults", "warning", "goodput", "correlated", "inplace")


def one_fault(layout, work: Path, fault: str, path: str) -> Dict[str, float]:
    """Run a job, inject the fault at step 12, wait for the end; the breakdown."""
    in_place = path == "in-allocation"
    requeue: Dict[str, Any] = {"in_allocation": in_place}
    extra: List[str] = []
    if fault == "node kill with a spare":
        requeue["spare_nodes"] = 1
    if fault == "node kill" and in_place:
        requeue["min_nodes"] = 1          # no spare: go on with fewer nodes
    if fault == "hung rank":
        extra, requeue["hang_timeout_s"] = ["--hang-at-step", "3:12"], 10
        if in_place:
            requeue["spare_nodes"] = 1    # the hung rank's node is blamed: a spare takes its place
    s = spec(work, f"{fault.replace(' ', '-')}-{path}", extra, **requeue)
    job = submit(s)
    victim = None
    if fault == "hung rank":
        wait(lambda: finished(job), 400, f"{fault} run")
        evts = events(s, job)
        hang = next(e for e in evts if e.get("slurmtools") == "hang")
        fault_t = hang["t"] - hang["idle_s"]
    else:
        wait(lambda: step_reached(s, job, 12), 120, "step 12")
        fault_t = time.time()
        if fault == "crash after progress":
            wait(lambda: signal_rank(job, "3"), 10, "a rank to kill")
        else:
            victim = victim_of(s, job)
            mc_faults.kill_node(layout, victim)
        wait(lambda: finished(job), 400, f"{fault} run")
        evts = events(s, job)
    if victim:
        mc_faults.restart_node(layout, victim)
    resume_drained()
    wait(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 90, "nodes idle")
    b = breakdown(evts, fault_t)
    show(f"{fault}, {path}", b)
    return b


def requeued_at(job: int, timeout_s: float) -> float:
    """When Slurm took the job back into the queue (its batch host died): polled at 0.1 s."""
    wait(lambda: slurm.job_state(job).state in ("PENDING", "REQUEUED", "CONFIGURING") or finished(job), timeout_s,
         "Slurm's requeue")
    return time.time()


def correlated_fault(layout, work: Path, fault: str) -> Dict[str, float]:
    """A 3-node x 1-process job; the fault at step 12; the breakdown (the nodes restored after)."""
    requeue: Dict[str, Any] = {"spare_nodes": 2} if "spares" in fault else {}
    s = spec(work, fault.replace(" ", "-").replace(",", ""), ["--no-async-checkpoint"], nodes=3,
             processes_per_node=1, **requeue)
    job = submit(s)
    wait(lambda: step_reached(s, job, 12), 120, "step 12")
    nodes = current_nodes(s, job)
    victims = {"one node killed, requeue": nodes[1:2], "batch host killed, requeue": nodes[:1]}.get(fault, nodes[1:])
    fault_t = time.time()
    for node in victims:
        mc_faults.kill_node(layout, node)
    decided_t = requeued_at(job, 400) if nodes[0] in victims else 0.0
    wait(lambda: finished(job), 400, f"{fault} run")
    evts = events(s, job)
    for node in victims:
        mc_faults.restart_node(layout, node)
    wait(lambda: all(n.state == "idle" and not n.flags or n.drained for n in slurm.nodes()), 90, "nodes back")
    resume_drained()
    wait(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 90, "nodes idle")
    b = breakdown(evts, fault_t, decided_t)
    show(f"{fault} ({slurm.job_state(job).state})", b)
    return b


def goodput_run(layout, work: Path, name: str, steps: int, faults: bool) -> float:
    s = spec(work, name, steps=steps, spare_nodes=1, min_nodes=1, hang_timeout_s=10, max_restarts=10)
    t0 = time.time()
    job = submit(s)
    if faults:
        marks = [steps // 4, steps // 2, 3 * steps // 4]
        wait(lambda: step_reached(s, job, marks[0]), 600, f"step {marks[0]}")
        wait(lambda: signal_rank(job, "3"), 10, "a rank to kill")                       # crash
        wait(lambda: step_reached(s, job, marks[1]), 600, f"step {marks[1]}")
        wait(lambda: signal_rank(job, "1", signal.SIGSTOP), 10, "a rank to stop")   # hung rank
        wait(lambda: step_reached(s, job, marks[2]), 600, f"step {marks[2]}")
        victim = current_nodes(s, job)[1]
        mc_faults.kill_node(layout, victim)                                                  # node kill
        wait(lambda: finished(job), 900, f"{name} run")
        mc_faults.restart_node(layout, victim)
    else:
        wait(lambda: finished(job), 900, f"{name} run")
    wall = time.time() - t0
    g = goodput.goodput(ledger.read(control_dir_for(s.checkpoint_dir, s.output_dir, str(job))))
    print(f"{name}: {steps} steps, submit -> done {wall:.1f} s; ledger: {g.attempts} attempts, steps lost "
          f"{g.steps_lost}, restart latency {', '.join(f'{x:.1f}' for x in g.restart_latency_s) or '-'} s, "
          f"effective training time ratio {g.ratio:.1%}; state {slurm.job_state(job).state}", flush=True)
    resume_drained()
    wait(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 90, "nodes idle")
    return wall


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goodput-min", type=float, default=5.0, help="length of the goodput runs (minutes)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}")
    parser.add_argument("--inplace-nodes", default="4,32", help="node counts of the inplace section, comma-separated")
    parser.add_argument("--inplace-faults", default=",".join(inplace_resume.FAULTS),
                        help=f"faults of the inplace section, of {','.join(inplace_resume.FAULTS)}")
    args = parser.parse_args()
    inplace_faults = args.inplace_faults.split(",")
    if not inplace_faults or set(inplace_faults) - set(inplace_resume.FAULTS):
        raise SystemExit(f"bench/resume.py: --inplace-faults: expected some of {','.join(inplace_resume.FAULTS)}, "
                         f"got {args.inplace_faults!r}")
    try:
        inplace_nodes = [int(n) for n in args.inplace_nodes.split(",")]
    except ValueError:
        raise SystemExit(f"bench/resume.py: --inplace-nodes: expected node counts like 4,32, got {args.inplace_nodes!r}")
    if any(n < 2 or n > 128 for n in inplace_nodes):
        raise SystemExit(f"bench/resume.py: --inplace-nodes: each count from 2 to 128, got {args.inplace_nodes}")
    only = args.only.split(",")
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"bench/resume.py: --only: {','.join(unknown)} is not a section ({','.join(SECTIONS)})")
    mc.down(mc.find_layout(BENCH_CLUSTER, BENCH_STATE_DIR), purge=True)
    # 5 nodes: a 3-node job with two spares; a 2-node job with a spare requeued without a dead node
    nodes = max(5, max(inplace_nodes) + 1) if "inplace" in only else 5
    layout = mc.layout_for_up(BENCH_CLUSTER, BENCH_STATE_DIR, nodes=nodes, gpus_per_node=4,
                              prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
    mc.up(layout, install=True, wait_s=120)
    os.environ["SLURM_CONF"] = str(layout.slurm_conf)
    work = Path(tempfile.mkdtemp(prefix="slurmtools-bench-"))
    work.chmod(0o755)
    try:
        run_sections(layout, work, only, args.goodput_min, inplace_nodes, inplace_faults)
    finally:
        for j in slurm.run_slurm(["squeue", "-h", "-o", "%i"]).split():
            slurm.cancel(int(j))
        mc.down(layout, purge=True)


def run_sections(layout, work: Path, only: List[str], goodput_min: float, inplace_nodes: List[int],
                 inplace_faults: List[str]) -> None:
    if "floor" in only:
        floor_job = slurm.submit("#!/bin/bash\n#SBATCH -N2 --requeue -o /dev/null\nsrun sleep 300\n")
        wait(lambda: slurm.job_state(floor_job).state == "RUNNING", 30, "floor job")
        t0 = time.time()
        slurm.requeue(floor_job)
        wait(lambda: slurm.job_state(floor_job).state == "PENDING", 30, "requeue")
        wait(lambda: slurm.job_state(floor_job).state == "RUNNING", 60, "rerun")
        print(f"Slurm's floor: scontrol requeue -> RUNNING again {time.time() - t0:.1f} s "
              f"(cred_expire=10 s + 1 s + scheduling)", flush=True)
        slurm.cancel(floor_job)
        wait(lambda: finished(floor_job), 30, "cancel")

    if "faults" in only:
        for fault in ("crash after progress", "hung rank", "node kill", "node kill with a spare"):
            in_place = one_fault(layout, work, fault, "in-allocation")
            requeued = one_fault(layout, work, fault, "requeue")
            print(f"ratio {fault.replace(' ', '-')} {in_place['total'] / requeued['total']:.2f}", flush=True)

    if "warning" in only:
        s = spec(work, "warning")
        job = submit(s)
        wait(lambda: step_reached(s, job, 12), 120, "step 12")
        fault = time.time()
        slurm.run_slurm(["scancel", "--batch", "--signal=USR1", str(job)])
        wait(lambda: finished(job), 300, "warning run")
        show("warning signal (requeue, not counted)", breakdown(events(s, job), fault))

    if "goodput" in only:
        # steps for about goodput_min minutes failure-free at the step time measured on 2 cores
        # (0.25 s sleep + compute + checkpoints: 400 steps took 160 s on 2026-11-30)
        steps = max(40, int(goodput_min * 60 / 0.40))
        free = goodput_run(layout, work, "failure-free", steps, faults=False)
        faulty = goodput_run(layout, work, "three-failures", steps, faults=True)
        print(f"goodput: three failures (crash, hung rank, node kill) cost {faulty - free:.1f} s over "
              f"{free:.1f} s failure-free: {free / faulty:.1%} of the failure-free speed", flush=True)

    if "correlated" in only:
        single = correlated_fault(layout, work, "one node killed, requeue")
        for fault in ("two nodes killed at once, requeue", "two nodes killed at once, two spares",
                      "batch host killed, requeue"):
            b = correlated_fault(layout, work, fault)
            print(f"ratio {fault.split(',')[0].replace(' ', '-')}{'-spares' if 'spares' in fault else ''} "
                  f"{b['total'] / single['total']:.2f}", flush=True)

    if "inplace" in only:
        inplace_resume.section(layout, work, inplace_nodes, inplace_faults)


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/resume.py needs root (it runs the mini-cluster)")
    main()
