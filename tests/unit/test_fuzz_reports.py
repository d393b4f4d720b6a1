"""Property-based fuzzing of what `slurmtools report` and `goodput` read -- the ledger, the step log
-- and of the flight-recorder dump reader, on random and adversarial records (huge integers,
extreme floats, NaN, deep nesting, control characters and mathtext in names): no exception
escapes, nothing hangs, memory stays bounded. Derandomized, so a run is reproducible."""
from __future__ import annotations

import json
import pickle
import tracemalloc
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtools.common import ledger
from slurmtools.report import text as jobreport
from slurmtools.requeue import job_metrics
from slurmtools.train import fr_dump, metrics, steplog

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

numbers = st.one_of(st.integers(min_value=-10 ** 500, max_value=10 ** 500), st.integers(-5, 10 ** 7),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1.7e308, -1.7e308, 5e-324, -1e308, 0.0, 1e9 + 0.5]))
names = st.one_of(st.text(max_size=10), st.sampled_from(["$\\frac{$", "n1\x1b[2J", "a\nb", "\x00", "$x$", "n1"]))
values = st.one_of(st.none(), st.booleans(), numbers, names)


def _line(record: Dict[str, Any]) -> str:
    try:
        return json.dumps(record, allow_nan=True)
    except (ValueError, OverflowError):
        return "{"


T0 = 1_700_000_000.0
times = st.floats(min_value=T0, max_value=T0 + 3600)
steps = st.integers(0, 60)
attempt_ids = st.sampled_from(["1.0", "1.1", "1.0.1"])


def _mutated(base: st.SearchStrategy, fields: List[str]) -> st.SearchStrategy:
    """Plausible records, most with one or two fields replaced by adversarial values (or removed)."""
    overrides = st.dictionaries(st.sampled_from(fields), st.one_of(values, st.just(KeyError)), max_size=2)

    def apply(pair: Any) -> Dict[str, Any]:
        record, over = pair
        for key, value in over.items():
            if value is KeyError:
                record.pop(key, None)
            else:
                record[key] = value
        return record
    return st.tuples(base, overrides).map(apply)


_END_FIELDS = ["attempt_id", "time_s", "cause", "counted", "action", "node", "last_step", "first_step_t",
               "checkpoint_step", "last_step_t", "exit_code"]
