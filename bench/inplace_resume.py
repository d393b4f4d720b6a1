"""bench/resume.py's section inplace: recovery without relaunch against the relaunch, on the
mini-cluster. Per node count, N nodes x 1 rank (the srun launcher) and a spare, snapshots every
step, at step 12: the middle node killed (its rank starts again on the spare), then the middle
node's rank killed (a crash: it starts again on its own node), then the middle node's rank hung
(`hang_timeout_s` 10 on both paths: its node replaced by the spare); each fault once with
`requeue.in_place` and once without, fault -> first resumed step split into its phases, and a line
`ratio inplace/relaunch <fault> <N> nodes <x>`. Then, per fault, a line `flat inplace <fault> ...`
over the node counts: the in-place time, its detection, and the time after the detection in the
job's own step times (the median step before the fault). The mini-cluster's N ranks share the
machine's cores, so at 32 nodes on 2 cores a step takes several times what it takes at 4 and so
does every CPU-bound phase of a recovery; in step times the recovery's own work compares across
counts as it would on a cluster whose nodes bring their own CPUs. Then the goodput simulator at
9,600 GPUs fed the largest job's figures (bench/inplace_goodput.py)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import inplace_goodput  # bench/, beside this file
from resume_jobs import (SNAPSHOTS_EVERY_STEP, breakdown, current_nodes, events, finished, resume_drained, show,
                         signal_rank, spec, step_reached, submit, wait)
from slurmtools.minicluster import faults as mc_faults
from slurmtools.slurm import commands as slurm

FAULTS = ("node-kill", "rank-crash", "hang")
HANG_TIMEOUT_S = 10          # the hang's detection, the same on both paths
# each rank's work the same at every node count: an epoch of EPOCH_STEPS steps of BATCH_PER_RANK
# samples a rank (the trainer's 256 samples make one step an epoch at 32 ranks, and every epoch
# starts each rank's data loader workers again: 64 processes forked a step)
EPOCH_STEPS = 8
BATCH_PER_RANK = 8
# the data loaded in each rank's process, as the test suite's jobs do: with the trainer's 2 loader
# workers a rank a 32-node job is ~100 processes on 2 cores (it changed the 32-node in-place figure
# by under 5 s; its 113 s were the machine's ARP table, docs/minicluster.md)
LOADER_WORKERS = 0


def one_run(layout: Any, work: Path, fault: str, nodes: int, in_place: bool) -> Dict[str, float]:
    """The job, the fault at step 12, its end; the breakdown of the path taken."""
    path = "inplace" if in_place else "relaunch"
    extra = ["--step-sleep-s", "0.5", "--batch-per-rank", str(BATCH_PER_RANK),
             "--loader-workers", str(LOADER_WORKERS),
             "--dataset-size", str(EPOCH_STEPS * BATCH_PER_RANK * nodes)]
    if fault == "hang":                       # the middle node's rank stops before its 13th step
        extra += ["--hang-at-step", f"{nodes // 2}:12"]
    s = spec(work, f"{fault}-{nodes}-{path}", extra, nodes=nodes, processes_per_node=1,
             top={"launcher": "srun", "distributed": SNAPSHOTS_EVERY_STEP}, spare_nodes=1, in_place=in_place,
             **({"hang_timeout_s": HANG_TIMEOUT_S} if fault == "hang" else {}))
    job = submit(s)
    wait(lambda: step_reached(s, job, 12), 300 + 10 * nodes, f"step 12 of {nodes} nodes")
    victim = current_nodes(s, job)[nodes // 2]
    fault_t = time.time()
    if fault == "node-kill":
        mc_faults.kill_node(layout, victim)
    elif fault == "rank-crash":               # the middle node's rank, as the kernel kills a process
        wait(lambda: signal_rank(job, str(nodes // 2)), 10, "the rank to kill")
    else:                 # it hung once step 12 was done: just after rank 0's line for that step's end
        fault_t = next(e["t"] for e in events(s, job) if "loss" in e and e["step"] == 12) + 0.001
    wait(lambda: finished(job), 600, f"{fault}, {nodes} nodes, {path}")
    evts = events(s, job)
    if fault == "node-kill":
        mc_faults.restart_node(layout, victim)
    resume_drained()
    wait(lambda: all(n.state == "idle" and not n.flags for n in slurm.nodes()), 120, "nodes idle")
    b = inplace_breakdown(evts, fault_t) if in_place else breakdown(evts, fault_t)
    show(f"{fault.replace('-', ' ')}, {nodes} nodes x 1 rank and a spare, {path}", b)
    return b


def inplace_breakdown(evts: List[Dict[str, Any]], fault_t: float) -> Dict[str, float]:
    """Phases of a recovery in place: the fault to the supervisor's in_place line (detect), to
    rank 0's resumed line (the generation formed, the rank started, its state restored), to its
    first step after it. None of it without an in_place line: the recovery failed over."""
    recovered = [e for e in evts if e.get("slurmtools") == "in_place" and e["t"] >= fault_t]
    failed = [e for e in evts if e.get("slurmtools") == "in_place_failed" and e["t"] >= fault_t]
    if failed:
        raise SystemExit(f"bench/resume.py: the recovery in place failed over to the relaunch: {failed[0]['reason']}")
    if not recovered:
        said = [e for e in evts if e.get("slurmtools") in ("in_place_refused", "in_place_failed", "rank_lost",
                                                           "decision")]
        raise SystemExit(f"bench/resume.py: no recovery in place after the fault: {said}")
    resumed = next(e for e in evts if e.get("event") == "resumed" and e["t"] > recovered[0]["t"])
    first = next(e for e in evts if "loss" in e and e["t"] > resumed["t"])
    return {"detect": recovered[0]["t"] - fault_t, "form and restore": resumed["t"] - recovered[0]["t"],
            "first step": first["t"] - resumed["t"], "step time": steady_step_s(evts, fault_t),
            "total": first["t"] - fault_t,
            "steps lost": float(max(e["step"] for e in evts if "loss" in e and e["t"] < fault_t) - resumed["step"])}


def steady_step_s(evts: List[Dict[str, Any]], fault_t: float) -> float:
    """The median time between rank 0's step lines before the fault: the job's pace on this machine
    at its node count (checkpoint steps included, the median passes over them)."""
    times = [e["t"] for e in evts if "loss" in e and e["t"] < fault_t]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def spread(values: List[float]) -> float:
    """The largest distance from the mean, as a fraction of the mean: "flat (±20 %)" is spread <= 0.2."""
    mean = statistics.fmean(values)
    return max(abs(value - mean) for value in values) / mean if mean else float("nan")


def flat_line(fault: str, by_count: Dict[int, Dict[str, float]]) -> str:
    """One line over the node counts of one fault's in-place figures: total, detection, and the time
    after the detection in step times of the job's own pace (module docstring)."""
    counts = sorted(by_count)

    def series(name: str, values: List[float], unit: str) -> str:
        return f"{name} {'/'.join(f'{value:.1f}' for value in values)}{unit} (±{spread(values):.0%})"
    totals = [by_count[n]["total"] for n in counts]
    detects = [by_count[n]["detect"] for n in counts]
    after = [(by_count[n]["total"] - by_count[n]["detect"]) / by_count[n]["step time"] for n in counts]
    steps = [by_count[n]["step time"] for n in counts]
    return (f"flat inplace {fault} {'/'.join(map(str, counts))} nodes: {series('total', totals, ' s')}; "
            f"{series('detect', detects, ' s')}; {series('after detection', after, ' step times')}; "
            f"step time {'/'.join(f'{step:.2f}' for step in steps)} s")


