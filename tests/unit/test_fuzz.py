"""Property-based fuzzing of everything the tools read (derandomized, so a run is reproducible;
about half a minute in all on 2 cores). Properties: specs and CLI give a value or one clean
line (exit 2), never a traceback; health configs give settings or a ConfigError (the prolog
fails open); a healthy node never drains whatever state file it finds; checkpoints fall back;
heartbeats and ledgers never crash their readers."""
from __future__ import annotations

import contextlib
import io
import json
import math
import string
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtools import cli
from slurmtools.checkpoint.manager import MANIFEST, CheckpointManager
from slurmtools.common import ledger
from slurmtools.common.control_dir import HEARTBEAT_DIR
from slurmtools.common.schema import build, load_yaml_with_lines
from slurmtools.errors import SpecError
from slurmtools.health import config, gate
from slurmtools.health.model import Status
from slurmtools.job import sbatch
from slurmtools.requeue import goodput, watchdog
from slurmtools.spec import JobSpec, spec_from_dict

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SPEC_KEYS = ["name", "command", "nodes", "gpus_per_node", "processes_per_node", "launcher", "python", "mem_gb",
             "time_limit_min", "exclude", "nodelist", "env", "network", "requeue", "distributed", "output_dir"]
CONFIG_KEYS = ["defaults", "hosts", "match", "gpu_probe", "probe_timeout_s", "deadline_s", "checks", "gpu", "xid",
               "actions", "ib", "ports", "state_dir", "phases", "enabled", "expected"]
YAML_NOISE = "&*!%@`|>{}[],:#-?'\"\n\t .\\"

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10 ** 20, max_value=10 ** 20),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))


def documents(keys: list) -> st.SearchStrategy[Any]:
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(key, inner, max_size=5),
                        max_leaves=25)


def texts(keys: list) -> st.SearchStrategy[str]:
    """YAML documents, documents with noise spliced in, and plain noise."""
    dumped = documents(keys).map(lambda doc: yaml.safe_dump(doc, allow_unicode=True))
    noisy = st.tuples(dumped, st.text(alphabet=YAML_NOISE + string.ascii_letters, max_size=15),
                      st.integers(min_value=0, max_value=400)).map(lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:])
    return st.one_of(dumped, noisy, st.text(max_size=200))


def one_line(exc: Exception) -> None:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text


@FUZZ
@given(texts(SPEC_KEYS))
def test_spec_text_gives_a_spec_or_one_line(text: str) -> None:
    try:
        data, lines = load_yaml_with_lines(text, "job.yaml")
        spec = spec_from_dict(data, file="job.yaml", lines=lines)
    except SpecError as exc:
        one_line(exc)
        return
    assert isinstance(spec, JobSpec)
    try:
        script = sbatch.render(spec)
    except SpecError as exc:
        one_line(exc)
        return
    assert script.startswith("#!/bin/bash\n")


@FUZZ
@given(texts(CONFIG_KEYS))
def test_health_config_text_gives_settings_or_a_config_error(text: str) -> None:
    try:
        health = config.parse_config(text, "h.yaml")
        node = health.for_host("gpu001")
    except SpecError as exc:       # ConfigError is one: exit 2, and the shim fails open
        one_line(exc)
        return
    assert isinstance(node, config.NodeSettings)
    for value in (node.probe_timeout_s, node.deadline_s, node.cache_minutes):
        assert math.isfinite(value)
    assert all(type(code) is int for code in node.checks.gpu.xid.actions)


state_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["ib_counters", "nvlink_counters", "kmsg_seq", "last_clean_t", "clean_runs", "jobs", "t",
                     "mlx5_0/1", "link_downed", "0/1", "42"]), inner, max_size=6), max_leaves=20)


@FUZZ
@given(st.one_of(state_values.map(lambda v: json.dumps(v, allow_nan=True)), st.text(max_size=80)))
def test_a_healthy_node_never_drains_whatever_state_it_finds(tmp_path_factory: Any, content: str) -> None:
    root = tmp_path_factory.mktemp("state")
    path = root / "state" / "gpu001" / "state.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    node = build(config.NodeSettings, {"gpu_probe": "fixture:h100-8gpu", "sysfs_root": str(root / "sys"),
                                       "kernel_log": None, "state_dir": str(root / "state"), "syslog": False,
                                       "drain": False})
    outcome = gate.run_guarded(node, "prolog", "gpu001", job_id="5")
    assert outcome is not None and outcome.status is not Status.CRITICAL
    assert gate.run_guarded(node, "epilog", "gpu001", job_id="5").status is not Status.CRITICAL


