"""The Lightning adapter on one CPU process with the real library: sealed checkpoints, the
checkpoint the supervisor asks for (then a stop for the requeue), the resume from the newest
complete one (a cut-off one never), completion, and Lightning's own auto-requeue switched off."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [
    # Lightning 2.6 on torch 2.13 uses a pytree class torch deprecates
    pytest.mark.filterwarnings("ignore:.*LeafSpec.* is deprecated:FutureWarning"),
    # its hint for a process started without srun (these tests run outside Slurm on purpose)
    pytest.mark.filterwarnings("ignore:The .srun. command is available on your system but is not used"),
    # Tiny's loader keeps no position: a mid-epoch resume starts its epoch over (a real trainer's may not)
    pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch ended"),
]
L = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402
from lightning.fabric.plugins.environments import SLURMEnvironment  # noqa: E402

from slurmtools.common.control_dir import COMPLETE_FILE, CONTROL_DIR_ENV, REQUEST_FILE, STOPPED_FILE  # noqa: E402
from slurmtools.integrations.lightning import CHECKPOINT_FILE, SlurmtoolsCallback, resume_path  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=gen)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _fit(tmp_path: Path, max_steps: int, **callback) -> "tuple[L.Trainer, SlurmtoolsCallback]":
    cb = SlurmtoolsCallback(checkpoint_dir=str(tmp_path / "ckpt"), **callback)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[cb])
    trainer.fit(Tiny(), ckpt_path=resume_path(str(tmp_path / "ckpt")))
    return trainer, cb


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path / "control"))
    return tmp_path / "control"


def test_a_run_seals_its_checkpoints_and_marks_completion(tmp_path: Path, control: Path):
    trainer, _ = _fit(tmp_path, 6, every_n_steps=2)
    assert trainer.global_step == 6
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_4", "step_6"]      # keep=2
    assert json.loads((control / COMPLETE_FILE).read_text())["step"] == 6
    assert resume_path(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "step_6" / CHECKPOINT_FILE)


def test_the_requested_checkpoint_stops_training_and_the_next_fit_resumes_there(tmp_path: Path, control: Path):
    control.mkdir(parents=True)
    (control / REQUEST_FILE).write_text("{}")
    trainer, cb = _fit(tmp_path, 6, every_n_steps=4)
    assert trainer.global_step == 1 and cb.stopped_for_requeue
    assert json.loads((control / STOPPED_FILE).read_text())["step"] == 1
    assert not (control / COMPLETE_FILE).exists()
    (control / REQUEST_FILE).unlink()
    trainer, _ = _fit(tmp_path, 6, every_n_steps=4)
    assert trainer.global_step == 6 and (control / COMPLETE_FILE).exists()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_4", "step_6"]


def test_a_checkpoint_cut_off_mid_write_is_never_resumed_from(tmp_path: Path, control: Path):
    _fit(tmp_path, 4, every_n_steps=2)
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_8.tmp").mkdir()
    (ckpt / "step_8.tmp" / CHECKPOINT_FILE).write_bytes(b"half a checkpoint")
    (ckpt / "step_9").mkdir()                                          # renamed by hand, no manifest
    (ckpt / "step_9" / CHECKPOINT_FILE).write_bytes(b"no manifest")
    assert resume_path(str(ckpt)) == str(ckpt / "step_4" / CHECKPOINT_FILE)


def test_lightnings_own_slurm_auto_requeue_is_switched_off(tmp_path: Path, control: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "node1",
                        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7",
                        "SLURM_NTASKS_PER_NODE": "1"}.items():
        monkeypatch.setenv(name, value)
    environment = SLURMEnvironment()
    assert environment.auto_requeue
    cb = SlurmtoolsCallback(checkpoint_dir=str(tmp_path / "ckpt"))
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[cb],
                        plugins=[environment])
    trainer.fit(Tiny())
    assert not environment.auto_requeue


def test_a_fit_again_with_the_same_callback_agrees_from_its_first_step(tmp_path: Path, control: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """lightning_inplace fits a survivor again with its callback beside a replacement's new one:
    the agreement's collective must come at the new fit's first step on both (a cadence kept from
    the first fit put it at other steps than the replacement's: a deadlock on the mini-cluster)."""
    from slurmtools.train import agreement
    monkeypatch.setattr(agreement, "steps_until_next_check", lambda step_s, interval_s: 100)
    proposals: "list[int]" = []
    real = agreement.all_ranks_max
    monkeypatch.setattr(agreement, "all_ranks_max", lambda values: proposals.append(-values[1]) or real(values))
    cb = SlurmtoolsCallback(checkpoint_dir=str(tmp_path / "ckpt"), every_n_steps=4)
    model = Tiny()
    for max_steps in (4, 6):           # the second fit resumes from step 4, as after a recovery in place
        L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                  enable_checkpointing=False, enable_model_summary=False, callbacks=[cb]
                  ).fit(model, ckpt_path=resume_path(str(tmp_path / "ckpt")))
    assert proposals == [1 + 100, 5 + 100]
