"""Values another rank of the node wrote (issue 51, bad input): a NaN in a node-memory record
ended local rank 0's keep-alive thread (the node's file then could not be written, and the node
looked silent), a string step_s or tokens in a step line raised at the final flush, and
phase(timeout_s=inf) raised from inside the heartbeat's JSON."""
import json

import pytest

from slurmtools.common.fsutil import write_json_atomic
from slurmtools.errors import UsageError
from slurmtools.train.control import TrainingControl
from slurmtools.train.node_beat import gather
from slurmtools.train.node_steps import aggregate


def test_a_record_with_a_nan_is_left_out_and_the_nodes_file_still_written(tmp_path):
    (tmp_path / "0.json").write_text(json.dumps({"rank": 0, "step": 3, "time": 1.5}))
    (tmp_path / "1.json").write_text('{"rank": 1, "step": NaN, "time": Infinity}')
    records = gather(tmp_path)
    assert records == [{"rank": 0, "step": 3, "time": 1.5}]
    write_json_atomic(tmp_path / "node.json", {"ranks": records}, durable=False)     # no ValueError


def test_step_lines_with_strings_for_numbers_aggregate_without_them():
    lines = [{"kind": "step", "rank": 0, "step": 5, "attempt_id": "1.0", "step_s": 1.5, "tokens": 100},
             {"kind": "step", "rank": 1, "step": 5, "attempt_id": "1.0", "step_s": "9.9", "tokens": "100"},
             {"kind": "step", "rank": 2, "step": 5, "attempt_id": "1.0", "step_s": True, "tokens": 50}]
    (node,) = aggregate(lines, "node1")
    assert (node["step_s"], node["tokens"], node["slowest_rank"], node["ranks"]) == (1.5, 150, 0, 3)


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan"), 0, -5])
def test_a_phase_without_a_finite_positive_timeout_is_one_line(tmp_path, timeout_s):
    control = TrainingControl(control_dir=tmp_path, rank=0)
    with pytest.raises(UsageError, match="phase 'saving': timeout_s must be a finite number of seconds above 0"):
        with control.phase("saving", timeout_s=timeout_s):
            pass
    with control.phase("saving", timeout_s=60):
        pass
