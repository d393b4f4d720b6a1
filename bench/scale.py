#!/usr/bin/env python3
"""The job's control plane at 1,000-64,000 ranks: what one rank costs the shared control directory,
and what one supervisor pass over every rank's heartbeat costs, with one heartbeat file per rank
(the old way, and what a rank without a local rank still does) and gathered per node (node_beat).

    .venv/bin/python bench/scale.py [--ranks 1000,8000,64000] [--ranks-per-node 8] [--passes 5] [--only heartbeats|attribution]
                                     [--fr-entries 2000] [--raw-dumps 100] [--dir D]

No torch and no cluster: the real code paths with simulated ranks.
- Per rank: one real `TrainingControl` with a control dir, a 1-s step for `--rank-seconds` seconds
  (heartbeat at each step, the checkpoint-request check as the reference trainer does, its
  keep-alive thread), without a local rank, as local rank 0 and as local rank 1: the metadata
  operations (creates, renames, chmods, stats) and bytes it puts on the control dir per second,
  counted by wrapping the os calls it makes.
- Per supervisor pass, with every rank's heartbeat written by the runtime's own writers (per rank,
  or through node_beat.NodeBeats into node memory and one file per node): `watchdog.scan_heartbeats`
  + `watchdog.judge` + one `StragglerWatch.observe`, the median of --passes (page-cached: a network
  file system adds a round trip per file), and the peak memory of the pass (tracemalloc).
Printed per size: the pass, the supervisor's share of one core (a pass, then its sleep:
observe.pace_s), the worst time to detect a dead node (node_timeout_s + 2 passes + a sleep), the
control dir's metadata operations and bytes per second; the step log's bytes a second and a day
(the real StepLog, each rank's file or gathered per node: node_steps.py); the time to name a rank
whose process stopped (watchdog.silent_rank, timed on every rank's beat); then `goal` lines for
8,000 ranks gathered per node (supervisor <= 10% of one core; detection <= node_timeout_s + 2 s).
- Attribution of a hang by the flight recorders: each rank reduces its own dump (fr_dump.py; the
  dump built in torch's format with --fr-entries entries: a real torch 2.13 gloo dump of 2,000
  entries is 228 KB and its parse took 84 ms here), local rank 0 gathers the node's records
  (node_beat.NodeBeats), the supervisor reads them (flightrec.read_reduced) and names the laggard:
  the rank's and the supervisor's time, the supervisor's peak memory (tracemalloc, a separate
  pass), and the time from the request to the verdict at worst (three heartbeat intervals: marker
  mirrored, seen, gathered; then a supervisor pass). Beside it the full dumps torch writes itself on
  an NCCL timeout, read and reduced by the supervisor one at a time (--raw-dumps of them): per dump,
  and how many of 8,000 its 30-s budget reads. Then `goal attribution` for 8,000 ranks.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_attribution import attributions  # noqa: E402

from slurmtools.common.control_dir import HEARTBEAT_DIR, HEARTBEAT_INTERVAL_S
from slurmtools.common.fsutil import write_json_atomic  # noqa: E402
from slurmtools.requeue import flightrec, straggler, watchdog  # noqa: E402
from slurmtools.requeue.observe import pace_s  # noqa: E402
from slurmtools.requeue.supervisor import SupervisorConfig  # noqa: E402
from slurmtools.train.control import TrainingControl  # noqa: E402
from slurmtools.train.node_beat import NODE_LOCAL_DIR_ENV, NodeBeats, node_dir  # noqa: E402
from slurmtools.train.steplog import StepLog  # noqa: E402

NODE_TIMEOUT_S = 10.0            # the spec's floor for node_timeout_s (4x the median step, at least 10 s)


def per_rank_load(control: Path, seconds: int, local_rank: Optional[int], node_memory: Path) -> Dict[str, float]:
    """Metadata operations and bytes per second one rank puts on the control dir at a 1-s step;
    with a local rank, its heartbeats are gathered per node (node_beat) in node_memory."""
    counts = {"create": 0, "rename": 0, "chmod": 0, "stat": 0, "bytes": 0}
    lock = threading.Lock()
    root = str(control)
    real = {"open": os.open, "replace": os.replace, "fchmod": os.fchmod, "stat": os.stat, "write": os.write}

    def count(kind: str, amount: int = 1) -> None:
        with lock:
            counts[kind] += amount

    created: set = set()             # descriptors of files created in the control dir

    def counting_open(path, flags, *args, **kwargs):        # type: ignore[no-untyped-def]
        fd = real["open"](path, flags, *args, **kwargs)
        if str(path).startswith(root) and flags & os.O_CREAT:
            count("create")
            created.add(fd)
        else:
            created.discard(fd)
        return fd

    def counting_replace(src, dst, *args, **kwargs):       # type: ignore[no-untyped-def]
        if str(dst).startswith(root):
            count("rename")
            count("bytes", real["stat"](src).st_size)
        return real["replace"](src, dst, *args, **kwargs)

    def counting_fchmod(fd, mode):                          # type: ignore[no-untyped-def]
        if fd in created:
            count("chmod")
        return real["fchmod"](fd, mode)

    def counting_stat(path, *args, **kwargs):              # type: ignore[no-untyped-def]
        if str(path).startswith(root):
            count("stat")
        return real["stat"](path, *args, **kwargs)

    saved = {name: os.environ.get(name) for name in ("LOCAL_RANK", "SLURM_LOCALID", NODE_LOCAL_DIR_ENV)}
    os.environ.pop("SLURM_LOCALID", None)
    if local_rank is None:
        os.environ.pop("LOCAL_RANK", None)
    else:
        os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ[NODE_LOCAL_DIR_ENV] = str(node_memory)
    os.open, os.replace, os.fchmod, os.stat = counting_open, counting_replace, counting_fchmod, counting_stat  # type: ignore[assignment]
    try:
        rank = TrainingControl(control_dir=control, rank=local_rank or 0)
        t0 = time.monotonic()
        step = 0
        while time.monotonic() - t0 < seconds:
            rank.heartbeat(step)
            rank.checkpoint_requested()
            time.sleep(1.0)
            step += 1
        elapsed = time.monotonic() - t0
    finally:
        os.open, os.replace, os.fchmod, os.stat = real["open"], real["replace"], real["fchmod"], real["stat"]  # type: ignore[assignment]
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
    return {kind: value / elapsed for kind, value in counts.items()}


def write_heartbeats(control: Path, ranks: int, ranks_per_node: int, step: int, busy_s: float,
                     node_memory: Optional[Path]) -> None:
    """Every rank's heartbeat as TrainingControl writes it (same writer, same record shape): one
    file per rank, or with node_memory gathered into one file per node by node_beat's own code."""
    beat_dir = control / HEARTBEAT_DIR
    beat_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for rank in range(ranks):
        host = f"node{rank // ranks_per_node:05d}"
        record = {"rank": rank, "host": host, "step": step, "time": now,
                  "first_progress_t": now - 60.0, "attempt_id": "1.0", "busy_s": round(busy_s * step, 6),
                  "alive": now}
        if node_memory is None:
            write_json_atomic(beat_dir / f"{rank}.json", record, durable=False)
            continue
        directory = node_dir(node_memory, control, "1.0", host)
        assert directory is not None
        last_of_node = rank % ranks_per_node == ranks_per_node - 1 or rank == ranks - 1
        NodeBeats(control, directory, rank, host, last_of_node, ()).write(record, beat_dir, now)


