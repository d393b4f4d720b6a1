"""Real per-node cgroups, as production runs them: each task gets exactly the CPUs the spec asked
for (both launchers), a job past its memory is OOM-killed by Slurm and the supervisor says OOM,
and a job can open only the GPU device files it was given."""
from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import pytest

from slurmtools.slurm import commands as slurm
from tests.cluster import training
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

# Reports its CPU affinity (and its parent's: the torchrun agent for that launcher), then marks
# the run complete so the supervisor ends the job as COMPLETED.
AFFINITY = """
import json, os, sys
from slurmtools.train.control import TrainingControl
rank = int(os.environ.get("RANK", "0"))
parent = sorted(os.sched_getaffinity(os.getppid())) if sys.argv[1] == "torchrun" else None
# one write per line: two unbuffered ranks share the pipe, and print() writes text and newline apart
sys.stdout.write(json.dumps({"rank": rank, "host": os.uname().nodename, "cpus": sorted(os.sched_getaffinity(0)),
                             "parent_cpus": parent}) + chr(10))
sys.stdout.flush()
TrainingControl().mark_complete(0)
"""

HOG = """
import sys, time
print("allocating", flush=True)
block = bytearray(int(sys.argv[1]) * 1024 * 1024)
for offset in range(0, len(block), 4096):
    block[offset] = 1
time.sleep(5)
print("still alive", flush=True)
"""


def run_spec(shared_tmp: Path, name: str, script: str, args: list, **over: object):
    program = shared_tmp / f"{name}.py"
    program.write_text(script)
    spec = training.training_spec(shared_tmp, name, **{"command": [str(program), *args], **over})
    job = training.submit(spec)
    return spec, job, training.wait_finished(job, 120)


def reports(spec, job) -> list:
    return [json.loads(line) for line in training.output(spec, job).splitlines() if line.startswith('{"cpus"')
            or line.startswith('{"host"') or '"parent_cpus"' in line]


def test_torchrun_agent_and_its_workers_get_the_cpus_the_spec_asked_for(cluster, user_tmp: Path):
    training.settle()
    cpus = cluster.cpus_per_node
    spec, job, info = run_spec(user_tmp, "aff-torchrun", AFFINITY, ["torchrun"], nodes=1, processes_per_node=2,
                               cpus_per_task=cpus)
    assert info.state == "COMPLETED", training.describe(spec, job)
    seen = reports(spec, job)
    assert sorted(r["rank"] for r in seen) == [0, 1]
    assert all(len(r["cpus"]) == cpus and r["parent_cpus"] == r["cpus"] for r in seen), seen


@pytest.mark.every_release
def test_srun_launcher_binds_each_rank_to_its_own_cpu(cluster, user_tmp: Path):
    training.settle()
    spec, job, info = run_spec(user_tmp, "aff-srun", AFFINITY, ["srun"], nodes=2, processes_per_node=2,
                               launcher="srun", cpus_per_task=1, python=sys.executable)
    assert info.state == "COMPLETED", training.describe(spec, job)
    seen = reports(spec, job)
    assert sorted(r["rank"] for r in seen) == [0, 1, 2, 3]
    assert all(len(r["cpus"]) == 1 for r in seen), seen
    for host in {r["host"] for r in seen}:
        on_host = [r["cpus"][0] for r in seen if r["host"] == host]
        assert len(on_host) == 2 and len(set(on_host)) == 2, seen        # two ranks, two different CPUs


@pytest.mark.every_release
def test_a_job_past_its_memory_is_oom_killed_and_the_supervisor_says_oom(cluster, user_tmp: Path):
    training.settle()
    spec, job, info = run_spec(user_tmp, "oom", HOG, ["1200"], nodes=1, processes_per_node=1, mem_gb=0.5,
                               launcher="srun", python=sys.executable)
    out = training.output(spec, job)
    assert "still alive" not in out, training.describe(spec, job)
    decision = training.supervisor_events(training.events(spec, job), "decision")
    assert [(d["cause"], d["action"]) for d in decision] == [("oom", "stop")], training.describe(spec, job)
    assert info.state in ("FAILED", "OUT_OF_MEMORY")    # the supervisor stopped (exit 1)
    steps = wait_for(lambda: [row for row in slurm.sacct_rows(job, ("JobID", "State"))
                              if row["State"] == "OUT_OF_MEMORY"], 60, "sacct to record the OOM step")
    assert steps


def test_a_job_step_reads_its_memory_headroom_from_the_cgroup_slurm_made(cluster, user_tmp: Path):
    """The snapshot budget's cgroup bound (slurmtools.snapshot.cgroup_memory) as a rank reads it: a step of a
    job given 0.5 GB finds a limit (Slurm's ConstrainRAMSpace), and at most that much free."""
    training.settle()
    out = user_tmp / "headroom.out"
    job = training.submit_script(f"#!/bin/bash\n#SBATCH -N1 --mem=500M -o {out}\nsrun {sys.executable} -c "
                                 f"'from slurmtools.snapshot import cgroup_memory as cm; print(cm.job_headroom_bytes())'\n")
    assert training.wait_finished(job, 60).state == "COMPLETED", out.read_text() if out.exists() else ""
    headroom = out.read_text().strip().splitlines()[-1]
    assert headroom.isdigit() and 0 < int(headroom) <= 500 * 2 ** 20, headroom


@pytest.mark.every_release
def test_a_job_opens_only_its_own_gpu_devices(cluster, user_tmp: Path):
    training.settle()
    out = user_tmp / "devices.out"
    fake = cluster.fake_gpu_dir
    probe = (f"import errno, json, os\nresult = {{}}\nfor name in sorted(os.listdir('{fake}')):\n"
             f"    try:\n        os.close(os.open(os.path.join('{fake}', name), os.O_RDONLY))\n"
             f"        result[name] = 0\n    except OSError as exc:\n        result[name] = exc.errno\n"
             f"given = os.environ.get('SLURM_STEP_GPUS') or os.environ.get('SLURM_JOB_GPUS')\n"
             f"print(json.dumps({{'given': given, 'open': result}}))\n")
    (user_tmp / "devices.py").write_text(probe)
    job = training.submit_script(f"#!/bin/bash\n#SBATCH -N1 --gpus-per-node=1 -o {out}\nsrun {sys.executable} "
                       f"{user_tmp / 'devices.py'}\n")
    assert training.wait_finished(job, 60).state == "COMPLETED", out.read_text() if out.exists() else ""
    result = json.loads(out.read_text().strip().splitlines()[-1])
    given = f"nvidia{result['given']}"      # the global index (CUDA_VISIBLE_DEVICES is renumbered from 0)
    # the device given to the job is allowed (no driver behind it: ENXIO); every other is denied
    assert result["open"][given] == errno.ENXIO
    assert {name: code for name, code in result["open"].items() if name != given} == {
        f"nvidia{gpu}": errno.EPERM for gpu in range(cluster.gpus_per_node) if f"nvidia{gpu}" != given}
