#!/usr/bin/env python3
"""A trainer without torch, for the job's control plane at a hundred nodes and more on a small
machine (launch with the srun launcher: one task per rank).

Each step, a sleep of --step-s stands for the accelerator's work (timed by TrainingControl.busy,
what the straggler watch reads): 128 ranks on 2 cores must wait, not compute. The step ends in a
barrier over TCP (rank 0 at MASTER_ADDR:MASTER_PORT hears every rank's "done" and answers all
"go", or "stop" when a checkpoint is requested), so the ranks move together as collectives make
them: a slow rank slows every step, a rank lost breaks its connection and every rank fails the
step, as gloo's do. Everything the supervisor sees is real: heartbeats gathered per node (the
keep-alive thread beats while a rank waits in the barrier), busy time, checkpoint requests, the
completion marker, and checkpoints through slurmtools' CheckpointManager (rank 0 saves the step;
every rank resumes from the newest complete one). One JSON line per event on rank 0.
Fault hooks for tests: --slow-node HOST:SECONDS (a straggler: ranks on HOST that much slower per
step); --stop-rank RANK:STEP (in the job's first attempt that rank stops its own process with
SIGSTOP when it has ended the step, before the barrier: its keep-alive thread stands still too, as
in a process stopped or stuck holding the GIL; the others wait for it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from slurmtools.checkpoint import CheckpointManager
from slurmtools.runtime import CHECKPOINT_DIR_ENV, TrainingControl, attempt_number

STATE_FILE = "state.json"
CONNECT_TIMEOUT_S = 300.0     # every rank of the step has started (128 ranks on 2 cores: ~30 s)


class StepBarrier:
    """Every rank ends each step together; rank 0 says whether all go on or stop."""

    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        self.rank = rank
        self.peers: List[BinaryIO] = []        # rank 0: a stream per other rank; the others: rank 0's
        if world == 1:
            return
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        if rank == 0:
            server = socket.create_server(("", port), backlog=world)
            server.settimeout(CONNECT_TIMEOUT_S)
            with server:
                for _ in range(world - 1):
                    peer = server.accept()[0]
                    peer.settimeout(None)          # a step waits as long as the slowest rank takes
                    self.peers.append(peer.makefile("rwb"))
            return
        while True:
            try:
                peer = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        peer.settimeout(None)
        self.peers = [peer.makefile("rwb")]

    def end_step(self, stop: bool) -> bool:
        """Rank 0's `stop` for every rank, once all have ended the step; a lost rank raises."""
        try:
            if self.rank == 0:
                if not all(peer.readline() for peer in self.peers):
                    raise ConnectionResetError
                for peer in self.peers:
                    peer.write(b"stop\n" if stop else b"go\n")
                    peer.flush()
                return stop
            self.peers[0].write(b"done\n")
            self.peers[0].flush()
            answer = self.peers[0].readline()
            if not answer:
                raise ConnectionResetError
            return answer == b"stop\n"
        except OSError:          # closed or reset, as a process that died leaves its connections
            raise ConnectionError("a rank left the step barrier" if self.rank == 0 else
                                  "rank 0 left the step barrier") from None


def _pair(shape: str, first_ok: Callable[[str], bool]) -> Callable[[str], str]:
    """An argparse type for "A:B" (or empty): first_ok(A), and B a number >= 0."""
    def parse(text: str) -> str:
        first, sep, number = text.partition(":")
        try:
            if text and not (sep and first_ok(first) and float(number) >= 0):
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {shape}: {text!r}") from None
        return text
    return parse


def _log(rank: int, record: Dict[str, Any]) -> None:
    if rank == 0:
        print(json.dumps(record), flush=True)


def _resume_step(manager: Optional[CheckpointManager]) -> int:
    latest = manager.latest() if manager is not None else None
    if latest is None:
        return 0
    state = json.loads((latest.path / STATE_FILE).read_text())
    return int(state["step"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-s", type=float, default=0.2, help="the work of one step (a sleep), in seconds")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--slow-node", type=_pair("HOST:SECONDS", bool), default="",
                    help="test only: HOST:SECONDS slower per step")
    ap.add_argument("--stop-rank", type=_pair("RANK:STEP", str.isdigit), default="",
                    help="test only: RANK:STEP stops itself (SIGSTOP) at the end of that step")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    control = TrainingControl(rank=rank)
    control.install_signal_handlers()
    checkpoint_dir = os.environ.get(CHECKPOINT_DIR_ENV)
    manager = CheckpointManager(checkpoint_dir) if checkpoint_dir else None
    step = _resume_step(manager)
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    _log(rank, {"event": "resumed", "step": step, "attempt_id": control.attempt_id, "world_size": world})
    first_attempt = attempt_number(os.environ) == 0
    slow_host, _, slow_s = args.slow_node.partition(":")
    extra_s = float(slow_s) if slow_host == socket.gethostname() else 0.0
    stop_rank, _, stop_step = args.stop_rank.partition(":")
    stop_at = int(float(stop_step)) if stop_rank == str(rank) and first_attempt else -1
    try:
        barrier = StepBarrier(rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                              int(os.environ.get("MASTER_PORT", "29500")))
    except OSError as exc:
        print(f"train.py: error: rank {rank}: the step barrier: {exc}", file=sys.stderr)
        return 1
    control.heartbeat(step)
    while step < args.steps:
        step_t0 = time.monotonic()
        with control.busy():
            time.sleep(args.step_s + extra_s)
        step += 1
        control.heartbeat(step)
        control.step_done(step, time.monotonic() - step_t0)
        if step == stop_at:
            print(f"train.py: rank {rank}: stopping this process at step {step} (--stop-rank)", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            requested = barrier.end_step(control.checkpoint_requested())
        except OSError as exc:
            print(f"train.py: error: rank {rank}: step {step}: {exc}", file=sys.stderr)
            return 1
        if manager is not None and rank == 0 and (requested or step % args.checkpoint_every == 0):
            saved_t0 = time.monotonic()
            manager.save(step, lambda path: (Path(path) / STATE_FILE).write_text(json.dumps({"step": step})))
            control.checkpoint_done(step, time.monotonic() - saved_t0, requested=requested)
        if requested:
            control.mark_stopped_for_requeue(step)
            _log(rank, {"event": "stopped_for_requeue", "step": step, "attempt_id": control.attempt_id})
            return 0
    control.mark_complete(step)
    _log(rank, {"event": "final", "step": step, "attempt_id": control.attempt_id})
    return 0


if __name__ == "__main__":
    sys.exit(main())
