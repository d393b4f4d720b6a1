"""Job metrics: the textfiles a rank and the supervisor write, parsed back as Prometheus would."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurmtools.common import ledger
from slurmtools.requeue import job_metrics
from slurmtools.requeue import goodput
from slurmtools.train import metrics
from tests.unit.ranks import rank_argv

LABELS = {"slurm_job": "42", "attempt": "42.1", "node": "node2", "rank": "3"}


def samples(path: Path) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def by_name(found, name):
    return {labels: value for (metric, labels), value in found.items() if metric == name}


def test_a_rank_writes_its_step_numbers_with_units_and_labels(tmp_path):
    clock = iter([0.0, 0.0, 1.0, 6.0, 6.0]).__next__
    step = metrics.StepMetrics(tmp_path / "m.prom", LABELS, min_interval_s=5.0, clock=clock)
    assert step.record(metrics.StepSample(10, 0.5, tokens=4096, loss=2.5, grad_norm=1.25, collective_s=0.125,
                                          data_wait_s=0.01))
    assert not step.record(metrics.StepSample(11, 0.5, tokens=4096, loss=float("nan"), collective_s=0.25))
    assert step.record(metrics.StepSample(12, 0.25, tokens=4096, loss=2.0, collective_s=0.05))
    found = samples(tmp_path / "m.prom")
    labels = tuple(sorted(LABELS.items()))
    want = {"slurmtools_train_step": 12, "slurmtools_train_steps_total": 3, "slurmtools_train_step_seconds": 0.25,
            "slurmtools_train_tokens_per_second": 16384, "slurmtools_train_tokens_total": 12288,
            "slurmtools_train_loss": 2.0, "slurmtools_train_step_collective_seconds": 0.05,
            "slurmtools_train_collective_seconds_total": 0.425, "slurmtools_train_collective_share_ratio": 0.2}
    assert {name: found[(name, labels)] for name in want} == pytest.approx(want)
    # not measured in the last step: absent, not zero
    assert ("slurmtools_train_grad_norm", labels) not in found
    assert ("slurmtools_train_step_data_wait_seconds", labels) not in found
    assert set(name for name, _ in found) <= set(metrics.METRICS)


def test_every_name_follows_the_conventions():
    for name, (kind, _help) in metrics.METRICS.items():
        assert name.startswith("slurmtools_") and name == name.lower()
        assert name.endswith("_total") == (kind == "counter"), name


def test_missing_labels_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="StepMetrics needs labels rank"):
        metrics.StepMetrics(tmp_path / "m.prom", {"slurm_job": "1", "attempt": "1.0", "node": "n"})


def test_the_supervisor_writes_restarts_by_cause_and_goodput_from_the_ledger(tmp_path):
    events = [ledger.AttemptStart("42.0", 0.0), ledger.AttemptEnd("42.0", 100.0, "node_failure", counted=True,
                                                                  node="node2", last_step=50, first_step_t=10.0,
                                                                  checkpoint_step=40),
              ledger.AttemptStart("42.1", 130.0, restart=1, resume_step=40),
              ledger.NodeSlowdown("42.1", 150.0, 41, 60, {"node3": 2.0}, straggler="node3", action="report"),
              ledger.AttemptEnd("42.1", 200.0, "preempted", last_step=80, first_step_t=140.0, checkpoint_step=80),
              ledger.AttemptStart("42.2", 210.0, restart=2, resume_step=80),
              ledger.AttemptEnd("42.2", 300.0, "completed", last_step=100, first_step_t=220.0, checkpoint_step=100)]
    assert job_metrics.restarts_by_cause(events) == {"node_failure": 1, "preempted": 1}
    metrics.write(tmp_path / "job.prom", job_metrics.job_registry_from_ledger(events, {"slurm_job": "42", "node": "node1"}))
    found = samples(tmp_path / "job.prom")
    job = (("node", "node1"), ("slurm_job", "42"))
    assert by_name(found, "slurmtools_job_restarts_total") == {(("cause", "node_failure"),) + job: 1.0,
                                                               (("cause", "preempted"),) + job: 1.0}
    assert found[("slurmtools_job_attempts_total", tuple(sorted(job)))] == 3
    assert found[("slurmtools_job_steps_lost_total", tuple(sorted(job)))] == 10
    assert found[("slurmtools_job_restart_latency_seconds", tuple(sorted(job)))] == 20   # 200 -> first step 220
    assert found[("slurmtools_job_stragglers_total", tuple(sorted(job)))] == 1
    assert found[("slurmtools_job_final_step", tuple(sorted(job)))] == 100
    assert found[("slurmtools_job_goodput_ratio", tuple(sorted(job)))] == pytest.approx(
        goodput.goodput(events).ratio)


def test_textfile_names_are_safe():
    assert metrics.textfile_name("42", "rank3") == "slurmtools_job_42_rank3.prom"
    assert metrics.textfile_name("42_7", "../x y") == "slurmtools_job_42_7_.._x_y.prom"


def test_training_control_writes_metrics_only_when_the_job_asks(tmp_path, monkeypatch, capsys):
    from slurmtools.train.control import TrainingControl
    monkeypatch.delenv(metrics.METRICS_DIR_ENV, raising=False)
    quiet = TrainingControl(rank=0)
    quiet.step_done(1, 0.5, tokens=10)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "textfiles"))
    monkeypatch.setenv("SLURMTOOLS_ATTEMPT_ID", "77.2")
    control = TrainingControl(rank=5)
    control.step_done(1, 0.5, tokens=10, loss=3.0, collective_s=0.1)
    control.step_done(2, 0.5, tokens=10, loss=2.0, collective_s=0.1)     # within the interval: not written yet
    control.mark_complete(2)                                              # ... but flushed at the end
    found = samples(tmp_path / "textfiles" / "slurmtools_job_77_rank5.prom")
    labels = (("attempt", "77.2"), ("node", __import__("socket").gethostname().split(".")[0]), ("rank", "5"),
              ("slurm_job", "77"))
    assert (found[("slurmtools_train_step", labels)], found[("slurmtools_train_loss", labels)]) == (2, 2.0)
    # a directory that cannot be written turns metrics off with one line; training goes on
    (tmp_path / "blocked").write_text("a file, not a directory")
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "blocked"))
    blocked = TrainingControl(rank=0)
    blocked.step_done(1, 0.5)
    blocked.step_done(2, 0.5)
    assert capsys.readouterr().err.count("slurmtools: metrics off for rank 0:") == 1


def test_the_supervisor_file_is_written_from_the_ledger_or_skipped(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    ledger.append(control, ledger.AttemptStart("8.0", 0.0))
    assert job_metrics.write_job_metrics(control, "8", {}) is None
    path = job_metrics.write_job_metrics(control, "8", {metrics.METRICS_DIR_ENV: str(tmp_path / "tf")})
    assert path == tmp_path / "tf" / "slurmtools_job_8_supervisor.prom"
    assert ("slurmtools_job_attempts_total", (("node", __import__("socket").gethostname().split(".")[0]), ("slurm_job", "8"))) \
        in samples(path)
    (tmp_path / "file").write_text("x")
    assert job_metrics.write_job_metrics(control, "8", {metrics.METRICS_DIR_ENV: str(tmp_path / "file")}) is None


RANKS = """
import datetime, sys, torch.distributed as dist
from slurmtools.train.control import TrainingControl
from slurmtools.reference.tiny_model import TrainConfig; from slurmtools.reference.tiny_fsdp import train
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
control = TrainingControl(rank=dist.get_rank())
train(TrainConfig(steps=4, checkpoint_every=2, checkpoint_dir=sys.argv[1]), control, log=lambda r: None)
"""


def test_real_ranks_of_the_example_trainer_write_their_step_metrics(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    pytest.importorskip("torch")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               SLURMTOOLS_ATTEMPT_ID="9.0", **{metrics.METRICS_DIR_ENV: str(tmp_path / "tf")})
    procs = [subprocess.Popen(rank_argv(RANKS, str(tmp_path / "ckpt"), fsdp=True), env=dict(env, RANK=str(rank)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    errors = [proc.communicate(timeout=180)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors
    losses = []
    for rank in range(2):
        found = samples(tmp_path / "tf" / f"slurmtools_job_9_rank{rank}.prom")
        values = {name: value for (name, labels), value in found.items() if ("rank", str(rank)) in labels}
        assert values["slurmtools_train_step"] == 4 and values["slurmtools_train_steps_total"] == 4
        assert values["slurmtools_train_tokens_total"] == 4 * 8 * 32
        assert values["slurmtools_train_step_seconds"] > 0 and values["slurmtools_train_step_collective_seconds"] >= 0
        losses.append((values["slurmtools_train_loss"], values["slurmtools_train_grad_norm"]))
        assert values["slurmtools_train_step_data_wait_seconds"] >= 0
    assert losses[0] == losses[1] and losses[0][1] > 0   # all-reduced loss and gradient norm: the same on every rank


def test_a_specs_metrics_dir_reaches_the_job_and_names_each_nodes_dir():
    from slurmtools.job import sbatch
    from slurmtools.spec import spec_from_dict
    spec = spec_from_dict({"name": "m", "command": ["train.py"], "metrics_dir": "/shared/metrics/%N"})
    assert ("SLURMTOOLS_METRICS_DIR", "/shared/metrics/%N") in sbatch.environment(spec)
    assert metrics.metrics_dir({metrics.METRICS_DIR_ENV: "/shared/metrics/%N"}, host="node2") == \
        Path("/shared/metrics/node2")
    assert metrics.metrics_dir({}) is None
    assert "SLURMTOOLS_METRICS_DIR" not in dict(sbatch.environment(spec_from_dict({"name": "m",
                                                                                   "command": ["t.py"]})))
