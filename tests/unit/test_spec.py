"""JobSpec loading and validation: every bad input is one SpecError naming file:line and key."""
from pathlib import Path

import pytest

from slurmtools.errors import SpecError
from slurmtools.spec import JobSpec, RequeueSpec, field_docs, load_spec, spec_from_dict

SPECS = Path(__file__).parent / "specs"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    return str(info.value)


def test_minimal_spec_defaults():
    spec = load_spec(SPECS / "minimal.yaml")
    assert spec.name == "minimal"
    assert spec.nodes == 1 and spec.gpus_per_node == 0 and spec.procs_per_node == 1
    assert spec.launcher == "torchrun"
    assert spec.requeue == RequeueSpec()
    assert spec.world_size == 1


def test_full_spec_loads_every_field():
    spec = load_spec(SPECS / "full.yaml")
    assert spec.world_size == 128
    assert spec.command[:2] == ["-m", "mytrainer.main"]
    assert spec.env == {"HF_HOME": "/shared/hf", "WANDB_MODE": "offline"}
    assert spec.network.ib_hca == "mlx5"
    assert spec.requeue.backoff_s == 30.0 and isinstance(spec.requeue.backoff_s, float)
    assert spec.distributed.dump_on_timeout is False


def test_processes_default_to_one_per_gpu():
    assert spec_from_dict({"name": "x", "command": ["t.py"], "gpus_per_node": 8}).procs_per_node == 8
    assert spec_from_dict({"name": "x", "command": ["t.py"], "gpus_per_node": 8,
                           "processes_per_node": 2}).procs_per_node == 2


def test_unknown_key_names_line_and_suggests(tmp_path):
    msg = error_of(tmp_path, "name: x\ncommand: [t.py]\nnodez: 2\n")
    assert msg.startswith(f"{tmp_path}/job.yaml:3: nodez: unknown key; did you mean 'nodes'? Valid keys: name, command,")


def test_unknown_nested_key(tmp_path):
    msg = error_of(tmp_path, "name: x\ncommand: [t.py]\nrequeue:\n  max_restart: 2\n")
    assert msg.startswith(f"{tmp_path}/job.yaml:4: requeue.max_restart: unknown key; did you mean 'max_restarts'?")
    assert "Valid keys: max_restarts, restart_window_h, max_consecutive_failures" in msg


def test_unknown_key_without_close_match_lists_keys(tmp_path):
    msg = error_of(tmp_path, "name: x\ncommand: [t.py]\nzzz: 1\n")
    assert "did you mean" not in msg and "Valid keys: name" in msg


