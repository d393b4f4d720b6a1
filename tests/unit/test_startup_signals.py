"""A warning signal that lands while a process starts (before any handler exists) is held and
handled, never fatal: the submitit task entry, the trainer's handlers, the sbatch script."""
from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtools.job import sbatch, task_start
from slurmtools.spec import spec_from_dict

# A task: the real entry module's first statement, then "imports" (until the signal came: held
# pending by the block, or the task killed by it; at most 30 s), then the trainer's handlers.
TASK = """
import signal, sys, time
{block}
print("started", flush=True)
deadline = time.time() + 30
while time.time() < deadline and not signal.sigpending():
    time.sleep(0.01)
from slurmtools.train.control import TrainingControl
control = TrainingControl(control_dir=None, rank=0)
control.install_signal_handlers()
time.sleep(0.2)
print(sorted(control.signal_names()), flush=True)
"""


def run_task(block: str, sig: int) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", TASK.format(block=block)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(sig)                 # inside the "imports": no handler yet
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_warning_during_start_up_is_held_and_handled(sig: int):
    done = run_task("from slurmtools.common.signals import block_warning_signals; block_warning_signals()", sig)
    assert done.returncode == 0
    assert done.stdout.strip() == str([signal.Signals(sig).name])


def test_without_the_block_the_same_warning_kills_the_task():
    """The failure the block prevents (this is how the notebook time-limit test died)."""
    done = run_task("", signal.SIGUSR2)
    assert done.returncode == -signal.SIGUSR2


def test_task_start_blocks_first_and_only_when_run():
    """Its first statement is the block, under __main__ (importing it changes nothing)."""
    body = ast.parse(Path(task_start.__file__).read_text()).body
    first = body[1]                                    # after the docstring
    assert isinstance(first, ast.If) and ast.unparse(first.test) == "__name__ == '__main__'"
    assert "block_warning_signals()" in ast.unparse(first)
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_task_start_takes_exactly_what_submitit_appends():
    assert task_start.folder_from_argv(["-u", "-m", "submitit.core._submit", "/runs/12"]) == "/runs/12"
    with pytest.raises(SystemExit, match="expected '-u -m submitit.core._submit FOLDER'"):
        task_start.folder_from_argv(["-m", "other", "/runs/12"])


def test_sbatch_script_ignores_the_warning_before_its_first_command():
    spec = spec_from_dict({"name": "x", "command": ["t.py"], "requeue": {"warning_signal": "USR2"}})
    commands = [line for line in sbatch.render(spec).splitlines() if line and not line.startswith("#")]
    assert commands[0] == "trap '' USR2"


def test_a_task_leaves_after_its_result_with_output_flushed_and_no_finalization(tmp_path):
    """What was printed and logged reaches the file; nothing at interpreter exit runs (an atexit
    abort stands in for torch's C++ teardown aborting), and the exit status is 0."""
    out = tmp_path / "task.out"
    code = ("import atexit, logging, os, sys\n"
            "logging.basicConfig(stream=sys.stdout, level=logging.INFO)\n"
            "atexit.register(os.abort)\n"
            "print('result written', end='')\n"
            "logging.getLogger('submitit').info('Exiting after successful completion')\n"
            "from slurmtools.common.leave import leave_without_teardown\n"
            "leave_without_teardown(0)\n")
    with out.open("w") as handle:
        proc = subprocess.run([sys.executable, "-c", code], stdout=handle, stderr=subprocess.STDOUT, timeout=60)
    assert proc.returncode == 0
    assert out.read_text() == "result writtenINFO:submitit:Exiting after successful completion\n"
