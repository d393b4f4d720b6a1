"""The sbatch renderer: golden scripts, valid bash, hostile values inert, random specs render or fail cleanly."""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmtools.common.control_dir import (COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S, attempt_of,
                                           collective_timeout_s)
from slurmtools.errors import SpecError
from slurmtools.job import sbatch
from slurmtools.job.sbatch import environment
from slurmtools.spec import load_spec, spec_from_dict

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SPEC_FILES = sorted((HERE / "specs").glob("*.yaml"))


@pytest.mark.parametrize("spec_file", SPEC_FILES, ids=lambda p: p.stem)
def test_golden(spec_file: Path):
    golden = HERE / "golden" / f"{spec_file.stem}.sbatch"
    assert golden.exists(), (f"missing golden file {golden}; create it deliberately with "
                             f"`slurmtools render --portable {spec_file.relative_to(REPO)} > {golden.relative_to(REPO)}`")
    source = str(spec_file.relative_to(REPO))
    assert sbatch.render(load_spec(spec_file), source=source) == golden.read_text()


@pytest.mark.parametrize("spec_file", SPEC_FILES, ids=lambda p: p.stem)
def test_rendered_scripts_are_valid_bash(spec_file: Path, tmp_path: Path):
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch.render(load_spec(spec_file)))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_node_count_is_written_once():
    text = sbatch.render(spec_from_dict({"name": "x", "command": ["t.py"], "nodes": 7, "gpus_per_node": 8}))
    assert text.count("7") == 1 and "#SBATCH --nodes=7" in text
    assert '--nnodes="$SLURM_JOB_NUM_NODES"' in text


def test_directives_are_sorted_and_signal_requeue_present():
    lines = [ln for ln in sbatch.render(load_spec(HERE / "specs" / "minimal.yaml")).splitlines()
             if ln.startswith("#SBATCH")]
    assert lines == sorted(lines)
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines
    assert "#SBATCH --signal=B:USR1@180" in lines


@pytest.mark.parametrize("minutes,expected", [(1, "00:01:00"), (90, "01:30:00"), (1440, "1-00:00:00"),
                                              (2881, "2-00:01:00")])
def test_time_limit_format(minutes, expected):
    assert sbatch.format_time_limit(minutes) == expected


def test_backslash_in_directive_is_refused():
    spec = spec_from_dict({"name": "a\\b", "command": ["t.py"]})
    with pytest.raises(SpecError, match=r"name: backslashes are not allowed here"):
        sbatch.render(spec)


# ---- hostile values -------------------------------------------------------------------
PAYLOADS = [
    "$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "' ; touch PWNED ; '", '" ; touch PWNED ; "',
    "&& touch PWNED", "| touch PWNED", "$HOME ${PATH} $((1+1))", "* ?", "ünïcødé ✓ 名前", "--flag=a b",
    "a'b\"c", "> PWNED", "x\ntouch PWNED",
]
DIRECTIVE_KEYS = ["name", "partition", "account", "qos", "constraint", "reservation"]
STUB = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["STUB_OUT"], "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, fh)
"""


def run_under_stubs(script_text: str, tmp_path: Path) -> dict:
    """Run a rendered script with stub scontrol and slurmtools; return what the supervisor got."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/sh\necho node1\necho node2\n")
    (bindir / "stub-slurmtools").write_text(STUB)
    for f in bindir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(script_text)
    out = tmp_path / "stub.json"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_JOB_NUM_NODES": "2", "STUB_OUT": str(out), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("payload", PAYLOADS)
