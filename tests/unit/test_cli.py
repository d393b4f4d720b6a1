"""The CLI: every bad input is one line on stderr with exit code 2, never a traceback."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def cli(*args: str, cwd: Path = REPO, env_extra=None) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "slurmtools", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=60)


def one_line_error(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("slurmtools: error: ") and text in lines[0], lines[0]


def test_version_and_render_golden():
    assert cli("--version").stdout.strip() == "slurmtools 0.1.0"
    out = cli("render", "--portable", "tests/unit/specs/minimal.yaml")
    assert out.returncode == 0 and out.stdout == (HERE / "golden" / "minimal.sbatch").read_text()


@pytest.mark.parametrize("args,code,text", [
    (["render", "nope.yaml"], 2, "nope.yaml: no such file"),
    (["submit", "nope.yaml"], 2, "nope.yaml: no such file"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["status", "12x"], 2, "not a job id: '12x'"),
    (["plan", "--checkpoint-cost-s", "-1", "--nodes", "8", "--node-mtbf-h", "10"], 2, "must be >= 0, got -1"),
    (["plan", "--checkpoint-cost-s", "0", "--nodes", "8", "--node-mtbf-h", "10"], 2, "checkpoint cost must be > 0 and <= 604800 s, got 0"),
    (["plan", "--checkpoint-cost-s", "5", "--nodes", "100000", "--node-mtbf-h", "1", "--simulate"], 2,
     "--simulate: about 2.88e+10 failures to simulate (2 simulations x nodes x days"),
    (["plan", "--checkpoint-cost-s", "5", "--nodes", "8", "--node-mtbf-h", "10", "--simulate", "--trials", "0"], 2,
     "--trials must be 1 to 100000"),
    (["run"], 2, "run: no command given"),
    (["minicluster", "kill", "node99"], 2, "unknown node 'node99'"),
    (["minicluster", "up", "--nodes", "0"], 2, "nodes must be between 1 and 240"),
    (["nodes", "drain", "node1", "--reason", " "], 2, "--reason must be one line of text"),
    (["health", "run", "--phase", "later"], 2, "slurmtools: error: health run: argument --phase: invalid choice: 'later'"),
    (["nodes", "drain"], 2, "slurmtools: error: nodes drain: the following arguments are required: node, --reason"),
    (["sumbit", "job.yaml"], 2, "slurmtools: error: argument COMMAND: invalid choice: 'sumbit'"),
    (["sumbit", "job.yaml"], 2, "; did you mean 'submit'?"),
    (["health", "rnu"], 2, "health: argument health_action: invalid choice: 'rnu'"),
    (["health", "rnu"], 2, "did you mean 'run'?"),
])
def test_bad_input_is_one_line_exit_2(args, code, text):
    one_line_error(cli(*args), code, text)


def test_spec_errors_name_file_line_and_key(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\ncommand: [t.py]\nrequeue:\n  hang_timout_s: 5\n")
    one_line_error(cli("render", str(bad)), 2,
                   f"{bad}:4: requeue.hang_timout_s: unknown key; did you mean 'hang_timeout_s'?")


def test_health_config_error_exits_2_and_never_tracebacks(tmp_path):
    cfg = tmp_path / "health.yaml"
    cfg.write_text("defaults:\n  checks: {gpu: {ecc: {corected_warn: 1}}}\n")
    cfg.chmod(0o644)
    proc = cli("health", "run", "--phase", "prolog", "--config", str(cfg), "--no-drain")
    one_line_error(proc, 2, "defaults.checks.gpu.ecc.corected_warn: unknown key; did you mean 'corrected_warn'?")
    assert cli("health", "check-config", "--config", str(cfg)).returncode == 2


def test_health_run_reports_json_and_exit_3_on_critical(tmp_path):
    cfg = tmp_path / "health.yaml"
    cfg.write_text(f'defaults:\n  gpu_probe: "fixture:h100-8gpu-ecc-uncorrected"\n  kernel_log: null\n'
                   f"  state_dir: {tmp_path}/state\n  syslog: false\n  drain: false\n")
    cfg.chmod(0o644)
    proc = cli("health", "run", "--phase", "prolog", "--config", str(cfg), "--node", "gpu001", "--json")
    assert proc.returncode == 3, proc.stderr
    import json
    report = json.loads(proc.stdout)
    assert report["status"] == "CRITICAL" and report["host"] == "gpu001"
    assert [r["check"] for r in report["results"] if r["status"] == "CRITICAL"] == ["gpu.ecc"]


def test_goodput_of_a_missing_ledger(tmp_path):
    one_line_error(cli("goodput", str(tmp_path)), 2, "no ledger records at")


def test_shim_fails_open_when_slurmtools_itself_fails(tmp_path):
    """Exit codes other than 3 (a bad config, a crash) must not fail the prolog."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("defaults: {nonsense: 1}\n")
    cfg.chmod(0o644)
    proc = subprocess.run(["bash", str(REPO / "prolog.d" / "50-slurmtools-health")], capture_output=True, text=True,
                          env={"SLURMTOOLS_HEALTH_CONFIG": str(cfg)}, timeout=60)
    assert proc.returncode == 0
    assert "failing open" in proc.stderr


