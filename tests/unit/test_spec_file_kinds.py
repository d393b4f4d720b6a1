"""A spec that is not a regular file (issue 51, bad input): `render` of a FIFO waited for a writer
for ever, `render /dev/zero` read until MemoryError before the size check. Now one line at once."""
import os
import subprocess
import sys

import pytest

from slurmtools.common.schema import MAX_YAML_BYTES
from slurmtools.errors import SpecError
from slurmtools.spec import load_spec


def render(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmtools", "render", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_render_of_a_fifo_or_a_device_is_one_line_at_once(tmp_path):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        proc = render(path)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        assert "not a regular file (a FIFO, a device, a directory)" in proc.stderr, proc.stderr


def test_a_spec_larger_than_the_limit_is_refused_without_reading_it_all(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as handle:
        handle.truncate(1 << 40)           # a sparse terabyte: reading it whole would never end
    with pytest.raises(SpecError, match=f"larger than {MAX_YAML_BYTES // 1024} KiB"):
        load_spec(big)
    link = tmp_path / "link.yaml"
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: j\nnodes: 1\ncommand: [train.py]\n")
    link.symlink_to(ok)                     # the user's own link to their own spec is fine
    assert load_spec(link).name == "j"
