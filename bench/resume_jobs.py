"""The mini-cluster jobs bench/resume.py and bench/inplace_resume.py run: a reference-trainer job
spec, its submission and events, a fault's breakdown from the supervisor's and the trainer's
timestamped lines, and the cluster's state between runs."""
from __future__ import annotations

import functools
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurmtools.common.fsutil import json_lines  # noqa: E402
from slurmtools.job import submit as jobs  # noqa: E402
from slurmtools.minicluster.layout import whole_node_task_cpus  # noqa: E402
from slurmtools.slurm import commands as slurm  # noqa: E402
from slurmtools.spec import spec_from_dict  # noqa: E402

TRAIN = REPO / "examples" / "tiny_fsdp" / "train.py"
BENCH_CLUSTER = "resume"
BENCH_STATE_DIR = Path("/var/tmp/slurmtools-bench-resume")
STEPS = 40
# in-memory snapshots every step: a replacement restores from its peer's replica, not from disk
SNAPSHOTS_EVERY_STEP = {"snapshot_every_steps": 1, "snapshot_memory_gb": 1, "snapshot_max_overhead_pct": 0}


def wait(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(interval_s)
    raise SystemExit(f"timed out waiting for {what}")


@functools.lru_cache(maxsize=None)
def node_cpus() -> int:
    """CPUs of one node of the cluster SLURM_CONF names, as Slurm has them (each node is this
    machine). A job's tasks take them all, as a production training job takes whole nodes: with
    Slurm's 1 CPU a task every rank of every node was bound to CPU 0 while CPU 1 idled, and the
    figures were those of one core (docs/minicluster.md, "Every job on CPU 0")."""
    return min(int(cpus) for cpus in slurm.run_slurm(["sinfo", "-h", "-o", "%c"]).split())


def spec(work: Path, name: str, extra: List[str] = (), steps: int = STEPS, nodes: int = 2, processes_per_node: int = 2,
         top: Optional[Dict[str, Any]] = None, **requeue: Any):
    launcher = (top or {}).get("launcher", "torchrun")
    return spec_from_dict({
        "cpus_per_task": whole_node_task_cpus(node_cpus(), launcher, processes_per_node),
        # no preflight: a start-up check, not part of a recovery, and on 2 cores it named a healthy
        # node of 32 slow (its best link 2.3 Gb/s, the median 5.4: 33 nodes' pairs measured at once),
        # which took the spare the node kill was to use (docs/recovery.md); the suite's jobs likewise
        "preflight": False,
        **(top or {}),
        "name": name, "nodes": nodes, "processes_per_node": processes_per_node, "python": sys.executable,
        "time_limit_min": 30,
        "command": [str(TRAIN), "--steps", str(steps), "--checkpoint-every", "5", "--step-sleep-s", "0.25", *extra],
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


def breakdown(evts: List[Dict[str, Any]], fault_t: float, decided_t: float = 0.0) -> Dict[str, float]:
    """Phases from the supervisor's and trainer's timestamped JSON lines; decided_t: when Slurm
    requeued a job whose supervisor died with its batch host (no decision line of its own)."""
    decision = ({"t": decided_t} if decided_t else
                next(e for e in evts if e.get("slurmtools") == "decision" and e["t"] >= fault_t - 1))
    start = next(e for e in evts if e.get("slurmtools") == "start" and e["t"] > decision["t"])
    resumed = next(e for e in evts if e.get("event") == "resumed" and e["t"] > start["t"])
    first = next(e for e in evts if "loss" in e and e["t"] > resumed["t"])
    load_s = resumed["load_s"]
    return {"detect": decision["t"] - fault_t, "wait": start["t"] - decision["t"],
            "launch": resumed["t"] - load_s - start["t"], "checkpoint load": load_s,
            "first step": first["t"] - resumed["t"], "total": first["t"] - fault_t,
            "steps lost": float(max(e["step"] for e in evts if "loss" in e and e["t"] < decision["t"])
                                - resumed["step"])}


def show(label: str, b: Dict[str, float]) -> None:
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in b.items() if k not in ("total", "steps lost"))
    print(f"{label}: fault -> first resumed step {b['total']:.1f} s ({parts}); steps lost {int(b['steps lost'])}",
          flush=True)


def signal_rank(job: int, rank: str, sig: int = signal.SIGKILL) -> bool:
    """Send sig to one rank's training process (SIGKILL: a crash; SIGSTOP, all its threads: a hang)."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if not any(str(TRAIN) == c for c in cmd) or "slurmtools.train.standby" in cmd:
                continue              # a warm standby's environment names no rank of its own
            env = p.environ()
            if env.get("SLURM_JOB_ID") == str(job) and env.get("RANK") == rank:
                p.send_signal(sig)
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def resume_drained() -> None:
    for n in slurm.nodes():
        if n.drained:
            slurm.resume_node(n.name)


def victim_of(s, job: int) -> str:
    from ClusterShell.NodeSet import NodeSet
    start = next(e for e in events(s, job) if e.get("slurmtools") == "start")
    return list(NodeSet(start["nodes"]))[1]


def current_nodes(s, job: int) -> List[str]:
    from ClusterShell.NodeSet import NodeSet
    starts = [e for e in events(s, job) if e.get("slurmtools") == "start"]
    return list(NodeSet(starts[-1]["nodes"]))
