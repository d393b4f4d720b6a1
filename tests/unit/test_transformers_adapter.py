"""The Transformers Trainer adapter on one CPU process with the real library and a tiny GPT-2
built from a config (no download): every checkpoint-N sealed once written, the checkpoint the
supervisor asks for (then a stop for the requeue), the resume from the newest sealed one (one
cut off mid-write never), completion."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from slurmtools.checkpoint.manager import MANIFEST  # noqa: E402
from slurmtools.common.control_dir import COMPLETE_FILE, CONTROL_DIR_ENV, REQUEST_FILE, STOPPED_FILE  # noqa: E402
from slurmtools.integrations.transformers import SlurmtoolsTrainerCallback, resume_path  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def _train(tmp_path: Path, max_steps: int) -> "transformers.Trainer":
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    torch.manual_seed(0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=max_steps, save_steps=2,
                                          per_device_train_batch_size=4, report_to=[], use_cpu=True,
                                          logging_strategy="no", disable_tqdm=True, save_total_limit=2)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                                   callbacks=[SlurmtoolsTrainerCallback()])
    trainer.train(resume_from_checkpoint=resume_path(str(tmp_path / "out")))
    return trainer


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path / "control"))
    return tmp_path / "control"


def test_every_checkpoint_is_sealed_and_the_run_marks_completion(tmp_path: Path, control: Path):
    trainer = _train(tmp_path, 6)
    assert trainer.state.global_step == 6
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-4",
                                                                                          "checkpoint-6"]
    assert all((out / name / MANIFEST).is_file() for name in ("checkpoint-4", "checkpoint-6"))
    assert json.loads((control / COMPLETE_FILE).read_text())["step"] == 6
    assert resume_path(str(out)) == str(out / "checkpoint-6")


def test_the_requested_checkpoint_stops_training_and_the_next_run_resumes_there(tmp_path: Path, control: Path):
    control.mkdir(parents=True)
    (control / REQUEST_FILE).write_text("{}")
    trainer = _train(tmp_path, 6)
    assert trainer.state.global_step == 1
    assert json.loads((control / STOPPED_FILE).read_text())["step"] == 1
    assert resume_path(str(tmp_path / "out")) == str(tmp_path / "out" / "checkpoint-1")
    (control / REQUEST_FILE).unlink()
    trainer = _train(tmp_path, 6)
    assert trainer.state.global_step == 6 and (control / COMPLETE_FILE).exists()


def test_a_checkpoint_cut_off_mid_write_is_never_resumed_from(tmp_path: Path, control: Path):
    _train(tmp_path, 2)
    cut = tmp_path / "out" / "checkpoint-4"
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(b"half a model")          # the Trainer was killed here
    assert resume_path(str(tmp_path / "out")) == str(tmp_path / "out" / "checkpoint-2")
