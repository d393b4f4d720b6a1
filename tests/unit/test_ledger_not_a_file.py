"""A ledger that is not a regular file (issue 51, bad input): as a FIFO `slurmtools run` hung
silently at its first record, as a directory it ended in a traceback. Now one line naming it, at
once, and a non-zero exit of the command."""
import os
import subprocess
import sys
import time

import pytest

from slurmtools.common import ledger
from slurmtools.errors import UsageError


def event():
    return ledger.AttemptStart("1.0", time.time(), 0, "node1", None)


@pytest.mark.parametrize("make", ["fifo", "directory", "link"])
def test_a_ledger_that_is_not_a_regular_file_is_one_line_at_once(tmp_path, make):
    path = tmp_path / ledger.LEDGER_FILE
    if make == "fifo":
        os.mkfifo(path)
    elif make == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    start = time.monotonic()
    with pytest.raises(UsageError, match=f"ledger {path}: "):
        ledger.append(tmp_path, event())
    assert time.monotonic() - start < 2
    assert not (tmp_path / "elsewhere").exists()


def test_slurmtools_run_with_a_fifo_for_a_ledger_says_so_and_exits(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    os.mkfifo(control / ledger.LEDGER_FILE)
    proc = subprocess.run([sys.executable, "-m", "slurmtools", "run", f"--control-dir={control}", "--", "true"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SLURM")})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"ledger {control / ledger.LEDGER_FILE}: cannot be written" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
