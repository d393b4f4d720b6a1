"""PyTorch Lightning recovered in place (docs/recovery.md, "In place"): the srun launcher, in-place
recovery on, and `fit` instead of `trainer.fit`:

    from slurmtools.integrations.lightning import SlurmtoolsCallback
    from slurmtools.integrations.lightning_inplace import RankEnvironment, fit
    callback = SlurmtoolsCallback(every_n_steps=50)            # made once: its TrainingControl goes on
    fit(lambda: L.Trainer(..., plugins=[RankEnvironment()], callbacks=[callback]), model, train_dataloaders=data)

When a peer is lost, the ranks on healthy nodes do not exit: Lightning's fit raises the broken
group's error, `fit` leaves the group, waits for the supervisor's next generation, joins it
(slurmtools.train.inplace) and fits again in the same process with a new Trainer: no interpreter
start, no import, the LightningModule and the data kept. The replacement ranks start straight into
that generation. Under DDP with the job's snapshots on, every rank resumes from the newest step a
survivor keeps in its memory (lightning_memory: each rank's whole state is the same, so a survivor's
copy is the lost rank's too; one rank a node keeps one); else, or when the newest sealed checkpoint
is as new, from that checkpoint (Lightning's state comes back through its own checkpoint either way:
its loops, optimizers and callbacks), and the steps since it are trained again.
Lightning forms no group of its own when one exists (its DDP strategy's set-up), so the
generation's group is the one it trains on.

With in-place recovery off (or outside a job) `fit` is `trainer.fit(model, ckpt_path=resume_path())`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import TorchElasticEnvironment

from slurmtools.common.control_dir import CONTROL_DIR_ENV, collective_timeout_s
from slurmtools.integrations.lightning import CHECKPOINT_FILE, SlurmtoolsCallback, newest_sealed, resume_path
from slurmtools.integrations.lightning_memory import (NONE_HELD, MemoryCopy, agreed_copy, keeps_copy, remove,
                                                      replicated)
from slurmtools.train import inplace


class RankEnvironment(TorchElasticEnvironment):
    """Lightning's ranks from RANK, LOCAL_RANK and WORLD_SIZE, which the srun launcher's task wrapper
    sets for every rank, a replacement's and a restarted one's too (their SLURM_PROCID counts from 0
    in a step of their own: Lightning's SLURMEnvironment would number them wrong). The node's rank
    is torchrun's GROUP_RANK under the torchrun launcher, else the rank over the ranks a node runs."""

    def node_rank(self) -> int:
        if "GROUP_RANK" in os.environ:
            return super().node_rank()      # type: ignore[no-any-return]
        per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]   # "2", or "2(x3)"
        return int(os.environ["RANK"]) // (int(per_node) if per_node.isdigit() and int(per_node) > 0 else 1)


def fit(make_trainer: Callable[[], pl.Trainer], model: pl.LightningModule, *, checkpoint_dir: Optional[str] = None,
        environ: Mapping[str, str] = os.environ, **fit_kwargs: Any) -> None:
    """make_trainer().fit(model, ckpt_path=<the newest sealed checkpoint>, **fit_kwargs), again with a
    new Trainer in the same process after each in-place recovery (module docstring). make_trainer
    builds everything tied to the group (the Trainer, its strategy); what it keeps across calls (the
    callback, the model, the data) must not hold an earlier generation's group."""
    control = environ.get(CONTROL_DIR_ENV)
    if not inplace.enabled(environ) or not control:
        make_trainer().fit(model, ckpt_path=resume_path(checkpoint_dir), **fit_kwargs)
        return
    control_dir = Path(control)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout_s = float(collective_timeout_s(environ))
    inplace.start(backend, timeout_s, control_dir, environ)
    if backend == "nccl":
        torch.cuda.set_device(int(environ.get("LOCAL_RANK", "0")))

    memory = MemoryCopy.from_env(environ)

    def fit_once() -> None:
        trainer = make_trainer()
        callbacks = [callback for callback in trainer.callbacks if isinstance(callback, SlurmtoolsCallback)]
        # every rank alike (the same script, environment and strategy): the agreement is collective;
        # a rank that keeps no copy takes part in it holding none
        agreeing = memory if memory is not None and callbacks and replicated(trainer) else None
        for callback in callbacks:
            callback.memory = agreeing if keeps_copy(trainer.local_rank, trainer.num_nodes) else None
        sealed = newest_sealed(checkpoint_dir)
        copy = agreed_copy(agreeing, sealed.step if sealed else NONE_HELD, environ) if agreeing is not None else None
        try:
            sealed_file = str(sealed.path / CHECKPOINT_FILE) if sealed is not None else None
            trainer.fit(model, ckpt_path=str(copy) if copy is not None else sealed_file, **fit_kwargs)
        finally:
            remove(copy)
    inplace.run(fit_once, control_dir, int(environ.get("RANK", "0")), backend, timeout_s, environ=environ)
