"""The job-metrics relay: what of a job's inbox file reaches node_exporter (model), and the
root-owned inbox and textfile directories (inbox), on real directories."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmtools.common.schema import build
from slurmtools.errors import SpecError
from slurmtools.metricsrelay import inbox, model
from slurmtools.metricsrelay.config import JobMetricsSettings

OWN = """# HELP slurmtools_train_step The step.
# TYPE slurmtools_train_step gauge
slurmtools_train_step{slurm_job="7",attempt="7.0.1",node="elsewhere",rank="0",user="root"} 20.0
# HELP slurmtools_job_restarts_total Restarts.
# TYPE slurmtools_job_restarts_total counter
slurmtools_job_restarts_total{cause="crash"} 1.0
"""


def test_a_jobs_own_samples_are_relayed_with_its_job_node_and_user_set_by_root():
    vetted = model.vet(OWN, "7", "node1", "alice")
    assert vetted.refused == [] and vetted.refused_count == 0
    assert model.render(vetted.families) == (
        "# HELP slurmtools_train_step Last training step finished by this rank\n# TYPE slurmtools_train_step gauge\n"
        'slurmtools_train_step{attempt="7.0.1",node="node1",rank="0",slurm_job="7",user="alice"} 20.0\n'
        "# HELP slurmtools_job_restarts_total Attempts that ended in a failure or preemption, by cause\n"
        "# TYPE slurmtools_job_restarts_total counter\n"
        'slurmtools_job_restarts_total{cause="crash",node="node1",slurm_job="7",user="alice"} 1.0\n')


@pytest.mark.parametrize("labels, why", [
    ('slurm_job="8"', "names another job (slurm_job='8')"),
    ('attempt="8.0"', "names another job (attempt='8.0')"),
    ('attempt="77.0"', "names another job (attempt='77.0')"),      # a prefix of the id is not the job
])
def test_a_sample_naming_another_job_is_refused(labels, why):
    vetted = model.vet(f"# TYPE slurmtools_train_loss gauge\nslurmtools_train_loss{{{labels}}} 1\n", "7", "node1",
                       "alice")
    assert vetted.families == [] and vetted.refused == [f"slurmtools_train_loss: {why}"]


def test_only_job_metric_families_pass_and_refusals_are_counted_not_echoed():
    text = "".join(f'slurmtools_health_status{{check="c{i}"}} 0\n' for i in range(50)) + "node_load1 9\n"
    vetted = model.vet(text, "7", "node1", "alice")
    assert vetted.families == [] and vetted.refused_count == 51         # each refusal said once
    assert vetted.refused == ["slurmtools_health_status: not a job metric", "node_load1: not a job metric"]
    flood = "# TYPE slurmtools_train_loss gauge\n" + "".join(f'slurmtools_train_loss{{slurm_job="{i}"}} 1\n' for i in range(100, 200))
    many = model.vet(flood, "7", "node1", "alice")
    assert many.refused_count == 100 and len(many.refused) == model.MAX_REFUSALS_SAID


def test_only_the_tables_type_help_and_labels_pass():
    text = ("# HELP slurmtools_train_loss anything the user likes\n# TYPE slurmtools_train_loss gauge\n"
            'slurmtools_train_loss{rank="0",exporter_node="node3"} 1\n'
            'slurmtools_train_loss{rank="1"} 2\nslurmtools_train_loss{rank="1"} 3\n'
            "# TYPE slurmtools_train_step counter\nslurmtools_train_step_total 4\n"
            "# TYPE slurmtools_job_restarts_total counter\n"
            'slurmtools_job_restarts_total{cause="crash"} 1\nslurmtools_job_restarts_created{cause="crash"} 17\n')
    vetted = model.vet(text, "7", "node1", "alice")
    assert vetted.refused == ["slurmtools_train_loss: not as the table has it (label 'exporter_node')",
                              "slurmtools_train_loss: the same series twice",
                              "slurmtools_train_step: not a job metric"]
    assert model.render(vetted.families) == (
        "# HELP slurmtools_train_loss Loss of the last step\n# TYPE slurmtools_train_loss gauge\n"
        'slurmtools_train_loss{node="node1",rank="1",slurm_job="7",user="alice"} 2.0\n'
        "# HELP slurmtools_job_restarts_total Attempts that ended in a failure or preemption, by cause\n"
        "# TYPE slurmtools_job_restarts_total counter\n"
        'slurmtools_job_restarts_total{cause="crash",node="node1",slurm_job="7",user="alice"} 1.0\n')


def test_text_that_is_not_prometheus_is_one_refusal():
    vetted = model.vet('slurmtools_train_loss{slurm_job="7" 1\n', "7", "node1", "alice")
    assert vetted.families == [] and vetted.refused == ["not Prometheus text (ValueError)"]


def test_file_names():
    assert model.relayed_name("7", "slurmtools_job_7_rank0.prom") == "slurmtools_relay_7_slurmtools_job_7_rank0.prom"
    assert model.relayed_job("slurmtools_relay_7_slurmtools_job_7_rank0.prom") == "7"
    assert model.relayed_job("slurmtools_health.prom") is None and model.relayed_job("slurmtools_relay_x_a.prom") is None
    assert model.is_inbox_file("a.prom") and not model.is_inbox_file(".a.prom.tmp")
    assert not model.is_inbox_file("a.txt") and not model.is_inbox_file("a b.prom")
    assert model.is_job_id("123") and not model.is_job_id("12a") and not model.is_job_id("")


def test_settings_go_together_and_are_absolute():
    assert not JobMetricsSettings().enabled
    with pytest.raises(SpecError, match="inbox_dir and textfile_dir go together"):
        build(JobMetricsSettings, {"inbox_dir": "/run/x"})
    with pytest.raises(SpecError, match="must be an absolute path, got 'x'"):
        build(JobMetricsSettings, {"inbox_dir": "x", "textfile_dir": "/y"})
    on = build(JobMetricsSettings, {"inbox_dir": "/run/in/%N", "textfile_dir": "/var/tf/%N"})
    assert (on.inbox_for("node1"), on.textfiles_for("node1")) == (Path("/run/in/node1"), Path("/var/tf/node1"))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the relay's directories are root's")


@pytest.fixture
def settings(tmp_path: Path) -> JobMetricsSettings:
    tmp_path.chmod(0o755)
    return JobMetricsSettings(inbox_dir=str(tmp_path / "inbox" / "%N"), textfile_dir=str(tmp_path / "tf" / "%N"))


@needs_root
def test_prolog_relay_and_epilog_on_real_directories(settings: JobMetricsSettings, tmp_path: Path):
    job_dir = inbox.prepare(settings, "node1", "7", 64321, 64321)
    assert job_dir == tmp_path / "inbox" / "node1" / "7"
    assert (job_dir.stat().st_uid, oct(job_dir.stat().st_mode & 0o777)) == (64321, "0o755")
    (job_dir / "rank0.prom").write_text(OWN)
    os.chown(job_dir / "rank0.prom", 64321, 64321)            # written by the job, as its user
    (job_dir / "fifo.prom").unlink(missing_ok=True)
    os.mkfifo(job_dir / "fifo.prom")                          # never opened for reading: no hang
    (job_dir / "link.prom").symlink_to("/etc/shadow")          # never followed
    lines = inbox.relay_all(settings, "node1")
    relayed = tmp_path / "tf" / "node1" / "slurmtools_relay_7_rank0.prom"
    assert 'slurm_job="7",user="64321"' in relayed.read_text()
    assert lines == [f"slurmtools: metrics of job 7: {name} refused (not a regular file of the job's user, with one "
                     f"link, of at most 1048576 bytes)" for name in ("fifo.prom", "link.prom")]
    assert inbox.finish(settings, "node1", "7") == lines and not job_dir.exists()
    # the finished job's relayed file stays keep_h, then the sweep removes it
    inbox.relay_all(settings, "node1", now_s=relayed.stat().st_mtime + 10)
    assert relayed.exists()
    inbox.relay_all(settings, "node1", now_s=relayed.stat().st_mtime + settings.keep_h * 3600 + 1)
    assert not relayed.exists()


@needs_root
def test_an_inbox_root_others_may_write_is_refused_and_the_phase_says_so_in_one_line(settings, tmp_path):
    root = tmp_path / "inbox" / "node1"
    root.mkdir(parents=True)
    root.chmod(0o777)
    with pytest.raises(inbox.InboxError, match="must be a directory of root's that no one else may write"):
        inbox.prepare(settings, "node1", "7", 64321, 64321)
    lines = inbox.on_phase(settings, "periodic", "node1", None, None, None)
    assert lines == [f"slurmtools: job metrics not relayed: InboxError: {root} must be a directory of root's that "
                     "no one else may write"]
    assert inbox.on_phase(settings, "prolog", "node1", "7", 0, 0) == []      # root's own jobs get no inbox


def test_client_timestamps_are_dropped_and_a_series_twice_across_files_is_refused():
    """Issue 51, finding 9: node_exporter drops a textfile with timestamps (and sets its scrape
    error); the same series in two files of one job made it refuse both."""
    stamped = OWN.replace("} 20.0", "} 20.0 1700000000000")
    seen: set = set()
    first = model.vet(stamped, "7", "node1", "alice", seen)
    assert first.refused == [] and "1700000000000" not in model.render(first.families)
    second = model.vet(OWN, "7", "node1", "alice", seen)
    assert second.refused_count == 2 and second.families == []
    assert second.refused[0] == "slurmtools_train_step: the same series twice"


@needs_root
def test_an_inbox_file_of_another_owner_or_with_a_second_link_is_not_read(settings: JobMetricsSettings, tmp_path: Path):
    job_dir = inbox.prepare(settings, "node1", "7", 64321, 64321)
    secret = tmp_path / "roots.prom"
    secret.write_text(OWN)                                     # root's: a hard link would have root read it
    os.link(secret, job_dir / "hardlink.prom")
    (job_dir / "planted.prom").write_text(OWN)                 # not the job user's own file
    os.chown(job_dir / "planted.prom", 64322, 64322)
    lines = inbox.relay_all(settings, "node1")
    assert sorted(line.split(": ")[2].split(" ")[0] for line in lines) == ["hardlink.prom", "planted.prom"]
    assert not list((tmp_path / "tf" / "node1").glob("slurmtools_relay_7_*"))