def supervisor_pass(control: Path, watch: straggler.StragglerWatch, ranks: int) -> int:
    """What the supervisor does with the heartbeats each poll; how many it read."""
    beats, _ = watchdog.scan_heartbeats(control)
    watchdog.judge(beats, time.time(), 600.0, ranks)
    watch.observe(beats)
    return len(beats)


def measure(base: Path, ranks: int, ranks_per_node: int, passes: int, node_memory: Optional[Path]
            ) -> Dict[str, float]:
    control = Path(tempfile.mkdtemp(prefix=f"scale{ranks}-", dir=base))
    try:
        t0 = time.perf_counter()
        write_heartbeats(control, ranks, ranks_per_node, 10, 0.01, node_memory)
        write_s = time.perf_counter() - t0
        watch = straggler.StragglerWatch(1.3, 3, 10)
        supervisor_pass(control, watch, ranks)                  # the first window starts here
        times: List[float] = []
        peak = 0
        for index in range(passes + 1):
            write_heartbeats(control, ranks, ranks_per_node, 20 + 10 * index, 0.01, node_memory)
            if index == passes:          # memory apart: tracemalloc makes every allocation slower
                tracemalloc.start()
                supervisor_pass(control, watch, ranks)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                break
            t1 = time.perf_counter()
            beats = supervisor_pass(control, watch, ranks)
            times.append(time.perf_counter() - t1)
            assert beats == ranks, f"the pass read {beats} of {ranks} heartbeats"
        return {"write_s": write_s, "pass_s": statistics.median(times), "peak_mb": peak / 1e6}
    finally:
        shutil.rmtree(control, ignore_errors=True)
        if node_memory is not None:
            shutil.rmtree(node_memory, ignore_errors=True)


