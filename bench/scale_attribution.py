"""bench/scale.py's attribution part (`--only attribution`): a hang's laggard named by the
flight recorders at 1,000-64,000 ranks, and torch's own full dumps read by the supervisor (see
bench/scale.py's docstring for what is measured)."""
from __future__ import annotations

import argparse
import pickle
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Dict

from slurmtools.common.control_dir import HEARTBEAT_DIR, HEARTBEAT_INTERVAL_S
from slurmtools.requeue import flightrec
from slurmtools.requeue.observe import pace_s
from slurmtools.train import fr_dump
from slurmtools.train.node_beat import NodeBeats, node_dir


def torch_like_dump(entries: int, newest_seq: int) -> Dict[str, Any]:
    """A flight-recorder dump in torch 2.13's shape (the keys of a real gloo dump's entries)."""
    def entry(seq: int) -> Dict[str, Any]:
        return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "python",
                "thread_id": "140200041762880", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
                "profiling_name": "nccl:all_reduce", "time_created_ns": 1796267125377437121 + seq,
                "input_sizes": [[4096, 4096]], "input_dtypes": ["BFloat16"], "output_sizes": [[4096, 4096]],
                "output_dtypes": ["BFloat16"], "state": "started" if seq == newest_seq else "completed",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                "retired": seq != newest_seq, "timeout_ms": 1800000, "is_p2p": False}
    return {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": {"0": {"name": "0", "desc": "default_pg"}},
            "pg_status": {}, "entries": [entry(seq) for seq in range(newest_seq - entries + 1, newest_seq + 1)]}


def attribution(base: Path, ranks: int, ranks_per_node: int, fr_entries: int) -> Dict[str, float]:
    """A hang at 8,000-like scale: every rank waits in collective #1000 but one, still at #999."""
    laggard_rank = ranks // 2 + 1
    raw = {seq: pickle.dumps(torch_like_dump(fr_entries, seq)) for seq in (999, 1000)}
    t0 = time.perf_counter()
    records = {seq: fr_dump.summary_record(0, fr_dump.reduce(fr_dump.parse_dump(one) or {}))
               for seq, one in raw.items()}
    rank_s = (time.perf_counter() - t0) / 2
    control = Path(tempfile.mkdtemp(prefix=f"fr{ranks}-", dir=base))
    recorder, memory, heartbeats = control / "flight-recorder" / "1.0", control / "shm", control / HEARTBEAT_DIR
    try:
        for path in (recorder, memory, heartbeats):
            path.mkdir(parents=True)
        hosts = {rank: f"node{rank // ranks_per_node:05d}" for rank in range(ranks)}
        for node_start in range(0, ranks, ranks_per_node):
            host = hosts[node_start]
            directory = node_dir(memory, control, "1.0", host)
            assert directory is not None
            node_ranks = range(node_start, min(node_start + ranks_per_node, ranks))
            for rank in node_ranks:
                record = dict(records[999 if rank == laggard_rank else 1000], rank=rank)
                NodeBeats(control, directory, rank, host, False, ()).write_flight_record(record, recorder)
            leader = NodeBeats(control, directory, node_start, host, True, ())
            leader.recorder_dir = recorder
            leader.write({"rank": node_start}, heartbeats, time.time())
        t1 = time.perf_counter()
        found = flightrec.laggard(flightrec.read_reduced(recorder), hosts)
        supervisor_s = time.perf_counter() - t1
        assert found is not None and found.rank == laggard_rank, found
        tracemalloc.start()
        flightrec.laggard(flightrec.read_reduced(recorder), hosts)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {"rank_s": rank_s, "supervisor_s": supervisor_s, "peak_mb": peak / 1e6,
                "dump_kb": len(raw[1000]) / 1e3}
    finally:
        shutil.rmtree(control, ignore_errors=True)


def raw_dumps(base: Path, count: int, fr_entries: int) -> Dict[str, float]:
    """torch's own full dumps (an NCCL timeout), read and reduced by the supervisor one at a time."""
    recorder = Path(tempfile.mkdtemp(prefix="raw-", dir=base))
    try:
        one = pickle.dumps(torch_like_dump(fr_entries, 1000))
        for rank in range(count):
            (recorder / f"rank_{rank}").write_bytes(one)
        t0 = time.perf_counter()
        assert len(flightrec.read_reduced(recorder)) == count
        per_dump_s = (time.perf_counter() - t0) / count
        tracemalloc.start()
        flightrec.read_reduced(recorder)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {"per_dump_s": per_dump_s, "peak_mb": peak / 1e6}
    finally:
        shutil.rmtree(recorder, ignore_errors=True)


def attributions(args: argparse.Namespace, base: Path, poll_s: float) -> None:
    interval_s = HEARTBEAT_INTERVAL_S
    verdicts = {}
    for ranks in [int(x) for x in args.ranks.split(",")]:
        row = verdicts[ranks] = attribution(base, ranks, args.ranks_per_node, args.fr_entries)
        # request -> verdict at worst: local rank 0 mirrors the marker, each rank sees it, reduces its
        # dump; local rank 0 gathers; the supervisor's next pass (a pass and its sleep) reads them
        row["verdict_s"] = 3 * interval_s + row["rank_s"] + pace_s(poll_s, row["supervisor_s"]) + row["supervisor_s"]
        print(f"attribution, {ranks} ranks: each rank reduces its {row['dump_kb']:.0f}-KB dump in "
              f"{row['rank_s'] * 1000:.0f} ms; the supervisor reads the node files and names the laggard in "
              f"{row['supervisor_s'] * 1000:.0f} ms (peak {row['peak_mb']:.0f} MB); request to verdict at worst "
              f"{row['verdict_s']:.1f} s")
    raw = raw_dumps(base, args.raw_dumps, args.fr_entries)
    print(f"full dumps read by the supervisor (torch's own, NCCL timeout): {raw['per_dump_s'] * 1000:.0f} ms each, "
          f"peak {raw['peak_mb']:.0f} MB for {args.raw_dumps} (one at a time); in its "
          f"{flightrec.READ_BUDGET_S:.0f}-s budget it reads ~{flightrec.READ_BUDGET_S / raw['per_dump_s']:.0f} "
          f"of them")
    at_8000 = verdicts.get(8000)
    if at_8000 is not None:
        met = at_8000["verdict_s"] <= 30.0 and at_8000["peak_mb"] <= 2000.0
        print(f"goal attribution <= 30 s in <= 2 GB at 8000 ranks: {at_8000['verdict_s']:.1f} s, "
              f"{at_8000['peak_mb']:.0f} MB ({'met' if met else 'not met'})")