def test_goodput_by_job_id_needs_the_spec(tmp_path):
    one_line_error(cli("goodput", "123"), 2, "give the job's spec (--spec JOB.yaml)")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\ncommand: [t.py]\ncheckpoint_dir: {tmp_path}/ck\n")
    ctl = tmp_path / "ck" / ".slurmtools" / "123"
    ctl.mkdir(parents=True)
    (ctl / "ledger.jsonl").write_text('{"event": "start", "attempt_id": "123.0", "time_s": 0}\n'
                                      '{"event": "end", "attempt_id": "123.0", "time_s": 10, "cause": "completed", '
                                      '"last_step": 5, "checkpoint_step": 5, "first_step_t": 6}\n')
    out = cli("goodput", "123", "--spec", str(spec))
    assert out.returncode == 0 and "final step: 5" in out.stdout and "effective training time ratio: 50.0%" in out.stdout  # 5 steps x 1 s of 10 s


def test_minicluster_refuses_a_non_root_user():
    import os
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to become an unprivileged user")
    proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-m",
                           "slurmtools", "minicluster", "up"], capture_output=True, text=True, cwd="/", timeout=60)
    one_line_error(proc, 1, "the mini-cluster needs root")


def test_plan_simulates_the_seeds_cluster_with_the_real_policy():
    """8 nodes (64 GPUs), one node failure per 14 days for the cluster, a spare, async checkpoints."""
    out = cli("plan", "--checkpoint-cost-s", "5", "--nodes", "8", "--node-mtbf-h", str(14 * 24 * 8), "--simulate",
              "--spare-nodes", "1", "--trials", "50")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "job MTBF: 336.00 h"
    assert lines[-3].startswith("8 nodes, 8.92857 failures per 1,000 node-days, 1 spare(s), 30 days of training, "
                                "checkpoint every 57.9 min (5 s blocking), restart 7.2 s, requeue 60 s (50 runs):")
    assert lines[-2].startswith("  ETTR 99.") and "finished without a person 100%" in lines[-2]
    # the same runs with GPU faults not named to their node: the restart lands on the faulty node again
    assert lines[-1].startswith("  GPU faults (47.3% of failures, Llama 3's figure) named to their node: ETTR 99.")


def _every_parser(parser: argparse.ArgumentParser, path: Tuple[str, ...] = ()) -> List[Tuple[str, ...]]:
    """The command path of the parser and of every subcommand under it."""
    found = [path]
    for action in parser._actions:                       # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _every_parser(child, path + (name,))
    return found


def test_every_subcommands_help_is_formatted_without_error():
    """`slurmtools run --help` once ended in a traceback: a field doc with "5% of" reached argparse's
    %-formatting. Each subcommand's help is formatted here, and one is run as a user would."""
    from slurmtools import cli as cli_module
    paths = _every_parser(cli_module.build_parser())
    assert ("run",) in paths and ("health", "run") in paths and len(paths) > 20
    for path in paths:
        parser = cli_module.build_parser()
        for name in path:
            parser = next(action for action in parser._actions
                          if isinstance(action, argparse._SubParsersAction)).choices[name]
        # the command's own words first, as a person types them (not the top level's usage)
        assert parser.format_help().startswith(" ".join(["usage: slurmtools", *path, "[-h]"])), path
    proc = cli("run", "--help")
    assert proc.returncode == 0 and "5% of a step" in " ".join(proc.stdout.split()) and proc.stderr == ""


def test_bare_slurmtools_prints_what_it_can_do():
    proc = cli()
    assert proc.returncode == 2 and proc.stdout.startswith("usage: slurmtools") and proc.stderr == ""
    assert "submit" in proc.stdout and "health" in proc.stdout


def test_an_empty_spec_says_it_is_empty(tmp_path):
    (tmp_path / "job.yaml").write_text("# nothing yet\n")
    one_line_error(cli("render", str(tmp_path / "job.yaml")), 2, "job.yaml: is empty: a job spec needs at least name and command")


def test_every_flag_and_positional_says_what_it_is_and_flags_show_their_defaults():
    from slurmtools import cli as cli_module
    parser = cli_module.build_parser()
    unexplained = []
    for path in _every_parser(parser):
        sub = parser
        for name in path:
            sub = next(action for action in sub._actions if isinstance(action, argparse._SubParsersAction)).choices[name]
        unexplained += [(path, action.dest) for action in sub._actions
                        if not action.help and not isinstance(action, argparse._SubParsersAction)]
    assert unexplained == []
    text = " ".join(cli("run", "--help").stdout.split())
    assert "(default: 10)" in text and "--max-restarts" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_an_error_of_a_command_asked_for_json_is_json_on_stdout_too():
    proc = cli("status", "12x", "--json")
    one_line_error(proc, 2, "not a job id: '12x'")
    assert json.loads(proc.stdout) == {"error": "not a job id: '12x'", "exit_code": 2}


