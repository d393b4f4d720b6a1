"""Bad input, each defect found by probing the tools as a hostile or careless user would: a
one-line error (exit 2) or a safe fallback, never a traceback, a hang, a drain of a healthy
node, a skipped check or lost data."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmtools.checkpoint.manager import MANIFEST, CheckpointManager
from slurmtools.common import ledger
from slurmtools.common.control_dir import HEARTBEAT_DIR
from slurmtools.common.fsutil import write_json_atomic
from slurmtools.common.schema import build
from slurmtools.errors import ConfigError, SpecError, UsageError
from slurmtools.health import config, gate, state
from slurmtools.health.fixture_data import xid_line
from slurmtools.health.model import Status
from slurmtools.job import sbatch
from slurmtools.requeue import supervisor, watchdog
from slurmtools.slurm import drain
from slurmtools.spec import RequeueSpec, spec_from_dict
from tests.unit.test_cli import cli, one_line_error

REPO = Path(__file__).resolve().parent.parent.parent


def node_settings(tmp_path: Path, **over: object) -> config.NodeSettings:
    data = {"gpu_probe": "fixture:h100-8gpu", "sysfs_root": str(tmp_path / "root"), "kernel_log": None,
            "state_dir": str(tmp_path / "state"), "syslog": False, "drain": False}
    data.update(over)
    return build(config.NodeSettings, data)


# ---- high: health config values ------------------------------------------------------------
def test_integer_xid_keys_stay_integers_and_still_drain(tmp_path: Path):
    health = config.parse_config("defaults:\n  checks: {gpu: {xid: {actions: {63: drain, 48: ignore}}}}\n", "h.yaml")
    actions = health.for_host("gpu001").checks.gpu.xid.actions
    assert actions == {63: "drain", 48: "ignore"} and all(type(code) is int for code in actions)
    log = tmp_path / "kmsg"
    log.write_text(xid_line(10, 63))
    data = {"checks": {"gpu": {"xid": {"actions": {63: "drain"}}}}, "kernel_log": str(log)}
    outcome = gate.run_phase(node_settings(tmp_path, **data), "prolog", "gpu001", job_id=None, allow_drain=False)
    assert {r.name: r.status for r in outcome.results}["gpu.xid"] is Status.CRITICAL


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_numbers_are_refused_in_configs(value: str):
    with pytest.raises(ConfigError, match="probe_timeout_s: must be a finite number"):
        config.parse_config(f"defaults:\n  probe_timeout_s: {value}\n", "h.yaml")


@pytest.mark.parametrize("text,message", [
    ("defaults:\n  probe_timeout_s: .nan\n", "must be a finite number"),
    ("defaults:\n  checks: {gpu: {xid: {actions: {x: drain}}}}\n", "key 'x' must be an integer"),
    ("defaults:\n  checks: {gpu: {xid: {actions: {79: fix}}}}\n",
     "XID 79: unknown action 'fix'; actions are drain, reboot, restart_app, ignore"),
])
def test_check_config_reports_what_the_prolog_would_hit(tmp_path: Path, text: str, message: str):
    path = tmp_path / "h.yaml"
    path.write_text(text)
    path.chmod(0o644)
    one_line_error(cli("health", "check-config", "--config", str(path), "--node", "gpu001"), 2, message)


def test_check_config_lists_the_checks_of_each_phase(tmp_path: Path):
    path = tmp_path / "h.yaml"
    path.write_text("defaults:\n  state_dir: " + str(tmp_path / "state") + "\n")
    path.chmod(0o644)
    out = cli("health", "check-config", "--config", str(path), "--node", "gpu001")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("gpu001 prolog: gpu.count, gpu.ecc, ") and "gpu.processes" in lines[0]
    assert lines[-1] == f"{path}: OK for gpu001"


# ---- medium: heartbeats -------------------------------------------------------------------
def beat(rank: int, step: int, time_s: float) -> str:
    return json.dumps({"rank": rank, "host": f"node{rank}", "step": step, "time": time_s})


def test_invalid_heartbeats_are_ignored_and_counted(tmp_path: Path):
    heartbeats = tmp_path / HEARTBEAT_DIR
    heartbeats.mkdir()
    now = 1_000_000.0
    (heartbeats / "0.json").write_text(beat(0, 5, now - 1))
    (heartbeats / "1.json").write_text("[]")
    (heartbeats / "2.json").write_text('"x"')
    (heartbeats / "3.json").write_text('{"rank": 3, "host": "h", "step": 1e400, "time": 1.0}')
    (heartbeats / "4.json").mkdir()
    os.mkfifo(heartbeats / "5.json")
    (heartbeats / "6.json").write_text('{"rank": 6, "host": "h", "step": 1, "time": NaN}')
    (heartbeats / "7.json").write_text(beat(7, 5, now + 10 * 365 * 86400))      # far in the future
    (heartbeats / "8.json").symlink_to("/dev/zero")
    beats, invalid = watchdog.scan_heartbeats(tmp_path, now)
    assert [b.rank for b in beats] == [0] and invalid == 8


def test_nan_time_is_no_false_hang_and_future_time_hides_no_hang(tmp_path: Path):
    heartbeats = tmp_path / HEARTBEAT_DIR
    heartbeats.mkdir()
    now = 1_000_000.0
    (heartbeats / "0.json").write_text('{"rank": 0, "host": "h", "step": 1, "time": NaN}')
    assert watchdog.judge(watchdog.scan_heartbeats(tmp_path, now)[0], now, 10) is None
    (heartbeats / "0.json").write_text(beat(0, 4, now - 60))
    (heartbeats / "1.json").write_text(beat(1, 5, now + 10 * 365 * 86400))
    stall = watchdog.judge(watchdog.scan_heartbeats(tmp_path, now)[0], now, 10)
    assert stall is not None and stall.rank is None and stall.idle_s == pytest.approx(60)


GO_FILE = "go"      # the child exits at once when the test writes it, else when its time is up
CHILD_WRITES_GARBAGE = """
import os, sys, time
hb = os.path.join(os.environ["SLURMTOOLS_CONTROL_DIR"], "heartbeat")
os.makedirs(hb, exist_ok=True)
open(os.path.join(hb, "0.json"), "w").write("[]")
os.mkdir(os.path.join(hb, "1.json"))
os.mkfifo(os.path.join(hb, "2.json"))
open(os.path.join(hb, "3.json"), "w").write('{"rank": 3, "step": 1e400, "time": 1}')
os.mkdir(os.path.join(os.environ["SLURMTOOLS_CONTROL_DIR"], "complete"))
print("child", os.getpid(), flush=True)
open(os.path.join(os.environ["SLURMTOOLS_CONTROL_DIR"], "child.pid"), "w").write(str(os.getpid()))
go, until = os.path.join(os.environ["SLURMTOOLS_CONTROL_DIR"], sys.argv[2]), time.time() + float(sys.argv[1])
while time.time() < until and not os.path.exists(go):
    time.sleep(0.05)