ledger_records = st.one_of(
    _mutated(st.fixed_dictionaries({"event": st.just("start"), "attempt_id": attempt_ids, "time_s": times,
                                    "restart": st.integers(0, 3), "nodes": st.sampled_from(["n[1-2]", "$x$"]),
                                    "resume_step": st.one_of(st.none(), steps)}),
             ["attempt_id", "time_s", "restart", "nodes", "resume_step"]),
    _mutated(st.fixed_dictionaries({"event": st.just("end"), "attempt_id": attempt_ids, "time_s": times,
                                    "cause": st.sampled_from(["crash", "completed", "preempted", "hang"]),
                                    "counted": st.booleans(), "action": st.sampled_from(["restart", "requeue", "stop"]),
                                    "node": st.one_of(st.none(), names), "last_step": steps, "first_step_t": times,
                                    "checkpoint_step": st.one_of(st.none(), steps), "last_step_t": times}),
             _END_FIELDS),
    _mutated(st.fixed_dictionaries({"event": st.just("slowdown"), "attempt_id": attempt_ids, "time_s": times,
                                    "first_step": steps, "last_step": steps,
                                    "slowdown": st.dictionaries(names, numbers, max_size=3),
                                    "straggler": st.one_of(st.none(), names), "action": st.just("report")}),
             ["time_s", "slowdown", "straggler"]),
    _mutated(st.fixed_dictionaries({"event": st.just("preflight"), "attempt_id": attempt_ids, "time_s": times,
                                    "status": st.sampled_from(["passed", "failed", "error"]),
                                    "named": st.dictionaries(names, names, max_size=2)}),
             ["time_s", "status", "named"]),
)
step_records = st.one_of(
    _mutated(st.fixed_dictionaries({"kind": st.just("step"), "attempt_id": attempt_ids, "rank": st.integers(0, 3),
                                    "host": st.one_of(st.sampled_from(["n1", "n2"]), names), "step": steps,
                                    "time_s": times, "step_s": st.floats(0, 5), "loss": st.floats(0, 10),
                                    "tokens": st.integers(0, 1000), "collective_s": st.floats(0, 1)}),
             ["rank", "host", "step", "time_s", "step_s", "loss", "tokens", "collective_s", "data_wait_s"]),
    _mutated(st.fixed_dictionaries({"kind": st.just("checkpoint"), "attempt_id": attempt_ids, "step": steps,
                                    "time_s": times, "save_s": st.floats(0, 5), "requested": st.booleans()}),
             ["step", "time_s", "save_s", "requested"]),
)
hostile_lines = st.sampled_from(['{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", '{"time_s": 1' + "0" * 400 + "}",
                                 "{half", "null", '{"event": "start", "attempt_id": "1.0", "time_s": NaN}'])


def _write(root: Path, ledger_lines: List[str], step_lines: List[str]) -> Path:
    control = root / "control"
    (control / steplog.STEPS_DIR).mkdir(parents=True)
    (control / ledger.LEDGER_FILE).write_text("\n".join(ledger_lines) + "\n")
    (control / steplog.STEPS_DIR / "1.0.rank0.jsonl").write_text("\n".join(step_lines) + "\n")
    return control


@FUZZ
@given(st.lists(st.one_of(ledger_records.map(_line), hostile_lines), max_size=8),
       st.lists(st.one_of(step_records.map(_line), hostile_lines), max_size=10))
def test_report_and_goodput_never_raise_on_any_ledger_or_step_log(tmp_path_factory: Any, ledger_lines: list,
                                                                  step_lines: list) -> None:
    control = _write(tmp_path_factory.mktemp("fuzz"), ledger_lines, step_lines)
    report = jobreport.load(control)
    if report is None:
        return
    json.dumps(report.goodput.to_json(), allow_nan=False)
    text = jobreport.format_text(report)
    assert not any(ch in text for ch in "\x1b\x00\x07")
    assert all(value >= 0 for _, value in report.breakdown.parts())
    job_metrics.job_registry_from_ledger(ledger.read(control), {"slurm_job": "1", "node": "n1"})


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(ledger_records.map(_line), min_size=1, max_size=5), st.lists(step_records.map(_line), max_size=8))
def test_the_page_renders_whatever_the_records(tmp_path_factory: Any, ledger_lines: list, step_lines: list) -> None:
    pytest.importorskip("matplotlib")
    from slurmtools.report import html as report_html
    report = jobreport.load(_write(tmp_path_factory.mktemp("page"), ledger_lines, step_lines))
    if report is not None:
        assert report_html.plot_ids(report_html.render(report)) == list(report_html.PLOTS)


_VALID_DUMP = pickle.dumps({"entries": [{"state": "completed", "collective_seq_id": 3, "profiling_name": "gloo:x"}],
                            "pg_config": {"0": {"ranks": "[0, 1]"}}}, protocol=4)


@FUZZ
@given(st.one_of(st.binary(max_size=64),
                 st.tuples(st.integers(0, len(_VALID_DUMP) - 1), st.binary(min_size=1, max_size=6)).map(
                     lambda cut: _VALID_DUMP[:cut[0]] + cut[1] + _VALID_DUMP[cut[0] + len(cut[1]):])))
def test_a_flight_recorder_dump_of_any_bytes_is_evidence_or_nothing_in_bounded_memory(raw: bytes) -> None:
    tracemalloc.start()
    try:
        dump = fr_dump.parse_dump(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000
    assert dump is None or isinstance(dump.get("entries"), list)
