"""Hugging Face Transformers' Trainer (Accelerate underneath) under `slurmtools run`: one
TrainerCallback and one resume call.

    from slurmtools.integrations.transformers import SlurmtoolsTrainerCallback, resume_path
    trainer = Trainer(model, args, train_dataset=..., callbacks=[SlurmtoolsTrainerCallback()])
    trainer.train(resume_from_checkpoint=resume_path(args.output_dir))

The Trainer writes `checkpoint-N/` in place (not to a temporary name: a kill mid-save leaves a
directory its own `get_last_checkpoint` would pick). The callback seals each one with a manifest
once the Trainer is done with it (slurmtools.checkpoint.write_manifest), and resume_path only ever
returns a sealed, verified one. It also beats every step (hang detection by step, stragglers),
turns the supervisor's checkpoint request (the warning, a straggler swap), agreed by all ranks at a
step boundary, into a save and a stop for the requeue, and marks completion.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from slurmtools.checkpoint.manager import verify_dir, write_manifest
from slurmtools.train.agreement import RequestAgreement, barrier
from slurmtools.train.control import TrainingControl

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")     # transformers' PREFIX_CHECKPOINT_DIR-<global step>


def resume_path(output_dir: str) -> Optional[str]:
    """The newest sealed and verified `checkpoint-N` under output_dir, for
    `trainer.train(resume_from_checkpoint=...)`; None on a first start."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(((int(m.group(1)), path) for path in root.iterdir()
                    if path.is_dir() and (m := _CHECKPOINT_DIR.match(path.name))), reverse=True)
    for step, path in found:
        ok, _why, _manifest = verify_dir(path, step=step)
        if ok:
            return str(path)
    return None


class SlurmtoolsTrainerCallback(TrainerCallback):
    """Heartbeats, sealed checkpoints, the checkpoint on request and completion for the supervisor."""

    def __init__(self) -> None:
        self.control: Optional[TrainingControl] = None
        self.step_t = time.monotonic()
        self.stopping_for_requeue = False
        self.agreement = RequestAgreement()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.control = TrainingControl(rank=args.process_index)
        self.control.install_signal_handlers()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        assert self.control is not None
        self.control.heartbeat(state.global_step, defer=True)
        self.step_t = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        assert self.control is not None
        step_s = time.monotonic() - self.step_t
        self.control.step_done(state.global_step, step_s)
        if self.agreement.check(state.global_step, self.control.checkpoint_requested(), step_s):
            control.should_save = True
            control.should_training_stop = True
            self.stopping_for_requeue = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        assert self.control is not None
        barrier()          # every process has written its part of checkpoint-N
        if args.process_index == 0 and args.output_dir is not None:
            started = time.monotonic()
            write_manifest(Path(args.output_dir) / f"checkpoint-{state.global_step}", state.global_step,
                           {"framework": "transformers"})
            self.control.checkpoint_done(state.global_step, time.monotonic() - started,
                                         requested=self.stopping_for_requeue)
        barrier()
        if self.stopping_for_requeue:
            self.control.heartbeat(state.global_step)     # the step it stops at (a beat per step is at its start)
            self.control.mark_stopped_for_requeue(state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        assert self.control is not None
        if not self.stopping_for_requeue and state.global_step >= state.max_steps:
            self.control.heartbeat(state.global_step)
            self.control.mark_complete(state.global_step)
