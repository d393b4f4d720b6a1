"""Property-based fuzzing of the readers issue 51 added or hardened (derandomized, as
tests/unit/test_fuzz.py): a value or the one error their callers turn into a line, never
anything else, and within bounds. Properties: a hostlist's size is counted exactly (as
ClusterShell expands it) or said unreadable, whatever the text; a rank's snapshot settings are
numbers in range or a UsageError; a blame payload is a Blame with one spelling of its job or a
refusal with why; a peer's JSON bytes are a value or a CheckpointError; a progress line is matched
within its bound; the node sweep age (SLURMTOOLS_NODE_SWEEP_AFTER_S) is seconds above 0 or one
UsageError."""
from __future__ import annotations

import json
import string
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtools.blame import model
from slurmtools.errors import CheckpointError, UsageError
from slurmtools.requeue import progress
from slurmtools.slurm.parse import hostlist_size
from slurmtools.snapshot.rules import settings_from_env

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
HOSTLIST_CHARS = string.ascii_lowercase[:4] + string.digits + "[],-"


@FUZZ
@given(st.text(alphabet=HOSTLIST_CHARS, max_size=24))
def test_a_hostlist_is_counted_as_clustershell_expands_it_or_said_unreadable(text):
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    size = hostlist_size(text)
    if size is None or size > 10_000:
        return                                 # unreadable, or past what this test expands
    try:
        expanded = list(NodeSet(text)) if text else []
    except NodeSetParseError:
        return                                 # we counted it; root's expansion refuses it then
    assert len(expanded) <= size               # never an undercount (duplicates fold in ClusterShell)


@FUZZ
@given(st.dictionaries(st.sampled_from(["E", "M", "O"]), st.text(max_size=12)))
def test_snapshot_settings_are_numbers_in_range_or_one_usage_error(raw):
    environ = {{"E": "EVERY", "M": "MEM", "O": "OVER"}[key]: value for key, value in raw.items()}
    try:
        every, memory_gb, overhead_pct = settings_from_env(environ, "EVERY", "MEM", "OVER")
    except UsageError as exc:
        assert str(exc).count("\n") == 0 and str(exc).split("=")[0] in ("EVERY", "MEM", "OVER")
        return
    assert 0 <= every <= 10 ** 9 and 0.001 <= memory_gb <= 100000 and 0 <= overhead_pct <= 100


@FUZZ
@given(st.dictionaries(st.sampled_from(["cluster", "job", "node", "check", "evidence", "time_s", "x"]),
                       st.one_of(st.text(max_size=16), st.integers(), st.floats(), st.none())))
def test_a_blame_payload_is_a_blame_with_one_spelling_of_its_job_or_a_refusal(fields):
    blame, problem = model.parse_payload(json.dumps(fields, default=str))
    if blame is None:
        assert problem and "\n" not in problem
        return
    assert blame.job == str(int(blame.job)) and problem == ""


@FUZZ
@given(st.binary(max_size=64))
def test_a_peers_json_bytes_are_a_value_or_a_checkpoint_error(raw):
    from slurmtools.snapshot.wire import _parsed
    try:
        _parsed(raw)
    except CheckpointError as exc:
        assert "\n" not in str(exc).strip()


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([r"^(a+)+$", r"(x+x+)+y", r".*step=(\d+)", r"step (\d+)"]),
       st.text(alphabet="ax!y step=0123456789", max_size=5000))
def test_a_progress_line_is_matched_within_its_bound(pattern, line):
    log = progress.LogProgress(pattern)
    start = time.monotonic()
    log.feed(line)
    assert time.monotonic() - start < 1.0


@FUZZ
@given(st.one_of(st.text(max_size=12), st.floats(allow_nan=True).map(str), st.integers().map(str)))
def test_the_node_sweep_age_is_seconds_above_0_or_one_usage_error(raw):
    from slurmtools.train.node_sweep import SWEEP_AFTER_ENV, stale_after_s
    try:
        value = stale_after_s({SWEEP_AFTER_ENV: raw}, 600.0)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{SWEEP_AFTER_ENV}=")
        return
    assert value == 600.0 if not raw.strip() else 0 < value < float("inf")
