"""A warm standby on a spare (slurmtools/train/standby.py), for real: a process that imported torch
and its script's own imports waits for the supervisor's go, then runs the script as the block's
rank it was told (rank from the first rank and its local rank, the world, the generation), with the
script's own arguments. A go that is no go, or no script, is a one-line error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtools.common import generation
from slurmtools.common.control_dir import CONTROL_DIR_ENV
from slurmtools.train import standby

REPO = Path(__file__).resolve().parents[2]

SCRIPT = '''import json, os, sys
import xml.dom.minidom
print(json.dumps({"argv": sys.argv[1:], "rank": os.environ["RANK"], "local": os.environ["LOCAL_RANK"],
                  "world": os.environ["WORLD_SIZE"], "generation": os.environ["SLURMTOOLS_GENERATION"],
                  "warm": sorted(m for m in ("torch", "torch._dynamo", "xml.dom.minidom") if m in sys.modules),
                  "name": __name__}))
'''


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, **{CONTROL_DIR_ENV: str(tmp_path), "SLURMD_NODENAME": "node7", "SLURM_LOCALID": "1"})
    return subprocess.Popen([sys.executable, "-m", "slurmtools.train.standby", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_standby_waits_for_its_go_then_runs_the_script_as_the_rank_it_was_told(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = _start(tmp_path, str(script), "--steps", "3")
    time.sleep(1.0)
    assert proc.poll() is None                          # waiting: no go yet
    generation.write_go(tmp_path, "node7", 2, 4, 8)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"argv": ["--steps", "3"], "rank": "5", "local": "1", "world": "8", "generation": "2",
                               "warm": ["torch", "torch._dynamo", "xml.dom.minidom"], "name": "__main__"}


def test_a_go_that_is_no_go_and_a_missing_script_are_one_line_errors(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "standby-node7.json").write_text('{"generation": 0, "rank_base": 0, "world": 2}')
    proc = _start(tmp_path, str(script))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.startswith("slurmtools.train.standby: error: ") and "is no go" in err
    assert len(err.strip().splitlines()) == 1
    proc = _start(tmp_path, "run.sh")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "usage: python -m slurmtools.train.standby SCRIPT.py" in err


@pytest.mark.parametrize("text, problem", [
    ('{"generation": 1, "rank_base": 2, "world": 4}', "expected generation, rank_base, world and local_base"),
    ('{"generation": 1, "rank_base": 2, "world": 2, "local_base": 0}', "out of range"),
    ('{"generation": true, "rank_base": 0, "world": 2, "local_base": 0}', "out of range"),
    ('{"generation": 1, "rank_base": 0, "world": 2, "local_base": -1}', "out of range"),
])
def test_a_go_is_read_whole_or_refused(text, problem):
    with pytest.raises(ValueError, match=problem):
        generation.parse_go(text)
    assert generation.parse_go('{"generation": 1, "rank_base": 2, "world": 4, "local_base": 3}') == (1, 2, 4, 3)


def test_a_standby_on_a_training_node_becomes_the_crashed_rank_with_its_local_rank(tmp_path):
    """A rank restarted on its own node from the node's standby keeps its local rank (its GPU)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = _start(tmp_path, str(script))
    generation.write_go(tmp_path, "node7", 3, 6, 8, local_base=2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    said = json.loads(out)
    assert (said["rank"], said["local"], said["generation"]) == ("7", "3", "3")     # its task is local 1


def test_a_standby_never_given_a_go_ends_when_training_completed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = _start(tmp_path, str(script))
    (tmp_path / "complete").write_text("{}")
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (0, ""), err


def test_the_scripts_own_top_level_imports_are_the_ones_warmed(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("from __future__ import annotations\nimport os, json as j\nfrom pathlib import Path\n"
                      "from . import sibling\n\ndef f():\n    import late\n")
    assert standby.top_level_imports(script) == ["os", "json", "pathlib"]


def test_imports_under_a_with_or_a_try_at_the_top_are_warmed_too(tmp_path):
    """The reference trainer imports torch under `with collector_paused():`; an optional import sits
    in a try. Their imports run at the module's top, so a standby warms them; a function's do not."""
    script = tmp_path / "t.py"
    script.write_text("from slurmtools.common.import_pause import collector_paused\n"
                      "with collector_paused():\n    import torch\n    with open('x'):\n        import csv\n"
                      "try:\n    import yaml\nexcept ImportError:\n    import json\n"
                      "if True:\n    import skipped_if\n\ndef f():\n    import late\n")
    assert standby.top_level_imports(script) == ["slurmtools.common.import_pause", "torch", "csv", "yaml"]


def test_the_reference_trainers_imports_are_warmed():
    assert {"torch", "torch._dynamo", "slurmtools.tiny_fsdp"} <= set(
        standby.top_level_imports(REPO / "examples" / "tiny_fsdp" / "train.py"))