def test_hostile_values_are_inert_and_exact(payload: str, tmp_path: Path):
    data = {"name": "inject", "launcher": "srun", "command": ["prog", payload, "--x", payload],
            "env": {"PAYLOAD": payload}, "checkpoint_dir": f"ck {payload}".replace("\n", " "),
            "output_dir": "logs", "python": "python3"}
    text = sbatch.render(spec_from_dict(data), slurmtools_cmd=[str(tmp_path / "bin" / "stub-slurmtools")])
    got = run_under_stubs(text, tmp_path)
    assert not list(tmp_path.rglob("PWNED"))
    argv = got["argv"]
    assert argv[-4:] == ["prog", payload, "--x", payload]       # the command arrives verbatim
    assert got["env"]["PAYLOAD"] == payload                     # so does the env value
    assert got["env"]["SLURMTOOLS_CHECKPOINT_DIR"] == data["checkpoint_dir"]
    assert f"--checkpoint-dir={data['checkpoint_dir']}" in argv
    assert got["env"]["MASTER_ADDR"] == "node1"
    assert 20000 <= int(got["env"]["MASTER_PORT"]) < 32000      # random (slurmtools.common.rendezvous)
    # the attempt id has one rule (runtime.attempt_of), applied by the supervisor, not the script
    assert "SLURMTOOLS_ATTEMPT_ID" not in got["env"] and "SLURMTOOLS_CHAIN_ID" not in got["env"]
    assert attempt_of(got["env"]) == (4242, 0, "4242.0")


@pytest.mark.parametrize("key", DIRECTIVE_KEYS)
@pytest.mark.parametrize("payload", [p for p in PAYLOADS if "\n" not in p])
def test_hostile_directive_values_stay_one_quoted_directive(key: str, payload: str, tmp_path: Path):
    text = sbatch.render(spec_from_dict({"name": "x", "command": ["t.py"], key: payload}),
                         slurmtools_cmd=[str(tmp_path / "bin" / "stub-slurmtools")])
    option = {"name": "job-name"}.get(key, key)
    lines = [ln for ln in text.splitlines() if ln.startswith(f"#SBATCH --{option}=")]
    assert len(lines) == 1
    assert shlex.split(lines[0][len("#SBATCH "):]) == [f"--{option}={payload}"]
    run_under_stubs(text, tmp_path)
    assert not list(tmp_path.rglob("PWNED"))


def test_newline_in_directive_field_is_a_spec_error():
    with pytest.raises(SpecError, match="partition: must not contain control characters"):
        spec_from_dict({"name": "x", "command": ["t.py"], "partition": "a\nb"})


# ---- property: random specs render or raise SpecError -----------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100000), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=3))
keys = st.sampled_from(["name", "command", "nodes", "gpus_per_node", "processes_per_node", "launcher", "mem_gb",
                        "time_limit_min", "partition", "exclude", "nodelist", "env", "network", "requeue",
                        "output_dir", "cpus_per_task", "container_image", "bogus"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, values, max_size=8))
def test_random_specs_render_or_raise_spec_error(data):
    base = {"name": "x", "command": ["t.py"]}
    base.update(data)
    try:
        spec = spec_from_dict(base)
        text = sbatch.render(spec)
    except SpecError:
        return
    assert text.startswith("#!/bin/bash\n")
    proc = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_notebook_parameters_pin_the_port_and_kill_on_bad_exit():
    from slurmtools.job.notebook import executor_parameters
    params = executor_parameters(spec_from_dict({"name": "nb", "nodes": 2, "gpus_per_node": 8,
                                                 "container_image": "img:1", "time_limit_min": 30}))
    assert params["tasks_per_node"] == 8 and params["timeout_min"] == 30
    assert params["slurm_srun_args"] == ["--kill-on-bad-exit=1", "--cpus-per-task=1", "--cpu-bind=cores",
                                         "--container-image=img:1"]
    assert params["cpus_per_task"] == 1
    assert "export MASTER_PORT=$(( 20000 + $(od -An -N2 -tu2 /dev/urandom) % 12000 ))" in params["slurm_setup"]
    assert params["slurm_signal_delay_s"] == 180 and params["slurm_additional_parameters"] == {"requeue": True}