@pytest.mark.parametrize("text,expected", [
    ("name: x\ncommand: [t.py]\nnodes: 0\n", ":3: nodes: must be >= 1, got 0"),
    ("name: x\ncommand: [t.py]\nnodes: two\n", ":3: nodes: must be an integer, got 'two'"),
    ("name: x\ncommand: [t.py]\nnodes: true\n", ":3: nodes: must be an integer, got True"),
    ("name: x\ncommand: t.py\n", ":2: command: must be a list of strings, got str"),
    ("name: x\ncommand: [t.py, {a: 1}]\n", ":2: command: item 1 must be a string, got dict"),
    ("name: x\ncommand: [run.sh]\n", ":2: command: with launcher torchrun the command starts with a .py script"),
    ("name: x\ncommand: [t.py]\nlauncher: mpirun\n", ":3: launcher: must be one of torchrun, srun; got 'mpirun'"),
    ("name: x\ncommand: [t.py]\nmem_gb: -1\n", ":3: mem_gb: must be >= 0.0, got -1.0"),
    ("name: x\ncommand: [t.py]\nexclude: 'gpu[1-'\n", ":3: exclude: not a valid hostlist 'gpu[1-'"),
    ("name: x\ncommand: [t.py]\nnodes: 3\nnodelist: 'n[1-2]'\n", ":4: nodelist: lists 2 node(s) but nodes is 3"),
    ("name: x\ncommand: [t.py]\nnodelist: 'n[1-2]'\nexclude: n2\n", ":4: exclude: n2 is both in nodelist and exclude"),
    ("name: x\ncommand: [t.py]\nenv: {'1BAD': x}\n", ":3: env: '1BAD' is not a valid environment variable name"),
    ("name: x\ncommand: [t.py]\nenv: [a]\n", ":3: env: must be a mapping of strings, got list"),
    ("name: x\ncommand: [t.py]\nnetwork: {preset: ib}\n",
     ":3: network.preset: must be one of auto, infiniband, ethernet, none; got 'ib'"),
    ("name: x\ncommand: [t.py]\nrequeue: {warning_lead_s: 60, checkpoint_grace_s: 60}\n",
     ":3: requeue.checkpoint_grace_s: must be shorter than requeue.warning_lead_s (60)"),
    ("name: x\ncommand: [t.py]\ntime_limit_min: 2\n",
     ":3: time_limit_min: 2 min leaves no room for the warning signal (requeue.warning_lead_s is 180 s)"),
    ("name: x\ncommand: [t.py]\nrequeue: {warning_signal: KILL}\n",
     ":3: requeue.warning_signal: must be one of USR1, USR2, TERM, INT, HUP; got 'KILL'"),
    ("name: a/b\ncommand: [t.py]\n", ":1: name: must not contain '/'"),
    ("name: '  '\ncommand: [t.py]\n", ":1: name: must not be empty"),
    ("name: \"a\\nb\"\ncommand: [t.py]\n", ":1: name: must not contain control characters"),
    ("command: [t.py]\n", ": name: is required"),
    ("name: x\ncommand: [t.py]\nrequeue: 5\n", ":3: requeue: must be a mapping, got int"),
    ("name: x\ncommand: [t.py]\nrequeue: {in_place: true, spare_nodes: 1}\n",
     ":3: requeue.in_place: needs launcher: srun (one task per rank, placed by us; torchrun's agents restart"),
])
def test_bad_values_name_line_and_key(tmp_path, text, expected):
    assert expected in error_of(tmp_path, text)


def test_yaml_syntax_error_names_line(tmp_path):
    assert error_of(tmp_path, "name: x\ncommand: [t.py\nnodes: 2\n").startswith(f"{tmp_path}/job.yaml:3: invalid YAML")


def test_duplicate_key_is_an_error(tmp_path):
    assert error_of(tmp_path, "name: x\nname: y\ncommand: [t.py]\n") == f"{tmp_path}/job.yaml:2: duplicate key 'name'"


@pytest.mark.parametrize("text, problem", [("", "is empty: a job spec needs at least name and command"),
                                           ("- a\n- b\n", "must be a mapping of keys to values, got list"),
                                           ("just a string\n", "must be a mapping of keys to values, got str")])
def test_top_level_must_be_a_mapping(tmp_path, text, problem):
    assert problem in error_of(tmp_path, text)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(SpecError, match=r"nope.yaml: no such file"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(bad)


def test_python_built_spec_follows_the_same_rules():
    with pytest.raises(SpecError, match="nodes: must be >= 1"):
        JobSpec(name="x", command=["t.py"], nodes=0)
    with pytest.raises(SpecError, match="max_restarts: must be >= 0"):
        RequeueSpec(max_restarts=-1)


def test_env_values_accept_numbers_and_booleans(tmp_path):
    spec = load_spec(write(tmp_path, "name: x\ncommand: [t.py]\nenv: {A: 1, B: true, C: 2.5}\n"))
    assert spec.env == {"A": "1", "B": "1", "C": "2.5"}


def test_command_is_optional_in_the_spec_but_required_to_render():
    from slurmtools.job import sbatch
    spec = spec_from_dict({"name": "notebook-job", "nodes": 2})
    assert spec.command == []
    with pytest.raises(SpecError, match="command: is required for an sbatch script"):
        sbatch.render(spec)


def test_every_field_is_documented():
    rows = field_docs()
    assert all(doc for _, _, doc in rows)
    keys = [k for k, _, _ in rows]
    assert "requeue.hang_timeout_s" in keys and "network.ib_hca" in keys
    assert dict((k, d) for k, d, _ in rows)["name"] == "(required)"