def step_log_bytes(base: Path, ranks_per_node: int, steps: int = 20) -> Dict[str, float]:
    """Bytes the step log puts on the control dir per node and step: each rank's lines (the
    tiny trainer's numbers) in its own file, or gathered per node (node_steps.py), by the real StepLog."""
    out = {}
    for mode in ("per rank", "gathered per node"):
        work = Path(tempfile.mkdtemp(prefix="steps-", dir=base))
        node = work / "shm" / "node00001" if mode != "per rank" else None
        if node is not None:
            node.mkdir(parents=True)
        logs = [StepLog(work / "control", "1234567.0", 8000 + rank, "node00001", node_dir=node, gathers=rank == 0)
                for rank in range(ranks_per_node)]
        for step in range(1000, 1000 + steps):
            for log in logs:
                log.step(step, 0.512345, loss=2.345678, tokens=4096, collective_s=0.123456, data_wait_s=0.001234)
        for log in [*logs[1:], logs[0]]:
            log.flush()
        out[mode] = sum(path.stat().st_size for path in (work / "control").rglob("*.jsonl")) / steps
        shutil.rmtree(work, ignore_errors=True)
    return out


def silent_rank(ranks: int, ranks_per_node: int, period_s: float) -> Dict[str, float]:
    """A rank whose process stopped (no steps, no keep-alive, no flight record) among `ranks` that
    wait for it: the real watchdog.silent_rank on every rank's beat, timed; and the worst time from
    its stop to the verdict: the stall (hang_timeout_s), then a pass asks for the records, the
    others' arrive within three heartbeat intervals, the wait ends DUMP_WAIT_S after the last one
    seen, and the pass after that names it (a pass and its sleep, period_s, at each step)."""
    now = time.time()
    stopped = ranks // 2 + 3
    beats = [watchdog.Beat(rank, f"node{rank // ranks_per_node:05d}", 500, now - 40.0,
                           alive_s=now - (40.0 if rank == stopped else 0.5)) for rank in range(ranks)]
    stall = watchdog.judge(beats, now, 30.0, ranks)
    assert stall is not None and stall.rank is None
    t0 = time.perf_counter()
    named = watchdog.silent_rank(stall, beats, now)
    named_s = time.perf_counter() - t0
    assert named.rank == stopped, named
    return {"named_s": named_s, "after_timeout_s": period_s + 3 * HEARTBEAT_INTERVAL_S + period_s
            + flightrec.DUMP_WAIT_S + period_s}


def ops(load: Dict[str, float]) -> float:
    return load["create"] + load["rename"] + load["chmod"] + load["stat"]


def busy_share(pass_s: float, poll_s: float) -> float:
    """The supervisor's share of one core: a pass, then its sleep (observe.pace_s), again and again."""
    return pass_s / (pass_s + pace_s(poll_s, pass_s))


def detection_s(pass_s: float, poll_s: float) -> float:
    """Worst case after node_timeout_s: the timeout ends just after a pass read the beats, so the
    next pass, after the sleep, sees it and must finish. Gathered per node, a dead node's last
    file holds records up to one heartbeat interval old, so its silence is seen no later."""
    return 2 * pass_s + pace_s(poll_s, pass_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1000,8000,64000")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rank-seconds", type=int, default=5)
    ap.add_argument("--only", choices=("heartbeats", "attribution"), help="measure one part only")
    ap.add_argument("--fr-entries", type=int, default=2000, help="entries in each flight-recorder dump")
    ap.add_argument("--raw-dumps", type=int, default=100, help="full dumps read to time the supervisor's own reduction")
    ap.add_argument("--dir", default=None, help="where the control dirs go (default: a temporary directory)")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="slurmtools-scale-"))
    poll_s = SupervisorConfig.poll_s          # the dataclass default: the cadence of a supervisor pass
    if args.only != "attribution":
        heartbeats(args, base, poll_s)
    if args.only != "heartbeats":
        attributions(args, base, poll_s)
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


