#!/usr/bin/env python3
"""A tiny but real FSDP2 trainer for slurmtools (launch with torchrun): gloo on CPU, nccl on GPU.

The model and loop live in slurmtools.tiny_fsdp; this is its command line. One JSON line per
step on rank 0 (step, loss as float.hex, world size, attempt id); DCP checkpoints every N steps
through slurmtools' CheckpointManager (async by default: --no-async-checkpoint for blocking saves),
resume from the latest complete one on start.
Fault hooks for tests: --fail-at-step (and --fail-again-at-step on the attempt after), --hang-at-step RANK:STEP, --slow-checkpoint-at, --slow-requested-checkpoint, --step-sleep-s, --local-work-s,
--slow-node HOST:SECONDS (a straggler), --skip-collective-at RANK:STEP, --sdc-fault RANK:STEP (test only:
that rank's silent-data-corruption canary computes a wrong result from STEP on), --kill-rank-at RANK:STEP
and --kill-replacement (test only: a rank's process lost, a rank started in place lost before it joins).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from slurmtools.common.import_pause import collector_paused

with collector_paused():     # torch's import, a fifth cheaper (slurmtools/common/import_pause.py)
    import torch
    import torch._dynamo     # the first fully_shard imports it: with the collector paused here
    import torch.distributed as dist

    from slurmtools.common.control_dir import CONTROL_DIR_ENV, collective_timeout_s
    from slurmtools.common.leave import leave_without_teardown
    from slurmtools.errors import SlurmToolsError
    from slurmtools.reference.tiny_faults import replacement_lost
    from slurmtools.runtime import TrainingControl
    from slurmtools.train import inplace
    from slurmtools.tiny_fsdp import TrainConfig, shutdown, train


def _pair(form: str):
    """argparse type of a fault flag in `form` (RANK:STEP or HOST:SECONDS): a bad value is a
    one-line usage error, not a traceback inside the trainer."""
    def check(text: str) -> str:
        if not text:
            return text          # the default: no fault
        first, sep, rest = text.partition(":")
        try:
            if not (sep and first):
                raise ValueError
            if form == "RANK:STEP":
                int(first), int(rest)
            else:
                float(rest)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}") from None
        return text
    return check


CHOICES = {"on_save_error": ("continue", "stop")}
FAULT_FORMS = {"hang_at_step": "RANK:STEP", "skip_collective_at": "RANK:STEP", "sdc_fault": "RANK:STEP",
               "kill_rank_at": "RANK:STEP",
               "slow_node": "HOST:SECONDS"}


def parse_args(argv=None) -> TrainConfig:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = TrainConfig(checkpoint_dir=os.environ.get("SLURMTOOLS_CHECKPOINT_DIR"))
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            continue
        kind = _pair(FAULT_FORMS[f.name]) if f.name in FAULT_FORMS else str if f.name == "checkpoint_dir" else type(default)
        ap.add_argument(flag, type=kind, default=default, choices=CHOICES.get(f.name))
    args = vars(ap.parse_args(argv))
    for name, value in args.items():          # a sleep or a duration below 0 is no duration
        if name.endswith("_s") and isinstance(value, float) and not value >= 0:
            ap.error(f"argument --{name.replace('_', '-')}: must be at least 0, got {value:g}")
    return TrainConfig(**args)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout_s = collective_timeout_s(os.environ)
    control_dir = os.environ.get(CONTROL_DIR_ENV)
    replacement_lost(cfg, os.environ)          # a test's second failure during an in-place recovery
    try:
        # beats from here on (its rank: the launcher's RANK): a rank waiting for its group is alive,
        # a replacement started in place too, however long its generation takes to form
        control = TrainingControl()
        with control.phase("joining", timeout_s=max(1, timeout_s)):
            # torchrun's group; a replacement rank joins the generation it was started into
            inplace.start(backend, timeout_s, Path(control_dir) if control_dir else None)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # a broken group, with in-place recovery on, is left for the next generation: same process
        inplace.run(lambda: train(cfg, control), control.control_dir, dist.get_rank(), backend, timeout_s)
    except SlurmToolsError as exc:
        # one line, no traceback; no barrier: a rank alone in its error must not wait for the others
        rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
        print(f"train.py: error: rank {rank}: {exc}", file=sys.stderr, flush=True)
        if dist.is_initialized():
            dist.destroy_process_group()
        return 1
    shutdown()
    return 0


if __name__ == "__main__":
    # FSDP2 keeps a gloo group alive past destroy_process_group(); its C++ teardown at
    # interpreter exit can abort a rank whose peer already left (SIGABRT after the one-line error)
    leave_without_teardown(main())