sys.exit(3)
"""


def run_supervisor(tmp_path: Path, sleep_s: float, capsys: pytest.CaptureFixture[str], **requeue: object):
    config_ = supervisor.SupervisorConfig(
        requeue=RequeueSpec(**{"hang_timeout_s": 0, **requeue}), control_dir=tmp_path / "control", poll_s=0.1)
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SLURM")}
    code = supervisor.run(config_, [sys.executable, "-c", CHILD_WRITES_GARBAGE, str(sleep_s), GO_FILE], environ)
    out = capsys.readouterr().out
    child_pid = int(next(line.split()[1] for line in out.splitlines() if line.startswith("child ")))
    return code, out, child_pid


def test_supervisor_survives_garbage_in_the_control_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch):
    emitted = supervisor.emit

    def emit_then_release_the_child(event: str, attempt_id: str, **fields: object) -> None:
        emitted(event, attempt_id, **fields)
        count = fields.get("count")
        if event == "invalid_heartbeats" and isinstance(count, int) and count >= 3:
            (tmp_path / "control" / GO_FILE).write_text("")

    # the child runs until the supervisor has reported the garbage (a loaded machine once starved
    # the watch loop through all of a fixed 2 s), at most 60 s
    monkeypatch.setattr(supervisor, "emit", emit_then_release_the_child)
    code, out, child = run_supervisor(tmp_path, 60.0, capsys, hang_timeout_s=30)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(e["slurmtools"] == "invalid_heartbeats" and e["count"] >= 3 for e in events)
    decision = next(e for e in events if e["slurmtools"] == "decision")
    # `complete` is a directory, not rank 0's marker: the exit 3 is a failure, not a completion
    assert decision["cause"] != "completed" and code == 1
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_supervisor_never_leaves_its_step_running(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch):
    pid_file = tmp_path / "control" / "child.pid"

    def broken(*args: object, **kwargs: object) -> object:
        for _ in range(300):           # once the child is surely running
            if pid_file.exists() and pid_file.read_text():
                raise RuntimeError("a bug of ours in the watch loop")
            time.sleep(0.1)
        raise AssertionError("the child never started")

    monkeypatch.setattr(watchdog, "scan_heartbeats", broken)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        run_supervisor(tmp_path, 60.0, capsys, hang_timeout_s=30)
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_control_dir_that_is_a_file_is_one_clear_error(tmp_path: Path):
    (tmp_path / "control").write_text("not a dir")
    config_ = supervisor.SupervisorConfig(requeue=RequeueSpec(), control_dir=tmp_path / "control")
    with pytest.raises(UsageError, match="control dir .*: exists and is not a directory"):
        supervisor.run(config_, ["true"], {})


def test_malformed_ledger_lines_are_skipped(tmp_path: Path):
    good = ledger.AttemptStart("7.0", 1.0)
    ledger.append(tmp_path, good)
    with open(tmp_path / ledger.LEDGER_FILE, "a") as handle:
        handle.write('[1, 2]\n{"event": "end", "attempt_id": "7.0", "time_s": "x", "cause": "crash"}\n'
                     '{"event": "end", "attempt_id": "7.0", "time_s": 2, "cause": "no-such-cause"}\n'
                     '{"event": "start", "attempt_id": 7, "time_s": 1}\n{"event": "end", "time_s": NaN}\n')
    assert ledger.read(tmp_path) == [good]
    assert ledger.read(tmp_path / "missing") == [] and ledger.read(tmp_path / ledger.LEDGER_FILE / "x") == []


# ---- medium: checkpoint manifests -----------------------------------------------------------
def saved(tmp_path: Path) -> CheckpointManager:
    manager = CheckpointManager(tmp_path / "ckpt")
    manager.save(4, lambda d: (d / "data.bin").write_bytes(b"four"))
    manager.save(8, lambda d: (d / "data.bin").write_bytes(b"eight"))
    return manager


def rewrite_manifest(manager: CheckpointManager, step: int, change) -> None:
    path = manager.final_dir(step) / MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("name,change", [
    ("parent", lambda m: m["files"].update({"../outside": {"size": 4, "sha256": "0" * 64}})),
    ("absolute", lambda m: m["files"].update({"/etc/hostname": {"size": 4, "sha256": "0" * 64}})),
    ("device", lambda m: m["files"].update({"zero": {"size": 4, "sha256": "0" * 64}})),
    ("fifo", lambda m: m["files"].update({"fifo": {"size": 0, "sha256": "0" * 64}})),
    ("files-not-a-dict", lambda m: m.update({"files": ["data.bin"]})),
    ("missing-digest", lambda m: m["files"]["data.bin"].pop("xxh3_128")),
    ("short-digest", lambda m: m["files"]["data.bin"].update({"xxh3_128": "0" * 31})),
    ("empty", lambda m: m.update({"files": {}})),
    ("other-step", lambda m: m.update({"step": 4})),
])
def test_malformed_manifests_fall_back_to_the_previous_checkpoint(tmp_path: Path, name: str, change):
    manager = saved(tmp_path)
    step8 = manager.final_dir(8)
    (step8 / "zero").symlink_to("/dev/zero")
    os.mkfifo(step8 / "fifo")
    (tmp_path / "outside").write_bytes(b"evil")
    rewrite_manifest(manager, 8, change)
    latest = manager.latest()
    assert latest is not None and latest.step == 4


def test_save_rewrites_a_step_it_did_not_seal(tmp_path: Path):
    """An empty manifest in step_N used to "verify", and save(N) then skipped writing: data loss."""
    manager = CheckpointManager(tmp_path / "ckpt")
    planted = manager.final_dir(8)
    planted.mkdir(parents=True)
    (planted / MANIFEST).write_text(json.dumps({"format": 1, "step": 8, "files": {}}))
    manager.save(8, lambda d: (d / "data.bin").write_bytes(b"eight"))
    assert (manager.final_dir(8) / "data.bin").read_bytes() == b"eight"
    assert manager.latest() is not None and manager.latest().step == 8


# ---- medium: prolog state ------------------------------------------------------------------
def test_state_dir_another_user_can_write_is_refused(tmp_path: Path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(0o777)
    with pytest.raises(ConfigError, match="refused: .* group/world writable"):
        gate.run_phase(node_settings(tmp_path), "prolog", "gpu001", job_id=None, allow_drain=False)
    state_dir.chmod(0o755)
    os.chown(state_dir, 65534, 65534)
    with pytest.raises(ConfigError, match="not root-owned"):
        gate.check_settings(node_settings(tmp_path))


def test_temp_file_symlink_is_never_followed(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "state.json"
    (tmp_path / f".state.json.{os.getpid()}.tmp").symlink_to(victim)
    write_json_atomic(target, {"a": 1})
    assert victim.read_text() == "precious" and json.loads(target.read_text()) == {"a": 1}


@pytest.mark.parametrize("content", ['{"kmsg_seq": "x"}', '{"ib_counters": []}', '{"jobs": {"1": 5}}',
                                     '{"last_clean_t": NaN}', "[]", "{", '{"clean_runs": -4}'])
def test_type_corrupted_state_is_treated_as_absent_and_reported(tmp_path: Path, content: str):
    path = tmp_path / "state" / "gpu001" / "state.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    log = tmp_path / "kmsg"
    log.write_text(xid_line(10, 79))
    outcome = gate.run_phase(node_settings(tmp_path, kernel_log=str(log)), "prolog", "gpu001", job_id=None,
                             allow_drain=False)
    found = {r.name: r for r in outcome.results}
    assert found["gpu.xid"].status is Status.CRITICAL            # gating still works
    assert found["slurmtools.state"].status is Status.WARN and "discarded" in found["slurmtools.state"].summary


def test_a_watermark_past_the_kernel_log_means_the_log_restarted(tmp_path: Path):
    """After a reboot /dev/kmsg numbers from 0 again: an old, higher watermark must not hide an XID."""
    path = tmp_path / "state" / "gpu001" / "state.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kmsg_seq": 10 ** 12}))
    log = tmp_path / "kmsg"
    log.write_text(xid_line(10, 79))
    outcome = gate.run_phase(node_settings(tmp_path, kernel_log=str(log)), "prolog", "gpu001", job_id=None,
                             allow_drain=False)
    assert {r.name: r.status for r in outcome.results}["gpu.xid"] is Status.CRITICAL
    assert state.load(path)[0].kmsg_seq == 10


# ---- medium: YAML -------------------------------------------------------------------------
BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"] + [
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]) + "\n"


@pytest.mark.parametrize("text,message", [
    ("name: x\nnodes:\ncommand: [t.py]\n", "nodes: needs a value (an integer)"),
    ("name: !foo x\n", "unsupported YAML tag '!foo'"),
    ("name: !!python/object:os.system x\n", "unsupported YAML tag"),
    ("name: x\nenv: !!set {a, b}\n", "unsupported YAML tag 'tag:yaml.org,2002:set'"),
    ("? [a, b]\n: x\n", "keys must be plain scalars"),
    ("name: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 32 levels deep"),
    (BOMB, "more than 20000 values"),
    ("name: x\n" + "# padding\n" * 200000, "larger than 1024 KiB"),
])
def test_bad_yaml_is_one_line_exit_2(tmp_path: Path, text: str, message: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    one_line_error(cli("render", str(path)), 2, message)


def test_bad_yaml_in_the_health_config_fails_the_prolog_open(tmp_path: Path):
    path = tmp_path / "h.yaml"
    path.write_text(BOMB)
    path.chmod(0o644)
    one_line_error(cli("health", "run", "--phase", "prolog", "--config", str(path), "--node", "gpu001"), 2,
                   "more than 20000 values")


def test_shim_time_limit_ends_a_hung_run_and_fails_open(tmp_path: Path):
    """The shims bound the whole run with timeout(1); here with the limit cut to 1 s and a
    slurmtools that hangs."""
    shim_dir = tmp_path / "prolog.d"
    shim_dir.mkdir()
    text = (REPO / "prolog.d" / "50-slurmtools-health").read_text()
    assert "timeout -k 2 60 " in text
    (shim_dir / "shim").write_text(text.replace("timeout -k 2 60 ", "timeout -k 1 1 "))
    fake = tmp_path / ".venv" / "bin" / "slurmtools"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(shim_dir / "shim")], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and "exited 124 (our failure); failing open" in proc.stderr


def test_a_newline_in_the_spec_path_stays_in_its_comment():
    spec = spec_from_dict({"name": "x", "command": ["t.py"]})
    text = sbatch.render(spec, source="job.yaml\n#SBATCH --wrap=x\ntouch PWNED\n.yaml")
    assert [line for line in text.splitlines() if "PWNED" in line or "--wrap" in line] == [
        "# Generated by slurmtools 0.1.0 from job.yaml?#SBATCH --wrap=x?touch PWNED?.yaml. Edit the spec, not this file."]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


# ---- low ---------------------------------------------------------------------------------
@pytest.mark.parametrize("data,message", [
    ({"env": {"SLURM_JOB_ID": "1+$(id)"}}, "env: SLURM_JOB_ID is set by Slurm or slurmtools"),
    ({"env": {"MASTER_PORT": "1"}}, "env: MASTER_PORT is set by Slurm or slurmtools"),
    ({"env": {"IFS": "x"}}, "env: IFS is set by Slurm or slurmtools"),
    ({"mem_gb": 0.0001}, "mem_gb: must be 0 (all of the node's memory) or at least 0.1 GB"),
    ({"mem_gb": float("nan")}, "mem_gb: must be a finite number"),
    ({"mem_gb": 1e9}, "mem_gb: must be <= 1000000.0"),
    ({"exclude": "n[1-999999999]"}, "exclude: hostlist 'n[1-999999999]' names more than 100000 nodes"),
    ({"exclude": "@rack1"}, "exclude: not a Slurm hostlist '@rack1'"),
    ({"nodelist": "n[1-4]!n2"}, "nodelist: not a Slurm hostlist"),
    ({"command": ["--fake.py"]}, "command: must start with the program, not an option"),
    ({"command": ["-x"], "launcher": "srun"}, "command: must start with the program, not an option"),
])
def test_spec_values_that_mean_nothing_or_harm_are_refused(data: dict, message: str):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"name": "x", "command": ["t.py"], **data})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_drain_reason_keeps_prefix_and_check_and_sanitizes_the_job():
    reason = drain.DrainReason("CRITICAL", "gpu.ecc", "gpu=3 " + "x" * 500, "12;rm -rf /\n" + "9" * 300).render()
    assert reason.startswith("slurmtools: CRITICAL gpu.ecc gpu=3 ") and len(reason) <= drain.MAX_REASON_CHARS
    assert drain.is_ours(reason) and drain.parse_reason(reason)["check"] == "gpu.ecc"
    assert reason.isprintable() and ";" not in reason and " /" not in reason.split("job=")[1]


def test_config_in_a_world_writable_directory_is_refused(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    path = shared / "h.yaml"
    path.write_text("defaults: {}\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="group/world writable \\(its directory"):
        config.load_config(str(path))
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    with pytest.raises(ConfigError, match="its directory"):
        config.load_config(str(link))


@pytest.mark.parametrize("args,message", [
    (["status", "²"], "not a job id: '²'"),
    (["status", "٣"], "not a job id: '٣'"),
    (["cancel", "12345678901234567890"], "not a job id"),
    (["plan", "--checkpoint-cost-s", "nan", "--nodes", "8", "--node-mtbf-h", "100"], "must be a finite number"),
    (["plan", "--checkpoint-cost-s", "inf", "--nodes", "8", "--node-mtbf-h", "100"], "must be a finite number"),
    (["plan", "--checkpoint-cost-s", "30", "--nodes", "1" + "0" * 400, "--node-mtbf-h", "100"], "too long"),
    (["health", "run", "--phase", "prolog", "--node", "a[1-"], "not a node name: 'a[1-'"),
    (["health", "run", "--phase", "prolog", "--node", "../../x"], "not a node name: '../../x'"),
    (["run", "--backoff-s", "nan", "--", "true"], "backoff_s: must be a finite number"),
])
def test_cli_arguments_are_validated(args: list, message: str):
    one_line_error(cli(*args), 2, message)


def test_goodput_json_is_always_valid_json(tmp_path: Path):
    ledger.append(tmp_path, ledger.AttemptStart("1.0", 100.0))
    ledger.append(tmp_path, ledger.AttemptEnd("1.0", 100.0, cause="crash", counted=True, last_step=3,
                                              first_step_t=100.0, checkpoint_step=0))
    out = cli("goodput", str(tmp_path), "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)      # strict: NaN/Infinity would not parse as standard JSON
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in data.values())
