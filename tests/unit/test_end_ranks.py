"""Ending a hung node's ranks (slurmtools/train/end_ranks.py), with real processes: those of this
job's attempt go, with their node's heartbeat file; another attempt's, another job's and the
ender's own line stay."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import psutil
import pytest

from slurmtools.common.control_dir import ATTEMPT_ID_ENV, CONTROL_DIR_ENV, HEARTBEAT_DIR
from slurmtools.train import end_ranks
from slurmtools.train.node_beat import node_file_name


def _sleeper(job: str, attempt: str) -> "subprocess.Popen[bytes]":
    env = dict(os.environ, SLURM_JOB_ID=job, **{ATTEMPT_ID_ENV: attempt})
    process = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
                               env=env, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"up\n"     # running its program
    return process


def test_only_the_attempts_processes_on_the_node_are_ended_and_its_heartbeat_file_removed(tmp_path):
    beat = tmp_path / HEARTBEAT_DIR / node_file_name("n2")
    beat.parent.mkdir()
    beat.write_text("{}")
    rank, other_attempt, other_job = _sleeper("41", "41.0"), _sleeper("41", "41.0.1"), _sleeper("42", "41.0")
    try:
        said = end_ranks.end({"SLURM_JOB_ID": "41", ATTEMPT_ID_ENV: "41.0", CONTROL_DIR_ENV: str(tmp_path)}, "n2")
        assert said == "ended 1 process(es) of attempt 41.0 on n2"
        assert not psutil.pid_exists(rank.pid)          # killed and reaped (here by the ender's wait: its child)
        assert other_attempt.poll() is None and other_job.poll() is None
        assert not beat.exists()
    finally:
        for process in (rank, other_attempt, other_job):
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


def test_the_ender_outside_a_job_step_says_what_is_missing_in_one_line():
    with pytest.raises(SystemExit) as stopped:
        end_ranks.end({"SLURM_JOB_ID": "41"}, "n2")
    assert str(stopped.value) == ("slurmtools.train.end_ranks: run it as a step of the job: SLURM_JOB_ID, "
                                  "SLURMTOOLS_ATTEMPT_ID and SLURMTOOLS_CONTROL_DIR must be set")


def test_the_attempts_processes_are_matched_by_their_environment():
    assert end_ranks.of_this_attempt({"SLURM_JOB_ID": "41", ATTEMPT_ID_ENV: "41.0"}, "41", "41.0")
    assert not end_ranks.of_this_attempt({"SLURM_JOB_ID": "41", ATTEMPT_ID_ENV: "41.0.1"}, "41", "41.0")
    assert not end_ranks.of_this_attempt({ATTEMPT_ID_ENV: "41.0"}, "41", "41.0")


def test_a_process_of_the_attempt_on_another_node_is_left_alone(tmp_path):
    """The mini-cluster's nodes share the machine's process table: another node is another UTS
    namespace (its hostname), and its ranks of the same attempt are not this node's to end."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a UTS namespace of its own")
    env = dict(os.environ, SLURM_JOB_ID="41", **{ATTEMPT_ID_ENV: "41.0"})
    elsewhere = subprocess.Popen(["unshare", "--uts", sys.executable, "-c",
                                  "import time; print('up', flush=True); time.sleep(120)"], env=env,
                                 stdout=subprocess.PIPE)
    try:
        assert elsewhere.stdout is not None and elsewhere.stdout.readline() == b"up\n"
        said = end_ranks.end({"SLURM_JOB_ID": "41", ATTEMPT_ID_ENV: "41.0", CONTROL_DIR_ENV: str(tmp_path)}, "n2")
        assert said == "ended 0 process(es) of attempt 41.0 on n2"
        assert elsewhere.poll() is None
    finally:
        elsewhere.kill()
        elsewhere.wait()
        assert elsewhere.stdout is not None
        elsewhere.stdout.close()
