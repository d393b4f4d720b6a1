#!/usr/bin/env python3
"""The job's control plane at 1,000-64,000 ranks, as the code is today: what one rank costs the
shared control directory, and what one supervisor pass over every rank's heartbeat costs.

    .venv/bin/python bench/scale.py [--ranks 1000,8000,64000] [--ranks-per-node 8] [--passes 5] [--dir D]

No torch and no cluster: the real code paths with simulated ranks.
- Per rank: one real `TrainingControl` with a control dir, a 1-s step for `--rank-seconds` seconds
  (heartbeat at each step, the checkpoint-request check as the reference trainer does, its
  keep-alive thread): the metadata operations (creates, renames, chmods, stats) and bytes it puts
  on the control dir per second, counted by wrapping the os calls it makes.
- Per supervisor pass, with N heartbeat files written by the runtime's own writer in the record
  shape TrainingControl writes: `watchdog.scan_heartbeats` + `watchdog.judge` + one
  `StragglerWatch.observe`, the median of --passes (page-cached: a network file system adds a round
  trip per file), and the peak memory of the pass (tracemalloc).
Printed per size: the pass, the supervisor's share of one core (a pass, then a 0.5-s sleep), the
worst time to detect a dead node (node_timeout_s + 2 passes + a sleep), the control dir's metadata operations and
bytes per second; then `goal` lines for 8,000 ranks (supervisor <= 10% of one core; detection <=
node_timeout_s + 2 s). Flight-recorder attribution at scale is not measured here yet.
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
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurmtools.fsutil import write_json_atomic  # noqa: E402
from slurmtools.requeue import straggler, watchdog  # noqa: E402
from slurmtools.requeue.supervisor import SupervisorConfig  # noqa: E402
from slurmtools.runtime import HEARTBEAT_DIR, TrainingControl  # noqa: E402

NODE_TIMEOUT_S = 10.0            # the spec's floor for node_timeout_s (4x the median step, at least 10 s)


def per_rank_load(control: Path, seconds: int) -> Dict[str, float]:
    """Metadata operations and bytes per second one rank puts on the control dir at a 1-s step."""
    counts = {"create": 0, "rename": 0, "chmod": 0, "stat": 0, "bytes": 0}
    lock = threading.Lock()
    root = str(control)
    real = {"open": os.open, "replace": os.replace, "fchmod": os.fchmod, "stat": os.stat, "write": os.write}

    def count(kind: str, amount: int = 1) -> None:
        with lock:
            counts[kind] += amount

    def counting_open(path, flags, *args, **kwargs):        # type: ignore[no-untyped-def]
        if str(path).startswith(root) and flags & os.O_CREAT:
            count("create")
        return real["open"](path, flags, *args, **kwargs)

    def counting_replace(src, dst, *args, **kwargs):       # type: ignore[no-untyped-def]
        if str(dst).startswith(root):
            count("rename")
            count("bytes", real["stat"](src).st_size)
        return real["replace"](src, dst, *args, **kwargs)

    def counting_fchmod(fd, mode):                          # type: ignore[no-untyped-def]
        count("chmod")
        return real["fchmod"](fd, mode)

    def counting_stat(path, *args, **kwargs):              # type: ignore[no-untyped-def]
        if str(path).startswith(root):
            count("stat")
        return real["stat"](path, *args, **kwargs)

    os.open, os.replace, os.fchmod, os.stat = counting_open, counting_replace, counting_fchmod, counting_stat  # type: ignore[assignment]
    try:
        rank = TrainingControl(control_dir=control, rank=0)
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
    return {kind: value / elapsed for kind, value in counts.items()}


def write_heartbeats(control: Path, ranks: int, ranks_per_node: int, step: int, busy_s: float) -> None:
    """Every rank's heartbeat as TrainingControl writes it (same writer, same record shape)."""
    beat_dir = control / HEARTBEAT_DIR
    beat_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for rank in range(ranks):
        record = {"rank": rank, "host": f"node{rank // ranks_per_node:05d}", "step": step, "time": now,
                  "first_progress_t": now - 60.0, "attempt_id": "1.0", "busy_s": round(busy_s * step, 6),
                  "alive": now}
        write_json_atomic(beat_dir / f"{rank}.json", record, durable=False)


