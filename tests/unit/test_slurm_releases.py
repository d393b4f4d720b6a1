"""The parsers against what each Slurm release really printed (tests/unit/slurm_outputs/<release>/,
recorded on the mini-cluster by scripts/record_slurm_outputs.py; expected.json is the scene the
script set up, not a parser's reading of it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmtools.slurm import parse as sp

OUTPUTS = Path(__file__).parent / "slurm_outputs"
RELEASES = ["22.05", "24.11", "26.05"]


def load(release: str, name: str) -> str:
    return (OUTPUTS / release / name).read_text()


def expected(release: str) -> dict:
    return json.loads(load(release, "expected.json"))


def test_every_supported_release_has_recordings():
    assert sorted(p.name for p in OUTPUTS.iterdir()) == RELEASES


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_is_read_from_scontrol_version(release):
    major, minor = (int(part) for part in release.split("."))
    assert sp.parse_release(load(release, "version.txt")) == (major, minor)


@pytest.mark.parametrize("release", RELEASES)
def test_scontrol_json_exists_exactly_where_the_version_layer_says(release):
    has_json = sp.parse_release(load(release, "version.txt")) >= sp.SCONTROL_JSON_SINCE
    refused = expected(release)["refused"]
    assert has_json == (not refused)
    assert has_json == (OUTPUTS / release / "scontrol_show_node.json").exists()


def _key_value_nodes(release: str):
    text = load(release, "scontrol_show_node.txt")
    return {n.name: n for n in (sp.parse_node_record(sp.parse_scontrol_record(ln)) for ln in text.splitlines()
                                if ln.strip())}


@pytest.mark.parametrize("release", RELEASES)
def test_the_drained_node_and_its_reason_from_scontrol_o(release):
    scene = expected(release)
    nodes = _key_value_nodes(release)
    assert sorted(nodes) == ["node1", "node2", "node3"]
    assert [name for name, node in sorted(nodes.items()) if node.drained] == ["node3"]
    assert nodes["node3"].reason == scene["drained"]["node3"]
    assert nodes["node3"].reason_user == scene["drained_by"]
    assert nodes["node3"].state == "idle" and nodes["node3"].display_state == "drained"
    assert {nodes["node1"].state, nodes["node2"].state} <= {"mixed", "allocated"}
    assert all(node.gres.startswith("gpu:4") for node in nodes.values())


@pytest.mark.parametrize("release", ["24.11", "26.05"])
@pytest.mark.parametrize("name", ["scontrol_show_node.json", "scontrol_show_node_node3.json"])
def test_scontrol_json_nodes_agree_with_scontrol_o(release, name):
    by_json = {n.name: n for n in sp.parse_nodes_json(load(release, name))}
    by_line = _key_value_nodes(release)
    assert by_json, name
    for node_name, node in by_json.items():
        line = by_line[node_name]
        # recorded a moment apart: a node may still be COMPLETING the finished jobs in one of them
        steady = (lambda flags: tuple(f for f in flags if f != "COMPLETING"))
        assert (node.state, steady(node.flags), node.reason, node.reason_user, node.gres) == \
            (line.state, steady(line.flags), line.reason, line.reason_user, line.gres), node_name
        assert node.reason_time == "" if not line.reason else node.reason_time


def test_22_05_sinfo_json_nodes_agree_with_scontrol_o():
    by_json = {n.name: n for n in sp.parse_nodes_json(load("22.05", "sinfo.json"))}
    by_line = _key_value_nodes("22.05")
    assert sorted(by_json) == sorted(by_line)
    for name, node in by_json.items():
        assert (node.state, node.drained, node.reason) == (by_line[name].state, by_line[name].drained,
                                                           by_line[name].reason), name


@pytest.mark.parametrize("release", RELEASES)
def test_the_running_job_from_squeue_json(release):
    scene = expected(release)
    job_id = scene["jobs"]["running"]
    info = sp.parse_jobs_json(load(release, "squeue.json"), job_id)
    line = sp.parse_job_record(sp.parse_scontrol_record(load(release, "scontrol_show_job_running.txt")), job_id)
    assert info is not None and info.state == line.state == "RUNNING"
    assert info.nodes == line.nodes and len(info.nodes.split(",")) >= 1 and info.nodes.startswith("node")
    assert (info.exit_code, info.restarts, info.stdout) == ("0:0", 0, "/dev/null")
    assert sp.parse_jobs_json(load(release, "squeue.json"), 999999) is None


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_the_running_job_from_scontrol_json(release):
    job_id = expected(release)["jobs"]["running"]
    info = sp.parse_jobs_json(load(release, "scontrol_show_job_running.json"), job_id)
    line = sp.parse_job_record(sp.parse_scontrol_record(load(release, "scontrol_show_job_running.txt")), job_id)
    assert info is not None
    assert (info.state, info.nodes, info.exit_code, info.restarts) == (line.state, line.nodes, line.exit_code,
                                                                      line.restarts)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("which,state", [("failed", "FAILED"), ("completed", "COMPLETED")])
def test_finished_jobs_from_sacct_json(release, which, state):
    scene = expected(release)
    info = sp.parse_sacct_json(load(release, f"sacct_{which}.json"), scene["jobs"][which])
    assert info is not None and info.state == state and info.finished
    assert info.nodes == "node1" or info.nodes.startswith("node")
    if release == "22.05" and which == "failed":
        # 22.05's sacct --json loses a batch job's exit code (job and batch step say SUCCESS, 0);
        # job_state therefore reads 22.05's sacct as text (slurm.py)
        assert info.exit_code == "0:0"
    else:
        assert info.exit_code == scene[f"{which}_exit_code"]


def test_a_sacct_row_as_job_info():
    info = sp.parse_sacct_row({"JobID": "7", "State": "CANCELLED by 0", "NodeList": "node[1-2]", "ExitCode": "0:15"}, 7)
    assert (info.state, info.nodes, info.exit_code, info.finished) == ("CANCELLED", "node[1-2]", "0:15", True)
    pending = sp.parse_sacct_row({"JobID": "8", "State": "PENDING", "NodeList": "None assigned", "ExitCode": "0:0"}, 8)
    assert (pending.state, pending.nodes, pending.finished) == ("PENDING", "", False)


@pytest.mark.parametrize("release,line", [(None, "#SBATCH --requeue"), ((22, 5), "#SBATCH --requeue"),
                                          ((24, 11), "#SBATCH --requeue"), ((25, 11), "#SBATCH --requeue=expedite"),
                                          ((26, 5), "#SBATCH --requeue=expedite")])
def test_expedite_requeue_is_rendered_only_for_releases_that_take_it(release, line):
    from slurmtools.job import sbatch
    from slurmtools.spec import spec_from_dict

    spec = spec_from_dict({"name": "x", "nodes": 2, "command": ["t.py"], "expedite_requeue": True})
    script = sbatch.render(spec, slurm_release=release)
    assert [ln for ln in script.splitlines() if ln.startswith("#SBATCH --requeue")] == [line]
    noted = [ln for ln in script.splitlines() if ln.startswith("# expedite_requeue:")]
    assert len(noted) == (0 if line.endswith("expedite") else 1)
    plain = sbatch.render(spec_from_dict({"name": "x", "nodes": 2, "command": ["t.py"]}), slurm_release=release)
    assert "#SBATCH --requeue\n" in plain and "expedite" not in plain