def test_every_exit_code_comes_from_the_one_table():
    """3 once meant CRITICAL to `health run` and "could not run" to `preflight`: one table now."""
    from slurmtools import errors
    from slurmtools.health import gate
    from slurmtools.health.model import Status
    assert [(code.name, int(code)) for code in errors.Exit] == [
        ("OK", 0), ("FAILED", 1), ("USAGE", 2), ("NODE_BAD", 3), ("INTERRUPTED", 130)]
    assert errors.SlurmToolsError.exit_code == errors.Exit.FAILED == errors.SlurmCommandError("x", 1, "").exit_code
    assert errors.SpecError("x").exit_code == errors.ConfigError("x").exit_code == errors.Exit.USAGE
    outcome = gate.Outcome([], Status.CRITICAL, None, False, 0.0, {})
    assert outcome.exit_code == errors.Exit.NODE_BAD
    page = (REPO / "docs" / "environment.md").read_text()       # generated from errors.Exit
    for code in errors.Exit:
        assert f"| {int(code)} | `{code.name}` |" in page


def test_the_top_help_groups_every_command_once_and_its_examples_parse():
    import shlex
    from slurmtools import cli as cli_module
    parser = cli_module.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    grouped = [name for _, names in cli_module.COMMAND_GROUPS for name in names]
    assert sorted(grouped) == sorted(commands) and len(grouped) == len(set(grouped))
    text = cli().stdout
    assert text.startswith("usage: slurmtools [-h] [--version] COMMAND ...") and "the job's author:" in text
    examples = [line.split("#")[0].split(">")[0] for line in cli_module.EXAMPLES.splitlines()[1:] if line.startswith("  ")]
    assert len(examples) == 5
    for example in examples:
        argv = shlex.split(example.replace("sudo ", ""))[1:]
        assert argv[0] in commands
        cli_module.build_parser().parse_args(argv)     # a bad example raises UsageError here


def test_check_config_as_json_names_each_phases_checks():
    proc = cli("health", "check-config", "--json", env_extra={"SLURMTOOLS_HEALTH_CONFIG": "/nonexistent/health.yaml"})
    if proc.returncode == 2:          # a named config that does not exist is bad input, said as JSON too
        assert json.loads(proc.stdout)["exit_code"] == 2
        proc = cli("health", "check-config", "--json")
    got = json.loads(proc.stdout)
    assert proc.returncode == 0 and got["ok"] is True and got["config"] is None
    (host, phases), = got["checks"].items()
    assert set(phases) == {"prolog", "epilog", "periodic", "active"} and "gpu.ecc" in phases["prolog"]


def test_plan_as_json_holds_the_plan_and_both_simulations():
    base = ["plan", "--checkpoint-cost-s", "30", "--nodes", "8", "--node-mtbf-h", "5000", "--json"]
    alone = json.loads(cli(*base).stdout)
    assert alone["simulation"] is None and alone["plan"]["daly_interval_s"] > alone["plan"]["checkpoint_cost_s"]
    both = json.loads(cli(*base, "--simulate", "--trials", "2", "--work-days", "1").stdout)
    assert both["plan"] == alone["plan"]
    assert {both["simulation"][kind]["trials"] for kind in ("gpu_faults_named", "gpu_faults_not_named")} == {2}


def test_submit_and_render_both_take_portable():
    """--portable: `slurmtools` from the nodes' PATH; without it, this interpreter by its path."""
    from slurmtools import cli as cli_module
    for command in ("render", "submit"):
        assert cli_module.build_parser().parse_args([command, "job.yaml", "--portable"]).portable is True
    assert cli_module._slurmtools_cmd(True) == ["slurmtools"]
    assert cli_module._slurmtools_cmd(False) == [sys.executable, "-m", "slurmtools"]


def test_a_json_word_in_the_trainers_command_is_not_slurmtools_json():
    from slurmtools.cli import _asked_for_json
    assert _asked_for_json(["run", "--", "python", "train.py", "--json"], None) is False
    assert _asked_for_json(["status", "12x", "--json"], None) is True
    proc = cli("run", "--max-restarts", "-3", "--", "python", "train.py", "--json")
    assert proc.returncode == 2 and proc.stdout == ""


def test_a_command_of_a_group_built_alone_parses_as_in_the_whole_parser_and_health_imports_no_job_code():
    from slurmtools.cli import _ADDER_OF, build_parser
    whole = build_parser()
    for name in _ADDER_OF:
        alone = build_parser(name)
        assert alone.parse_args([name, *_FIRST_ARGS[name]]) == whole.parse_args([name, *_FIRST_ARGS[name]])
    proc = subprocess.run([sys.executable, "-c", "import sys; from slurmtools.cli import build_parser; "
                           "build_parser('health').parse_args(['health', 'run', '--phase', 'prolog']); "
                           "print(sorted(m for m in sys.modules if m.startswith(('slurmtools.requeue', 'slurmtools.spec'))))"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


_FIRST_ARGS = {"health": ["run", "--phase", "prolog"], "minicluster": ["status"], "preflight": [],
               "blames": ["handle"], "metrics": ["relay"]}
