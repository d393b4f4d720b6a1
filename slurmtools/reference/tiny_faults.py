"""The reference trainer's injected faults (tests and benchmarks only): which fire in this process,
read once at the start of a step of the job from its TrainConfig fields and the environment, and
the two places they act in the loop (before a step: crash, hang; after a step's update: skip the
loss all-reduce). Faults fire on one attempt of the job (restarts in place and requeues counted:
`faults_on_attempt`) or on all (-1); a second, later crash may follow on the next attempt."""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from slurmtools.common.control_dir import GENERATION_ENV, RANK_BASE_ENV, attempt_number
from slurmtools.preflight import canary as preflight_canary


@dataclass(frozen=True)
class Faults:
    fail_at: int = -1                       # raise before this step
    hang: Optional["tuple[int, int]"] = None      # (rank, step): that rank sleeps for ever before it
    skip: Optional["tuple[int, int]"] = None      # (rank, step): that rank never enters the step's all-reduce
    slow_checkpoint_at: int = -1
    slower_s: float = 0.0                   # this host's extra seconds per step (a straggler)
    sdc: Optional["tuple[int, int]"] = None       # (rank, from step): that rank computes wrong results
    slow_requested_checkpoint: bool = False       # a requested save pauses before its commit
    kill: Optional["tuple[int, int]"] = None      # (rank, step): that rank's process ends at once (a lost rank)

    @classmethod
    def of(cls, cfg: Any, rank: int, environ: Mapping[str, str], host: Optional[str] = None) -> "Faults":
        """This process's faults from cfg's fault fields (HOST:SECONDS, RANK:STEP, already checked by
        the trainer's argument parser) and the preflight canary's test-only wrong-results node."""
        host = host or socket.gethostname()
        attempt = attempt_number(environ)
        # a generation formed in place (train/inplace.py) is the recovery: its ranks fault no more
        on = cfg.faults_on_attempt in (-1, attempt) and environ.get(GENERATION_ENV, "0") in ("", "0")
        fail_at = cfg.fail_at_step if on else -1
        if cfg.faults_on_attempt >= 0 and attempt == cfg.faults_on_attempt + 1:
            fail_at = cfg.fail_again_at_step
        slow_host, _, slow_s = cfg.slow_node.partition(":") if on else ("", "", "")
        sdc = _pair(cfg.sdc_fault) if on else None
        node_fault_from = preflight_canary.fault_from_step(environ, host)
        if node_fault_from is not None and int(environ.get("LOCAL_RANK", "0")) == 0:
            sdc = (rank, node_fault_from)       # the node's first rank, from that step on
        return cls(fail_at, _pair(cfg.hang_at_step) if on else None, _pair(cfg.skip_collective_at) if on else None,
                   cfg.slow_checkpoint_at if on else -1, float(slow_s or 0) if slow_host == host else 0.0, sdc,
                   bool(cfg.slow_requested_checkpoint and on), _pair(cfg.kill_rank_at) if on else None)

    def before_step(self, rank: int, step: int) -> None:
        if self.kill == (rank, step):
            print(f"rank {rank}: injected loss of this process at step {step}", file=sys.stderr, flush=True)
            os._exit(9)                     # no clean-up, no exception: as a process the kernel killed
        if step == self.fail_at:
            raise RuntimeError(f"injected failure at step {step}")
        if self.hang == (rank, step):
            print(f"rank {rank}: injected hang at step {step}", file=sys.stderr, flush=True)
            _forever()

    def after_update(self, rank: int, step: int) -> None:
        if self.skip == (rank, step):
            print(f"rank {rank}: injected skip of the loss all-reduce at step {step}", file=sys.stderr, flush=True)
            _forever()

    def corrupts(self, rank: int, step: int) -> bool:
        return self.sdc is not None and rank == self.sdc[0] and step >= self.sdc[1]


def replacement_lost(cfg: Any, environ: Mapping[str, str]) -> None:
    """cfg.kill_replacement on the faulting attempt: a process started into a generation of an
    in-place recovery (told its first rank) ends at once, before it joins the group."""
    if cfg.kill_replacement and environ.get(RANK_BASE_ENV) and cfg.faults_on_attempt in (-1, attempt_number(environ)):
        print(f"rank {environ.get('RANK', '?')}: injected loss of a replacement before it joins", file=sys.stderr,
              flush=True)
        os._exit(9)


def _pair(text: str) -> Optional["tuple[int, int]"]:
    first, _, second = text.partition(":")
    return (int(first), int(second)) if first and second else None


def _forever() -> None:
    while True:
        time.sleep(3600)