def heartbeats(args: argparse.Namespace, base: Path, poll_s: float) -> None:
    loads = {}
    for mode, local in (("per rank", None), ("gathered, local rank 0", 0), ("gathered, other ranks", 1)):
        load_dir = Path(tempfile.mkdtemp(prefix="rank-", dir=base))
        (load_dir / "shm").mkdir()                  # node memory, like /dev/shm
        loads[mode] = per_rank_load(load_dir / "control", args.rank_seconds, local, load_dir / "shm")
        shutil.rmtree(load_dir, ignore_errors=True)
        load = loads[mode]
        print(f"one rank at a 1-s step, heartbeats {mode}: {ops(load):.1f} metadata operations/s on the control "
              f"dir (creates {load['create']:.1f}, renames {load['rename']:.1f}, chmods {load['chmod']:.1f}, "
              f"stats {load['stat']:.1f}), {load['bytes']:.0f} bytes/s")
    results: Dict[str, Dict[int, Dict[str, float]]] = {}
    for mode in ("per rank", "gathered per node"):
        for ranks in [int(x) for x in args.ranks.split(",")]:
            memory = Path(tempfile.mkdtemp(prefix="shm-", dir=base)) if mode != "per rank" else None
            row = measure(base, ranks, args.ranks_per_node, args.passes, memory)
            results.setdefault(mode, {})[ranks] = row
            nodes = -(-ranks // args.ranks_per_node)
            if mode == "per rank":
                meta, written = ops(loads["per rank"]) * ranks, loads["per rank"]["bytes"] * ranks
            else:
                meta = ops(loads["gathered, local rank 0"]) * nodes + ops(loads["gathered, other ranks"]) * (ranks - nodes)
                written = loads["gathered, local rank 0"]["bytes"] * nodes
            files = ranks if mode == "per rank" else nodes
            print(f"{mode}: {ranks} ranks ({nodes} nodes): supervisor pass {row['pass_s'] * 1000:.0f} ms "
                  f"(peak {row['peak_mb']:.0f} MB): {100 * busy_share(row['pass_s'], poll_s):.0f}% of one core, "
                  f"a pass every {row['pass_s'] + pace_s(poll_s, row['pass_s']):.2f} s; a dead node detected at worst "
                  f"node_timeout_s + {detection_s(row['pass_s'], poll_s):.1f} s; control dir "
                  f"{meta + files / (row['pass_s'] + pace_s(poll_s, row['pass_s'])):.0f} metadata operations/s "
                  f"(writes and stats, the supervisor's opens), "
                  f"{written / 1e6:.1f} MB/s written")
    per_step = step_log_bytes(base, args.ranks_per_node)
    for ranks in [int(x) for x in args.ranks.split(",")]:
        nodes = -(-ranks // args.ranks_per_node)
        print(f"step log, {ranks} ranks at a 1-s step: per rank {per_step['per rank'] * nodes / 1e6:.2f} MB/s "
              f"({per_step['per rank'] * nodes * 86400 / 1e9:.0f} GB a day), gathered per node "
              f"{per_step['gathered per node'] * nodes / 1e6:.2f} MB/s "
              f"({per_step['gathered per node'] * nodes * 86400 / 1e9:.0f} GB a day)")
    for ranks, row in results["gathered per node"].items():
        silent = silent_rank(ranks, args.ranks_per_node, row["pass_s"] + pace_s(poll_s, row["pass_s"]))
        print(f"a silent rank (its process stopped), {ranks} ranks gathered per node: named in "
              f"{silent['named_s'] * 1000:.0f} ms by its silence; at worst hang_timeout_s + "
              f"{silent['after_timeout_s']:.1f} s after it stopped (a dead node: node_timeout_s + "
              f"{detection_s(row['pass_s'], poll_s):.1f} s)")
    gathered = results["gathered per node"].get(8000)
    if gathered is not None:
        share, detect = busy_share(gathered["pass_s"], poll_s), detection_s(gathered["pass_s"], poll_s)
        print(f"goal supervisor <= 10% of one core at 8000 ranks: {100 * share:.1f}% "
              f"({'met' if share <= 0.10 + 1e-9 else 'not met'})")
        print(f"goal detection <= node_timeout_s + 2 s at 8000 ranks: node_timeout_s + {detect:.1f} s "
              f"({'met' if detect <= 2.0 else 'not met'})")


if __name__ == "__main__":
    main()