def supervisor_pass(control: Path, watch: straggler.StragglerWatch, ranks: int) -> None:
    """What the supervisor does with the heartbeats each poll."""
    beats, _ = watchdog.scan_heartbeats(control)
    watchdog.judge(beats, time.time(), 600.0, ranks)
    watch.observe(beats)


def measure(base: Path, ranks: int, ranks_per_node: int, passes: int) -> Dict[str, float]:
    control = Path(tempfile.mkdtemp(prefix=f"scale{ranks}-", dir=base))
    try:
        t0 = time.perf_counter()
        write_heartbeats(control, ranks, ranks_per_node, 10, 0.01)
        write_s = time.perf_counter() - t0
        watch = straggler.StragglerWatch(1.3, 3, 10)
        supervisor_pass(control, watch, ranks)                  # the first window starts here
        times: List[float] = []
        for index in range(passes):
            write_heartbeats(control, ranks, ranks_per_node, 20 + 10 * index, 0.01)
            tracemalloc.start()
            t1 = time.perf_counter()
            supervisor_pass(control, watch, ranks)
            times.append(time.perf_counter() - t1)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return {"write_s": write_s, "pass_s": statistics.median(times), "peak_mb": peak / 1e6}
    finally:
        shutil.rmtree(control, ignore_errors=True)


def busy_share(pass_s: float, poll_s: float) -> float:
    """The supervisor's share of one core: a pass, then a sleep of poll_s, again and again."""
    return pass_s / (pass_s + poll_s)


def detection_s(pass_s: float, poll_s: float) -> float:
    """Worst case after node_timeout_s: the timeout ends just after a pass read the beats, so the
    next pass, after the sleep, sees it and must finish."""
    return 2 * pass_s + poll_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1000,8000,64000")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rank-seconds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the control dirs go (default: a temporary directory)")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="slurmtools-scale-"))
    poll_s = SupervisorConfig.poll_s          # the dataclass default: the cadence of a supervisor pass
    load_dir = Path(tempfile.mkdtemp(prefix="rank-", dir=base))
    load = per_rank_load(load_dir, args.rank_seconds)
    shutil.rmtree(load_dir, ignore_errors=True)
    ops_per_rank_s = load["create"] + load["rename"] + load["chmod"] + load["stat"]
    print(f"one rank at a 1-s step: {ops_per_rank_s:.1f} metadata operations/s on the control dir "
          f"(creates {load['create']:.1f}, renames {load['rename']:.1f}, chmods {load['chmod']:.1f}, "
          f"stats {load['stat']:.1f}), {load['bytes']:.0f} bytes/s")
    rows = {}
    for ranks in [int(x) for x in args.ranks.split(",")]:
        row = measure(base, ranks, args.ranks_per_node, args.passes)
        rows[ranks] = row
        nodes = -(-ranks // args.ranks_per_node)
        share, detect = busy_share(row["pass_s"], poll_s), detection_s(row["pass_s"], poll_s)
        print(f"{ranks} ranks ({nodes} nodes): supervisor pass {row['pass_s'] * 1000:.0f} ms "
              f"(peak {row['peak_mb']:.0f} MB): {100 * share:.0f}% of one core, a pass every "
              f"{poll_s + row['pass_s']:.2f} s (meant: {poll_s:g} s); a dead node detected at worst "
              f"node_timeout_s + {detect:.1f} s; control dir "
              f"{ops_per_rank_s * ranks + ranks / poll_s:.0f} metadata operations/s (ranks' writes and stats, "
              f"the supervisor's opens), {load['bytes'] * ranks / 1e6:.1f} MB/s written; "
              f"writing every heartbeat once from one process took {row['write_s']:.1f} s")
    if 8000 in rows:
        share, detect = busy_share(rows[8000]["pass_s"], poll_s), detection_s(rows[8000]["pass_s"], poll_s)
        print(f"goal supervisor <= 10% of one core at 8000 ranks: {100 * share:.0f}% "
              f"({'met' if share <= 0.10 else 'not met'})")
        print(f"goal detection <= node_timeout_s + 2 s at 8000 ranks: node_timeout_s + {detect:.1f} s "
              f"({'met' if detect <= 2.0 else 'not met'})")
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