def section(layout: Any, work: Path, node_counts: List[int], faults: Sequence[str] = FAULTS) -> None:
    by_count: Dict[int, Dict[str, Dict[bool, Dict[str, float]]]] = {}
    for nodes in node_counts:
        found = by_count.setdefault(nodes, {})
        for fault in faults:
            found[fault] = {in_place: one_run(layout, work, fault, nodes, in_place) for in_place in (True, False)}
            ratio = found[fault][True]["total"] / found[fault][False]["total"]
            print(f"ratio inplace/relaunch {fault} {nodes} nodes {ratio:.2f}", flush=True)
            if fault == "hang":               # both wait the hang timeout: what each does after it
                after = [found[fault][way]["total"] - HANG_TIMEOUT_S for way in (True, False)]
                print(f"ratio inplace/relaunch after the hang timeout {nodes} nodes {after[0] / after[1]:.2f}",
                      flush=True)
    if len(by_count) > 1:
        for fault in faults:
            print(flat_line(fault, {nodes: found[fault][True] for nodes, found in by_count.items()}), flush=True)
    if set(faults) != set(FAULTS):
        print(f"goodput at 9,600 GPUs: not fed (it takes every fault's figures; this run: {','.join(faults)})",
              flush=True)
        return
    # the goodput simulator fed the largest job's figures
    found = by_count[max(by_count)]
    relaunched = found["node-kill"][False]
    inplace_goodput.report(relaunch_detect_s=relaunched["detect"],
                           relaunch_rest_s=relaunched["total"] - relaunched["detect"], in_place_s=found["node-kill"][True]["total"],
                           crash_in_place_s=found["rank-crash"][True]["total"],
                           hang_in_place_s=found["hang"][True]["total"] - HANG_TIMEOUT_S)