manifest_entries = st.dictionaries(
    st.one_of(st.sampled_from(["data.bin", "../outside", "/etc/hostname", "zero", "fifo", "", ".", "a/../b"]),
              st.text(max_size=10)),
    st.one_of(scalars, st.fixed_dictionaries({"size": scalars, "sha256": st.one_of(scalars, st.just("0" * 64))})),
    max_size=4)


@FUZZ
@given(st.one_of(st.fixed_dictionaries({"format": scalars, "step": st.one_of(scalars, st.just(8)),
                                        "files": st.one_of(scalars, manifest_entries)}), state_values))
def test_any_manifest_falls_back_to_the_good_checkpoint(tmp_path_factory: Any, manifest: Any) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    manager = CheckpointManager(root / "ckpt")
    manager.save(4, lambda d: (d / "data.bin").write_bytes(b"four"))
    bad = manager.final_dir(8)
    bad.mkdir()
    (bad / "data.bin").write_bytes(b"eight")
    (bad / "zero").symlink_to("/dev/zero")
    (bad / MANIFEST).write_text(json.dumps(manifest, allow_nan=True))
    latest = manager.latest()
    assert latest is not None and latest.step == 4


@FUZZ
@given(st.lists(st.one_of(state_values.map(lambda v: json.dumps(v, allow_nan=True)), st.text(max_size=40)),
                max_size=5))
def test_heartbeat_garbage_never_crashes_the_watchdog(tmp_path_factory: Any, contents: list) -> None:
    root = tmp_path_factory.mktemp("hb")
    (root / HEARTBEAT_DIR).mkdir()
    for rank, content in enumerate(contents):
        (root / HEARTBEAT_DIR / f"{rank}.json").write_text(content)
    beats, invalid = watchdog.scan_heartbeats(root, 1_000_000.0)
    assert len(beats) + invalid == len(contents)
    watchdog.judge(beats, 1_000_000.0, 10)


ledger_records = st.fixed_dictionaries({"event": st.sampled_from(["start", "end", "x"]),
                                        "attempt_id": st.one_of(st.just("1.0"), scalars)},
                                       optional={"time_s": scalars, "cause": st.sampled_from(["crash", "completed", "x"]),
                                                 "counted": scalars, "last_step": scalars, "first_step_t": scalars,
                                                 "checkpoint_step": scalars, "resume_step": scalars})


@FUZZ
@given(st.lists(st.one_of(ledger_records.map(lambda r: json.dumps(r, allow_nan=True)), st.text(max_size=30)),
                max_size=8))
def test_ledger_garbage_never_crashes_goodput(tmp_path_factory: Any, lines: list) -> None:
    root = tmp_path_factory.mktemp("ledger")
    (root / ledger.LEDGER_FILE).write_text("\n".join(lines) + "\n")
    events = ledger.read(root)
    result = goodput.goodput(events)
    json.dumps(result.to_json(), allow_nan=False)
    goodput.format_goodput(result)
    ledger.history(events)


arguments = st.one_of(st.text(max_size=12), st.sampled_from(["nan", "inf", "-1", "1e400", "0", "²", "٣", "--", "-x"]),
                      st.integers(min_value=-10 ** 30, max_value=10 ** 30).map(str))
command_lines = st.one_of(
    st.tuples(st.just("render"), arguments).map(list),
    st.tuples(st.just("status"), arguments.filter(lambda a: not (a.isascii() and a.isdigit()))).map(list),
    st.lists(st.sampled_from(["--checkpoint-cost-s", "--nodes", "--node-mtbf-h", "--restart-cost-s", "--simulate",
                                  "--spare-nodes", "--work-days", "--trials", "--person-h"]) | arguments,
             max_size=8).map(lambda rest: ["plan", *rest]),
    st.tuples(st.just("goodput"), arguments, st.sampled_from(["--json", "--spec", "x"])).map(list),
    st.lists(st.sampled_from(["--phase", "prolog", "--node", "--config", "--json"]) | arguments, max_size=6).map(
        lambda rest: ["health", "check-config", *rest]),
    st.lists(arguments, max_size=4),
)


@FUZZ
@given(command_lines)
def test_cli_arguments_give_a_result_or_one_line(argv: list) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as exc:          # --help / --version print and exit 0
            code = int(exc.code or 0)
    lines = err.getvalue().strip().splitlines()
    assert isinstance(code, int)
    if not argv:                           # bare `slurmtools`: its help on stdout, exit 2
        assert code == 2 and lines == []
    elif code != 0:
        assert len(lines) == 1 and lines[0].startswith("slurmtools: error: "), (argv, err.getvalue())
        assert code in (1, 2)

