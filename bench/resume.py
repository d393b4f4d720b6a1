#!/usr/bin/env python3
"""Recovery figures on the real mini-cluster (root): for a warning signal (a), a node kill (c)
and a hung rank (f), seconds from the fault to the first resumed step, split into
detect / requeue wait / launch / checkpoint load / first step, beside Slurm's own floor
(scontrol requeue -> running, measured in the same run); steps lost; and the goodput of a run
with 3 injected crashes against the failure-free run.

    .venv/bin/python bench/resume.py          (about 6 minutes; brings its own cluster up and down)

The warning is delivered as Slurm delivers `--signal=B:USR1@lead` (scancel --batch --signal=USR1)
so its moment is known; the real time-limit path is covered by the fault tests.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurmtools import jobs, slurm  # noqa: E402
from slurmtools.fsutil import json_lines  # noqa: E402
from slurmtools.minicluster import cluster as mc  # noqa: E402
from slurmtools.requeue import ledger  # noqa: E402
from slurmtools.runtime import control_dir_for  # noqa: E402
from slurmtools.spec import spec_from_dict  # noqa: E402

TRAIN = REPO / "examples" / "tiny_fsdp" / "train.py"
STEPS = 40


def wait(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(interval_s)
    raise SystemExit(f"timed out waiting for {what}")


def spec(work: Path, name: str, extra: List[str] = (), **requeue: Any):
    return spec_from_dict({
        "name": name, "nodes": 2, "processes_per_node": 2, "python": sys.executable, "time_limit_min": 15,
        "command": [str(TRAIN), "--steps", str(STEPS), "--checkpoint-every", "5", "--step-sleep-s", "0.25", *extra],
        "output_dir": str(work / name / "logs"), "checkpoint_dir": str(work / name / "ckpt"),
        "requeue": dict({"hang_timeout_s": 120, "backoff_s": 0, "warning_lead_s": 60, "checkpoint_grace_s": 30,
                         "max_restarts": 5, "max_consecutive_failures": 5, "no_progress_restarts": 5}, **requeue)})


def submit(s) -> int:
    return jobs.submit_spec(s, slurmtools_cmd=[sys.executable, "-m", "slurmtools"])


def events(s, job: int) -> List[Dict[str, Any]]:
    p = Path(s.output_dir) / f"{s.name}-{job}.out"
    return json_lines(p.read_text()) if p.exists() else []


def finished(job: int) -> bool:
    return slurm.job_state(job).finished


def step_reached(s, job: int, step: int) -> bool:
    return any(e.get("step", 0) >= step and "loss" in e for e in events(s, job))


def breakdown(evts: List[Dict[str, Any]], fault_t: float) -> Dict[str, float]:
    """Phases from the supervisor's and trainer's timestamped JSON lines."""
    decision = next(e for e in evts if e.get("slurmtools") == "decision" and e["t"] >= fault_t - 1)
    start = next(e for e in evts if e.get("slurmtools") == "start" and e["t"] > decision["t"])
    resumed = next(e for e in evts if e.get("event") == "resumed" and e["t"] > start["t"])
    first = next(e for e in evts if "loss" in e and e["t"] > resumed["t"])
    load_s = resumed["load_s"]
    return {"detect": decision["t"] - fault_t, "requeue wait": start["t"] - decision["t"],
            "launch": resumed["t"] - load_s - start["t"], "checkpoint load": load_s,
            "first step": first["t"] - resumed["t"], "total": first["t"] - fault_t,
            "steps lost": float(max(e["step"] for e in evts if "loss" in e and e["t"] < decision["t"])
                                - resumed["step"])}


def show(label: str, b: Dict[str, float]) -> None:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in b.items() if k not in ("total", "steps lost"))
    print(f"{label}: fault -> first resumed step {b['total']:.1f} s ({parts}); steps lost {int(b['steps lost'])}")


def kill_rank(job: int, rank: str) -> bool:
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if not any(str(TRAIN) == c for c in cmd):
                continue
            env = p.environ()
            if env.get("SLURM_JOB_ID") == str(job) and env.get("RANK") == rank:
                p.send_signal(signal.SIGKILL)
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def main() -> None:
    mc.down(mc.find_layout("resume", Path("/var/tmp/slurmtools-bench-resume")), purge=True)
    layout = mc.layout_for_up("resume", Path("/var/tmp/slurmtools-bench-resume"), nodes=3, gpus_per_node=4,
                              prolog_dir=REPO / "prolog.d", epilog_dir=REPO / "epilog.d")
    mc.up(layout, install=True, wait_s=120)
    os.environ["SLURM_CONF"] = str(layout.slurm_conf)
    work = Path(tempfile.mkdtemp(prefix="slurmtools-bench-"))
    work.chmod(0o755)
    try:
        floor_job = slurm.submit("#!/bin/bash\n#SBATCH -N2 --requeue -o /dev/null\nsrun sleep 300\n")
        wait(lambda: slurm.job_state(floor_job).state == "RUNNING", 30, "floor job")
        t0 = time.time()
        slurm.requeue(floor_job)
        wait(lambda: slurm.job_state(floor_job).state == "PENDING", 30, "requeue")
        wait(lambda: slurm.job_state(floor_job).state == "RUNNING", 60, "rerun")
        print(f"Slurm's floor: scontrol requeue -> RUNNING again {time.time() - t0:.1f} s "
              f"(cred_expire=10 s + 1 s + scheduling)")
        slurm.cancel(floor_job)
        wait(lambda: finished(floor_job), 30, "cancel")

        free = spec(work, "failure-free")
        t0 = time.time()
        job = submit(free)
        wait(lambda: finished(job), 300, "failure-free run")
        free_wall = time.time() - t0
        g_free = ledger.goodput(ledger.read(control_dir_for(free.checkpoint_dir, free.output_dir, str(job))))
        print(f"failure-free run: {STEPS} steps, submit -> done {free_wall:.1f} s, "
              f"effective training time ratio {g_free.ratio:.1%}")

        s = spec(work, "warning")
        job = submit(s)
        wait(lambda: step_reached(s, job, 12), 120, "step 12")
        fault = time.time()
        slurm.run_slurm(["scancel", "--batch", "--signal=USR1", str(job)])
        wait(lambda: finished(job), 300, "warning run")
        show("a) warning signal", breakdown(events(s, job), fault))

        s = spec(work, "nodekill")
        job = submit(s)
        wait(lambda: step_reached(s, job, 12), 120, "step 12")
        from ClusterShell.NodeSet import NodeSet
        victim = list(NodeSet(slurm.job_state(job).nodes))[1]
        fault = time.time()
        mc.kill_node(layout, victim)
        wait(lambda: finished(job), 400, "node-kill run")
        show(f"c) node kill ({victim})", breakdown(events(s, job), fault))
        mc.restart_node(layout, victim)
        wait(lambda: all(n.state == "idle" for n in slurm.nodes()), 60, "nodes idle")

        s = spec(work, "hang", ["--hang-at-step", "3:12"], hang_timeout_s=10)
        job = submit(s)
        wait(lambda: finished(job), 300, "hang run")
        evts = events(s, job)
        hang = next(e for e in evts if e.get("slurmtools") == "hang")
        show(f"f) hung rank (hang_timeout_s=10, on {hang['host']})", breakdown(evts, hang["t"] - hang["idle_s"]))
        for n in slurm.nodes():
            if n.drained:
                slurm.resume_node(n.name)

        s = spec(work, "three-crashes")
        t0 = time.time()
        job = submit(s)
        for k, at in enumerate((8, 18, 28)):
            wait(lambda: slurm.job_state(job).restarts == k and step_reached(s, job, at), 240, f"step {at}")
            wait(lambda: kill_rank(job, "3"), 10, "a rank to kill")
        wait(lambda: finished(job), 400, "3-crash run")
        wall = time.time() - t0
        g = ledger.goodput(ledger.read(control_dir_for(s.checkpoint_dir, s.output_dir, str(job))))
        print(f"3 injected crashes: submit -> done {wall:.1f} s vs {free_wall:.1f} s failure-free "
              f"({free_wall / wall:.1%} of the failure-free speed); ledger: {g.attempts} attempts, "
              f"steps lost {g.steps_lost}, restart latency {', '.join(f'{x:.1f}' for x in g.restart_latency_s)} s, "
              f"effective training time ratio {g.ratio:.1%} (failure-free {g_free.ratio:.1%})")
    finally:
        for j in slurm.run_slurm(["squeue", "-h", "-o", "%i"]).split():
            slurm.cancel(int(j))
        mc.down(layout, purge=True)


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("bench/resume.py needs root (it runs the mini-cluster)")
    main()
