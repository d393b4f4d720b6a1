"""The `active` phase: dcgmi diag, all_reduce_perf and ib_write_bw outputs (written from the
formats those tools document, in active_outputs/) parsed and judged; the tools run as child
processes with a time box; a missing tool or an unknown format is UNKNOWN, never a pass; a
CRITICAL finding drains like any other phase's."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from slurmtools.common.schema import build
from slurmtools.health import active_probe, config, gate
from slurmtools.health.checks import active
from slurmtools.health.model import Status

OUTPUTS = Path(__file__).parent / "active_outputs"


def text(name: str) -> str:
    return (OUTPUTS / name).read_text()


def test_dcgm_3_json_with_a_failed_memory_test_is_critical_and_names_the_gpu():
    findings = active.parse_dcgm_diag(text("dcgm3_fail.json"))
    assert len(findings) == 9
    result = active.check_dcgm_diag(config.ActiveDcgmDiag(level=3), findings)
    assert result.status is Status.CRITICAL
    assert result.summary == "level=3 test=GPU_Memory gpu=1 status=Fail Found 2 uncorrectable ECC errors on GPU 1"
    assert result.details["failed"] == ["GPU Memory/gpu 1: Found 2 uncorrectable ECC errors on GPU 1"]


def test_dcgm_4_json_with_a_warning_is_warn_and_skips_are_no_failure():
    result = active.check_dcgm_diag(config.ActiveDcgmDiag(), active.parse_dcgm_diag(text("dcgm4_pass.json")))
    assert (result.status, result.summary) == (
        Status.WARN, "level=2 test=pcie gpu=0 status=Warn PCIe replay count above threshold on GPU 0")
    passing = text("dcgm4_pass.json").replace('"Warn"', '"Pass"')
    assert active.check_dcgm_diag(config.ActiveDcgmDiag(), active.parse_dcgm_diag(passing)).summary == (
        "level=2: 5 results pass")


@pytest.mark.parametrize("output,message", [
    ("Error: unable to connect to host engine", "not JSON"),
    ('{"something": {}}', "no 'DCGM GPU Diagnostic' or 'DCGM Diagnostic' object with test_categories"),
    ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "x", "results": [{}]}]}]}}',
     "a result of 'x' without a status"),
    ('{"DCGM Diagnostic": {"test_categories": []}}', "no results"),
])
def test_dcgm_output_of_an_unknown_shape_is_a_parse_error(output, message):
    with pytest.raises(active.ParseError, match=message):
        active.parse_dcgm_diag(output)


def test_an_unknown_dcgm_status_is_unknown_not_a_pass():
    finding = active.DcgmFinding("Hardware", "memory", "0", "Inconclusive", "")
    assert active.check_dcgm_diag(config.ActiveDcgmDiag(), [finding]).status is Status.UNKNOWN


def test_all_reduce_perf_bandwidth_at_the_largest_size_against_the_floor():
    run = active.parse_all_reduce_perf(text("all_reduce_perf_ok.txt"))
    assert (len(run.rows), run.out_of_bounds, run.avg_busbw_gbps) == (5, 0, 135.7426)
    ok = active.check_nccl_allreduce(config.ActiveNcclAllReduce(min_busbw_gbps=300), run)
    assert (ok.status, ok.summary) == (Status.OK, "busbw=326.06GB/s at 8589934592B, no wrong results")
    slow = active.check_nccl_allreduce(config.ActiveNcclAllReduce(min_busbw_gbps=350), run)
    assert (slow.status, slow.summary) == (Status.CRITICAL, "busbw=326.06GB/s expected>=350 at 8589934592B")


def test_all_reduce_perf_wrong_results_are_corrupted_data():
    run = active.parse_all_reduce_perf(text("all_reduce_perf_wrong.txt"))
    result = active.check_nccl_allreduce(config.ActiveNcclAllReduce(), run)
    assert (result.status, result.summary) == (Status.CRITICAL, "wrong=3 results (corrupted data)")
    with pytest.raises(active.ParseError, match="no result rows"):
        active.parse_all_reduce_perf("# nThread 1 nGpus 8\n# Avg bus bandwidth    : 0\n")


def test_ib_write_bw_in_gbits_and_in_megabytes_per_second():
    assert active.parse_ib_write_bw(text("ib_write_bw_gbits.txt")) == (1048576, 391.87)
    size, gbps = active.parse_ib_write_bw(text("ib_write_bw_mb.txt"))
    assert size == 1048576 and gbps == pytest.approx(11388.52 * 1048576 * 8 / 1e9)
    params = config.ActiveIbWriteBw(min_bw_gbps=380)
    assert active.check_ib_write_bw(params, {"mlx5_0": (1048576, 391.87)}).status is Status.OK
    slow = active.check_ib_write_bw(params, {"mlx5_0": (1048576, 391.87), "mlx5_1": (1048576, 95.5)})
    assert (slow.status, slow.summary) == (Status.CRITICAL, "device=mlx5_1 bw=95.5Gb/s expected>=380 at 1048576B")
    with pytest.raises(active.ParseError, match="no '#bytes #iterations"):
        active.parse_ib_write_bw("Couldn't connect to localhost:18515\n")


# ---- running the tools -------------------------------------------------------------------------
def tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def settings(tmp_path: Path, active_checks) -> config.NodeSettings:
    return build(config.NodeSettings, {
        "gpu_probe": "none", "sysfs_root": str(tmp_path / "root"), "kernel_log": None, "syslog": False,
        "state_dir": str(tmp_path / "state"), "drain": False, "checks": {"active": active_checks}})


def test_an_active_run_parses_each_tool_and_the_worst_finding_decides(tmp_path):
    dcgm = tool(tmp_path, "dcgmi", f"cat {OUTPUTS / 'dcgm3_fail.json'}\nexit 226\n")    # dcgmi exits non-zero on a fail
    nccl = tool(tmp_path, "all_reduce_perf", f"cat {OUTPUTS / 'all_reduce_perf_ok.txt'}\n")
    ib = tool(tmp_path, "ib_write_bw", f'case "$*" in *localhost*) cat {OUTPUTS / "ib_write_bw_gbits.txt"};; '
                                       '*) sleep 30;; esac\n')
    s = settings(tmp_path, {"dcgm_diag": {"command": dcgm}, "nccl_allreduce": {"command": nccl},
                            "ib_write_bw": {"command": ib, "devices": ["mlx5_0"]}})
    outcome = gate.run_phase(s, "active", "gpu001", job_id=None, allow_drain=False)
    assert {r.name: r.status for r in outcome.results} == {
        "active.dcgm_diag": Status.CRITICAL, "active.nccl_allreduce": Status.OK, "active.ib_write_bw": Status.OK}
    assert outcome.status is Status.CRITICAL and outcome.exit_code != 0
    assert next(r for r in outcome.results if r.name == "active.ib_write_bw").summary == "mlx5_0 391.9Gb/s"


def test_a_missing_tool_a_hung_tool_and_an_unknown_output_are_unknown(tmp_path):
    hung = tool(tmp_path, "all_reduce_perf", "sleep 30\n")
    chatty = tool(tmp_path, "dcgmi", "echo 'Error: unable to connect to host engine'\n")
    s = settings(tmp_path, {"dcgm_diag": {"command": chatty},
                            "nccl_allreduce": {"command": hung, "timeout_s": 1},
                            "ib_write_bw": {"command": "no-such-ib_write_bw", "devices": ["mlx5_0"]}})
    results = {r.name: r for r in active_probe.active_results(s, deadline=float("inf"))}
    assert {name: r.status for name, r in results.items()} == {
        "active.dcgm_diag": Status.UNKNOWN, "active.nccl_allreduce": Status.UNKNOWN,
        "active.ib_write_bw": Status.UNKNOWN}
    assert results["active.dcgm_diag"].summary.startswith("output not understood: not JSON")
    assert results["active.nccl_allreduce"].summary == f"{hung} timed out after 1 s"
    assert results["active.ib_write_bw"].summary == (
        "device=mlx5_0: no-such-ib_write_bw is not installed (not found on PATH)")


def test_passive_phases_never_run_the_active_tools(tmp_path):
    marker = tmp_path / "ran"
    dcgm = tool(tmp_path, "dcgmi", f"touch {marker}\n")
    s = settings(tmp_path, {"dcgm_diag": {"command": dcgm}})
    for phase in config.PASSIVE_PHASES:
        outcome = gate.run_phase(s, phase, "gpu001", job_id=None, allow_drain=False)
        assert not [r for r in outcome.results if r.name.startswith("active.")]
    assert not marker.exists()
