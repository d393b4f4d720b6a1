#!/usr/bin/env python3
"""A Hugging Face Transformers Trainer under `slurmtools run` (a tiny GPT-2 built from a config:
no download): the lines slurmtools needs are marked "# slurmtools" (3). Launch with the torchrun
launcher. Prints `step N/M` from rank 0 and `resumed at step N` after a resume.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import transformers

from slurmtools.integrations.transformers import SlurmtoolsTrainerCallback, resume_path   # slurmtools


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, index: int):
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


class Progress(transformers.TrainerCallback):
    def __init__(self, step_sleep_s: float) -> None:
        self.step_sleep_s = step_sleep_s

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.step_sleep_s)
        if state.is_world_process_zero:
            print(f"step {state.global_step}/{state.max_steps} world {args.world_size} host {os.uname().nodename}",
                  flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    ap.add_argument("--output-dir", default=os.environ.get("SLURMTOOLS_CHECKPOINT_DIR", "hf-out"))
    args = ap.parse_args()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
    training = transformers.TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, save_steps=args.checkpoint_every, save_total_limit=2,
        per_device_train_batch_size=8, report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True,
        ddp_backend="gloo")
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=training,
                                   train_dataset=Tokens(),
                                   callbacks=[SlurmtoolsTrainerCallback(), Progress(args.step_sleep_s)])  # slurmtools
    resume = resume_path(args.output_dir)                                                          # slurmtools
    if resume and training.process_index == 0:
        print(f"resumed at step {resume.rsplit('-', 1)[-1]}", flush=True)
    trainer.train(resume_from_checkpoint=resume)                                                   # slurmtools
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
