"""One preflight task: the compute canary on its devices, then all-reduce rounds with the
job's backend (NCCL on GPUs, gloo on CPU), judged by rank 0, which writes the report.

Started by launch.py as an srun step with the training step's layout (one task per GPU, or
one per node): ranks and the rendezvous come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID
and MASTER_ADDR / MASTER_PORT (the generated script's). Link rounds use the first task of
every node. Every rank plans the rounds from the same gathered node list, so no plan is sent.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmtools.common.fsutil import write_json_atomic
from slurmtools.common.leave import leave_without_teardown
from slurmtools.preflight import canary, judge

LINK_BYTES = 4 * 1024 * 1024
LINK_ITERS = 3
LATENCY_ITERS = 20


def _devices(local_rank: int, local_tasks: int) -> List[str]:
    import torch
    if not torch.cuda.is_available():
        return ["cpu"]
    if local_tasks > 1:
        return [f"cuda:{local_rank % torch.cuda.device_count()}"]
    return [f"cuda:{index}" for index in range(torch.cuda.device_count())]


def measure_link(group: Any, members: Sequence[int], device: str, size_bytes: int) -> Tuple[float, float]:
    """(bus bandwidth in Gb/s, median latency of a one-element all-reduce in us) within group."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    small = torch.ones(1, device=device)
    times = []
    for _ in range(LATENCY_ITERS):
        start = time.perf_counter()
        dist.all_reduce(small, group=group)
        sync()
        times.append(time.perf_counter() - start)
    data = torch.ones(size_bytes // 4, device=device)
    dist.all_reduce(data, group=group)            # warm-up: connections, buffers
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(LINK_ITERS):
        dist.all_reduce(data, group=group)
    sync()
    per_op_s = (time.perf_counter() - start) / LINK_ITERS
    count = len(members)
    busbw = size_bytes * 2 * (count - 1) / count / per_op_s * 8 / 1e9    # nccl-tests' bus bandwidth
    return busbw, statistics.median(times) * 1e6


def check(settings: judge.Settings, environ: Mapping[str, str], size_bytes: int = LINK_BYTES) -> Dict[str, Any]:
    """Run the whole preflight in this rank; every rank returns the same report."""
    import torch
    import torch.distributed as dist

    start_t = time.time()
    rank, world = int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"])
    local_rank = int(environ.get("SLURM_LOCALID", "0"))
    host = socket.gethostname()
    local_tasks = int(environ.get("SLURM_NTASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE", "1")).split("(")[0]
                      or 1)
    devices = _devices(local_rank, local_tasks)
    if devices[0] == "cpu":
        # one core: threads of several processes on shared cores make OpenMP spin, and its
        # figure then measures the scheduler rather than the node
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(devices[0])
    backend = "nccl" if devices[0].startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=settings.budget_s))
    try:
        kind = "cuda" if backend == "nccl" else "cpu"
        shape = canary.SHAPES[kind]
        fault = canary.fault_from_step(environ, host) == 0 and local_rank == 0
        gathered = _canaries(rank, world, host, devices, shape, fault)
        results = [result for _, batch in gathered for result in batch]
        if judge.judge_throughput(results, settings.slow_factor):
            # every rank has the same results, so every rank runs again: a device is named only
            # when it is slow twice (judge.fastest_of)
            rerun = [result for _, batch in _canaries(rank, world, host, devices, shape, fault) for result in batch]
            results = judge.fastest_of(results, rerun)
        leaders: Dict[str, int] = {}
        for index, (node, _) in enumerate(gathered):
            leaders.setdefault(node, index)
        nodes = list(leaders)
        ring: Optional[judge.LinkResult] = None
        if len(nodes) >= 2:
            ring = _round(rank, [tuple(nodes)], leaders, devices[0], size_bytes, world)[0]
        pairs: List[judge.LinkResult] = []
        rounds = judge.pair_rounds(nodes)
        for pair_round in rounds if len(nodes) >= 3 or settings.min_busbw_gbps is not None else []:
            pairs += _round(rank, [tuple(pair) for pair in pair_round], leaders, devices[0], size_bytes, world)
        links = judge.judge_links(nodes, pairs, ring, settings)
        if pairs and any(finding.test == "busbw" for finding in links):
            # every rank has the same findings, so every rank measures again: a node is named only
            # when its links are slow twice (judge.best_of)
            again: List[judge.LinkResult] = []
            for pair_round in rounds:
                again += _round(rank, [tuple(pair) for pair in pair_round], leaders, devices[0], size_bytes, world)
            pairs = judge.best_of(pairs, again)
            links = judge.judge_links(nodes, pairs, ring, settings)
        findings = (judge.judge_canary(results, shape.size, shape.chain, canary.DTYPE)
                    + judge.judge_throughput(results, settings.slow_factor) + links)
        # every rank has the same inputs, hence the same report
        return {"nodes": nodes, "backend": backend, "canary": [result.to_json() for result in results],
                "ring": ring.to_json() if ring else None, "pairs": [pair.to_json() for pair in pairs],
                "rounds": len(rounds), "findings": [finding.to_json() for finding in findings],
                "wall_s": round(time.time() - start_t, 3)}
    finally:
        dist.destroy_process_group()


def _canaries(rank: int, world: int, host: str, devices: Sequence[str], shape: canary.Shape,
              fault: bool) -> List[Any]:
    """Every rank's (host, canary results), the devices started together."""
    import torch.distributed as dist
    dist.barrier()
    mine = [canary.run_on(device, shape, fault=fault and index == 0, rank=rank) for index, device in enumerate(devices)]
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, (host, mine))
    return gathered


def _round(rank: int, groups: Sequence[Tuple[str, ...]], leaders: Dict[str, int], device: str, size_bytes: int,
           world: int) -> List[judge.LinkResult]:
    """Disjoint groups measured at the same time; every rank takes part in creating each group."""
    import torch.distributed as dist
    measured: Optional[Tuple[Tuple[str, ...], float, float]] = None
    for nodes in groups:
        members = [leaders[node] for node in nodes]
        group = dist.new_group(members)
        if rank in members:
            busbw, latency = measure_link(group, members, device, size_bytes)
            measured = (nodes, busbw, latency)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, measured)
    seen = {}
    for item in gathered:
        if item is not None and item[0] not in seen:
            seen[item[0]] = judge.LinkResult(item[0], item[1], item[2])
    return [seen[nodes] for nodes in groups if nodes in seen]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="slurmtools-preflight-worker")
    parser.add_argument("--report", required=True, help="where rank 0 writes the JSON report")
    parser.add_argument("--budget-s", type=int, required=True)
    parser.add_argument("--slow-factor", type=float, required=True)
    parser.add_argument("--min-busbw-gbps", type=float, default=None)
    args = parser.parse_args(argv)
    settings = judge.Settings(args.budget_s, args.slow_factor, args.min_busbw_gbps)
    report = check(settings, os.environ)
    if int(os.environ["SLURM_PROCID"]) == 0:
        write_json_atomic(Path(args.report), report)
    leave_without_teardown(0)      # the report is written; torch's C++ teardown can abort at exit


if __name__ == "__main__":
    sys.exit(main())
