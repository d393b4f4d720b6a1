"""bench/gpu_check.sh on a machine without a GPU: it runs to its end, every GPU line says it was
skipped and why, and the CPU line (the checkpoint bench on CPU ranks with any GPU hidden) runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_to_its_end_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench/gpu_check.sh runs the real checks")
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], env=dict(os.environ, PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [re.sub(r" \[\d+ s\]$", "", line) for line in proc.stdout.splitlines()[1:]]
    assert lines[0].startswith(f"device: ok — torch {torch.__version__}, no GPU")
    assert lines[1:5] == [f"{name}: skipped: no GPU" for name in ("health-gate", "canary", "trainer", "snapshot-stall")]
    assert lines[5].startswith("checkpoint-bench-cpu: ok — 4 CPU ranks, the GPU hidden: model ")
    assert re.search(r"ratio async-blocking/sync-save \d", lines[5])
    assert len(lines) == 6