@pytest.mark.parametrize("extra, expected", [
    ({"gpus_per_node": 8}, {"NCCL_IB_DISABLE": "0"}),                                # auto: GPUs -> IB
    ({"gpus_per_node": 8, "network": {"ib_hca": "mlx5"}}, {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5"}),
    ({}, {"NCCL_IB_DISABLE": "1"}),                                                  # auto: no GPUs
    ({"gpus_per_node": 8, "network": {"preset": "ethernet"}}, {"NCCL_IB_DISABLE": "1"}),
    ({"gpus_per_node": 8, "network": {"preset": "infiniband"}}, {"NCCL_IB_DISABLE": "0"}),
    ({"gpus_per_node": 8, "network": {"preset": "none", "ib_hca": "mlx5"}}, {}),
])
def test_the_network_preset_follows_the_hardware_unless_the_spec_says(extra, expected):
    """A GPU job without `network:` once got NCCL_IB_DISABLE=1: NCCL quietly on sockets on an
    InfiniBand cluster. `auto` (the default) gives a job with GPUs the infiniband preset."""
    spec = spec_from_dict({"name": "n", "command": ["t.py"], **extra})
    nccl = {name: value for name, value in environment(spec) if name.startswith("NCCL_IB")}
    assert nccl == expected


@pytest.mark.parametrize("extra, expected", [
    ({}, "1"),
    ({"distributed": {"async_error_handling": False}}, "0"),
    ({"launcher": "srun", "requeue": {"in_place": True, "spare_nodes": 1}}, "0"),
])
def test_nccl_async_error_handling_is_off_where_the_ranks_abort_their_group_in_place(extra, expected):
    """torch's abort of a process group asks for TORCH_NCCL_ASYNC_ERROR_HANDLING=0: with in-place
    recovery the ranks abort a broken group themselves (the hang watchdog stays the net)."""
    spec = spec_from_dict({"name": "n", "command": ["t.py"], "nodes": 2, **extra})
    assert dict(environment(spec))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == expected


EXAMPLES = HERE.parent.parent / "examples"


@pytest.mark.parametrize("example", sorted(path.parent.name for path in EXAMPLES.glob("*/train.py")))
def test_every_example_has_a_job_spec_that_renders_and_runs_its_trainer(example: str):
    """Each example comes with the job.yaml that submits it, as docs/user-guide.md's first job does."""
    spec = load_spec(EXAMPLES / example / "job.yaml")
    assert spec.command[0] == f"examples/{example}/train.py" and spec.python == ".venv/bin/python"
    script = sbatch.render(spec, slurmtools_cmd=["slurmtools"], source=f"examples/{example}/job.yaml")
    assert f"examples/{example}/train.py" in script and script.startswith("#!/bin/bash")


def test_the_readmes_job_spec_renders():
    """The front page's example is a job spec the renderer takes as it stands."""
    import yaml
    readme = (HERE.parent.parent / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = spec_from_dict(yaml.safe_load(block))
    assert spec.nodes == 4 and spec.gpus_per_node == 8 and spec.requeue.spare_nodes == 1
    script = sbatch.render(spec, slurmtools_cmd=["slurmtools"], source="job.yaml")
    assert "export NCCL_IB_DISABLE=0" in script        # GPUs: the interconnect preset is InfiniBand


@pytest.mark.parametrize("distributed, expected_s", [({}, DEFAULT_COLLECTIVE_TIMEOUT_S), ({"collective_timeout_s": 90}, 90)])
def test_every_rank_reads_back_the_specs_collective_timeout(distributed, expected_s):
    """What the script exports is what a rank's process group waits; a job run outside the script
    (no variable, or no whole number in it) waits the spec's own default."""
    spec = spec_from_dict({"name": "t", "command": ["train.py"], "distributed": distributed})
    assert collective_timeout_s(dict(environment(spec))) == expected_s
    assert collective_timeout_s({}) == collective_timeout_s({COLLECTIVE_TIMEOUT_ENV: "1e3"}) == 1800
