#!/usr/bin/env python3
"""A PyTorch Lightning trainer under `slurmtools run`: the lines slurmtools needs are marked
"# slurmtools" (4). Launch with the torchrun launcher or the srun launcher (RankEnvironment reads
the ranks either sets); under the srun launcher with `requeue.in_place` on, a lost peer is recovered
in place (slurmtools/integrations/lightning_inplace.py). Prints `step N/M loss X` from rank 0 and
`resumed at step N` after a resume.
"""
from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as L
import torch

from slurmtools.integrations.lightning import SlurmtoolsCallback                 # slurmtools
from slurmtools.integrations.lightning_inplace import RankEnvironment, fit         # slurmtools


class Regression(L.LightningModule):
    def __init__(self, step_sleep_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.step_sleep_s = step_sleep_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_sleep_s)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.trainer.is_global_zero:
            print(f"step {self.trainer.global_step}/{self.trainer.max_steps} loss {float(outputs['loss']):.4f} "
                  f"world {self.trainer.world_size} host {os.uname().nodename}", flush=True)

    def on_train_start(self) -> None:
        if self.trainer.is_global_zero and self.trainer.global_step > 0:
            print(f"resumed at step {self.trainer.global_step}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 32, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    nodes = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) // devices
    callback = SlurmtoolsCallback(every_n_steps=args.checkpoint_every)                          # slurmtools

    def make_trainer() -> L.Trainer:        # a new Trainer after each recovery in place
        return L.Trainer(max_steps=args.steps, accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp",
                         logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, plugins=[RankEnvironment()], callbacks=[callback])
    fit(make_trainer, Regression(args.step_sleep_s), train_dataloaders=data)                    # slurmtools
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
