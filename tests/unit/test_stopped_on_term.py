"""Slurm's SIGTERM (a cancel, a person's requeue, a preemption) and the ranks checkpointed and
stopped: the supervisor records its decision at once, before the step has ended, because Slurm
SIGKILLs it KillWait after the SIGTERM whether srun has ended or not (R48: a cancel's record lost
that way on a loaded machine). A real supervisor process around a program that stops on request
and then ends only once the decision is in the ledger (at most 30 s), as a slow srun can."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurmtools.common import ledger
from slurmtools.common.control_dir import ATTEMPT_ID_ENV, CONTROL_DIR_ENV, REQUEST_FILE, STOPPED_FILE

PROGRAM = """
import json, os, sys, time
control, attempt = os.environ[sys.argv[1]], os.environ[sys.argv[2]]
open(sys.argv[5], "w").close()                                   # started
while not os.path.exists(os.path.join(control, sys.argv[3])):   # the checkpoint request
    time.sleep(0.05)
with open(os.path.join(control, sys.argv[4]), "w") as handle:   # checkpointed and stopped
    json.dump({"step": 3, "attempt_id": attempt}, handle)
ledger, until = os.path.join(control, sys.argv[6]), time.time() + 30
while time.time() < until:                                       # the step's slow end: it outlasts
    if os.path.exists(ledger) and '"end"' in open(ledger).read():  # the decision, if that comes first
        break
    time.sleep(0.05)
time.sleep(2)                                                    # (the decision line follows it)
print(json.dumps({"exited_t": time.time()}), flush=True)
"""

SUPERVISOR = """
import sys
from pathlib import Path
from slurmtools.requeue import supervisor
from slurmtools.spec import RequeueSpec
config = supervisor.SupervisorConfig(requeue=RequeueSpec(hang_timeout_s=0), control_dir=Path(sys.argv[1]), poll_s=0.1)
raise SystemExit(supervisor.run(config, [sys.executable, "-c", sys.argv[2], *sys.argv[3:]]))
"""


def test_the_decision_is_recorded_before_the_stopped_step_ends(tmp_path: Path):
    started = tmp_path / "started"
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM", "SLURMTOOLS"))}
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path / "control"), PROGRAM, CONTROL_DIR_ENV,
                             ATTEMPT_ID_ENV, REQUEST_FILE, STOPPED_FILE, str(started), ledger.LEDGER_FILE],
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kinds = [line.get("slurmtools", "program") for line in lines]
    # Slurm's SIGTERM recorded first, before the checkpoint is asked for (a save may outlast KillWait)
    assert kinds == ["start", "term_received", "checkpoint_requested", "decision", "program", "step_end"], (
        kinds, err[-2000:])
    assert lines[1]["t"] <= lines[2]["t"]
    decision, exited = lines[3], lines[4]
    assert (decision["cause"], decision["action"]) == ("preempted", "stop")
    assert decision["t"] < exited["exited_t"]
    ends = [event for event in ledger.read(tmp_path / "control") if isinstance(event, ledger.AttemptEnd)]
    assert [(end.cause, end.counted) for end in ends] == [("preempted", False)]
    assert ends[0].time_s < exited["exited_t"]
    assert lines[5]["exit_code"] == 0
