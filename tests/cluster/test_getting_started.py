"""The getting-started page's rehearsal walked as written (docs/getting-started.md, section 4): its
commands in order, as root runs them, with two substitutions only — the test cluster's job user for
the page's `slurmtools-mini` (the `mini` cluster's), and a scratch copy of the checkout's example
for the checkout (its `.venv` linked), so that a demo's own runs/ is never touched. The clone, the
bootstrap and `minicluster up` are what this suite did before it; the page must still name them.
The example job (2 nodes of 2 ranks and a hot spare) must complete within the page's ten minutes
and its report must show one attempt that trained to the end."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import List

import pytest
from ClusterShell.NodeSet import NodeSet

from slurmtools.slurm import commands as slurm
from tests.cluster import asuser

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
PAGE_USER = "slurmtools-mini"
DONE_BEFORE = ("git clone <this repository> slurmtools && cd slurmtools", "bash scripts/bootstrap.sh",
               ".venv/bin/slurmtools minicluster up")
WALKED = ("install -d -m 0755 runs && install -d -o slurmtools-mini runs/tiny-fsdp",
          "runuser -u slurmtools-mini -- .venv/bin/slurmtools submit examples/tiny_fsdp/job.yaml --wait",
          "runuser -u slurmtools-mini -- .venv/bin/slurmtools report JOBID --spec examples/tiny_fsdp/job.yaml")


def rehearsal_commands() -> List[str]:
    """The commands of the page's rehearsal section (its indented block), comments left out."""
    section = PAGE.read_text().split("\n## 4.", 1)[1]
    return [line.split("  #", 1)[0].strip() for line in section.splitlines()
            if line.startswith("    ") and line.strip()]


def test_the_page_names_exactly_the_commands_this_test_walks():
    assert rehearsal_commands() == [*DONE_BEFORE, *WALKED]


def _run(command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    walked = command.replace(PAGE_USER, asuser.user().name)
    return subprocess.run(["bash", "-c", walked], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def test_a_first_job_with_a_spare_runs_to_its_end_as_the_page_says(workdir):
    checkout = workdir / "slurmtools"
    checkout.mkdir()
    shutil.copytree(ROOT / "examples" / "tiny_fsdp", checkout / "examples" / "tiny_fsdp",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    prepare, submit, report = WALKED
    made = _run(prepare, checkout, 30)
    assert made.returncode == 0, made.stderr
    assert (checkout / "runs" / "tiny-fsdp").stat().st_uid == asuser.user().uid
    started = time.monotonic()
    submitted = _run(submit, checkout, 600)
    job = int(submitted.stdout.split()[0]) if submitted.stdout.split() else None
    assert submitted.returncode == 0, f"{submitted.stdout}\n{submitted.stderr[-3000:]}"
    assert f"job {job}: COMPLETED exit=0" in submitted.stderr
    assert time.monotonic() - started < 600
    info = slurm.job_state(job)
    assert info.state == "COMPLETED" and len(NodeSet(info.nodes)) == 3     # two nodes and the spare
    shown = _run(report.replace("JOBID", str(job)), checkout, 120)
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"^  {job}\.0 .* steps 0\.\.60  completed -> complete$", shown.stdout, re.M), shown.stdout
