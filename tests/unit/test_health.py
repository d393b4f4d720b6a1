"""Health: every check and threshold table-driven over recorded-format fixtures; runner time boxes,
cache, job baselines, config rules and reports."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurmtools.errors import ConfigError
from slurmtools.health import config, config_file, gate, kmsg, runner, sysfs
from slurmtools.health.checks import ib as ib_checks
from slurmtools.health.config import parse_config
from slurmtools.health.fixture_data import node_snapshot, with_fault, write_ib_tree, xid_line
from slurmtools.health.gpu_probe import FixtureProbe, snapshot_from_json, throttle_names
from slurmtools.health.model import Status

H100 = {"gpu": {"count": {"expected": 8}, "pcie": {"expected_width": 16, "expected_gen": 5},
                "nvlink": {"expected_active": 18}}}


def settings(tmp_path: Path, *, probe="fixture:h100-8gpu", checks=None, **over) -> config.NodeSettings:
    data = {"gpu_probe": probe, "sysfs_root": str(tmp_path / "root"), "kernel_log": None,
            "state_dir": str(tmp_path / "state"), "syslog": False, "drain": False,
            "checks": checks if checks is not None else H100}
    data.update(over)
    from slurmtools.common.schema import build
    return build(config.NodeSettings, data)


def statuses(outcome) -> dict:
    return {r.name: r.status.name for r in outcome.results}


def run(s, phase="prolog", job=None, host="gpu001"):
    return gate.run_phase(s, phase, host, job_id=job, allow_drain=False)


@pytest.mark.parametrize("fixture,check,summary", [
    ("h100-8gpu-ecc-uncorrected", "gpu.ecc", "gpu=3 uncorrected=2"),
    ("h100-8gpu-row-remap-failed", "gpu.memory", "gpu=3 row_remap=failed"),
    ("h100-8gpu-missing-gpu", "gpu.count", "gpus=7 expected=8"),
    ("h100-8gpu-pcie-degraded", "gpu.pcie", "gpu=3 width=x8 expected=x16"),
    ("h100-8gpu-nvlink-down", "gpu.nvlink", "gpu=3 active=17/18 down=5"),
    ("h100-8gpu-hw-slowdown", "gpu.thermal", "gpu=3 throttle=hw_slowdown,hw_thermal_slowdown"),
    ("h100-8gpu-stray-process", "gpu.processes", "gpu=3 pids=4242 before the job"),
])
def test_each_gpu_fault_fixture_is_critical_in_exactly_its_check(tmp_path, fixture, check, summary):
    out = run(settings(tmp_path, probe=f"fixture:{fixture}"))
    crit = [r for r in out.results if r.status is Status.CRITICAL]
    assert [(r.name, r.summary) for r in crit] == [(check, summary)]
    assert out.exit_code == 3


@pytest.mark.parametrize("fixture,summary", [
    ("h100-8gpu-row-remap-pending", "gpu=3 row_remap=pending (applied at the next GPU reset)"),
    ("h100-8gpu-retired-pages-pending", "gpu=3 retired_pages=pending (applied at the next GPU reset)"),
])
def test_a_pending_remap_or_retirement_warns_and_lets_work_start(tmp_path, fixture, summary):
    out = run(settings(tmp_path, probe=f"fixture:{fixture}"))
    assert [(r.name, r.status, r.summary) for r in out.results if r.status is not Status.OK] == [
        ("gpu.memory", Status.WARN, summary)]
    assert out.exit_code == 0


@pytest.mark.parametrize("fixture", ["h100-8gpu", "h200-8gpu"])
def test_healthy_nodes_pass_everything(tmp_path, fixture):
    write_ib_tree(tmp_path / "root", 8)
    out = run(settings(tmp_path, probe=f"fixture:{fixture}",
                       checks=dict(H100, ib={"ports": {"expected_ports": 8, "min_rate_gbps": 400,
                                                       "link_layer": "InfiniBand"}})))
    assert set(statuses(out).values()) == {"OK"}, statuses(out)
    assert out.exit_code == 0


@pytest.mark.parametrize("fixture,check,summary", [
    ("h100-8gpu-ecc-corrected-high", "gpu.ecc", "gpu=3 corrected=5000 > 1000"),
    ("h100-8gpu-hot", "gpu.thermal", "gpu=3 temp=89C"),
])
def test_warn_fixtures_never_fail_the_prolog(tmp_path, fixture, check, summary):
    out = run(settings(tmp_path, probe=f"fixture:{fixture}"))
    warn = [(r.name, r.summary) for r in out.results if r.status is Status.WARN]
    assert warn == [(check, summary)] and out.exit_code == 0


def test_thresholds_are_configurable(tmp_path):
    out = run(settings(tmp_path, probe="fixture:h100-8gpu-ecc-corrected-high",
                       checks={"gpu": {"ecc": {"corrected_warn": 10000}}}))
    assert statuses(out)["gpu.ecc"] == "OK"
    out = run(settings(tmp_path, probe="fixture:h100-8gpu-hot", checks={"gpu": {"thermal": {"temperature_warn_c": 95}}}))
    assert statuses(out)["gpu.thermal"] == "OK"


def test_processes_check_runs_in_prolog_and_epilog_only(tmp_path):
    s = settings(tmp_path, probe="fixture:h100-8gpu-stray-process")
    assert statuses(run(s, "epilog"))["gpu.processes"] == "CRITICAL"
    assert "gpu.processes" not in statuses(run(s, "periodic"))
    assert [r.summary for r in run(s, "epilog").results if r.name == "gpu.processes"] == \
        ["gpu=3 pids=4242 after the job"]


def test_disabled_check_does_not_run(tmp_path):
    out = run(settings(tmp_path, probe="fixture:h100-8gpu-ecc-uncorrected",
                       checks={"gpu": {"ecc": {"enabled": False}}}))
    assert "gpu.ecc" not in statuses(out) and out.exit_code == 0


# ---- XIDs from the kernel log ------------------------------------------------------------
def test_fatal_xid_is_critical_and_attributed_to_the_gpu(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(xid_line(10, 79, "0000:5d:00") + "6,11,11000,-;unrelated line\n")
    out = run(settings(tmp_path, kernel_log=str(log)))
    xid = [r for r in out.results if r.name == "gpu.xid"][0]
    assert (xid.status, xid.summary) == (Status.CRITICAL, "xid=79 action=reboot gpu=3 pci=0000:5d:00")
    assert xid.details["remedy"] == "reboot"


def test_restart_app_xid_is_warn_and_each_event_counts_once(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(xid_line(5, 13))
    s = settings(tmp_path, kernel_log=str(log))
    assert statuses(run(s))["gpu.xid"] == "WARN"
    assert statuses(run(s))["gpu.xid"] == "OK"          # already seen: watermark moved
    with open(log, "a") as fh:
        fh.write(xid_line(6, 94) + xid_line(7, 63))    # contained memory error (the job's), row-remap event
    xid = [r for r in run(s).results if r.name == "gpu.xid"][0]
    assert (xid.status, xid.summary) == (Status.WARN, "xid=94 action=restart_app gpu=3 pci=0000:5d:00")
    assert [(e["xid"], e["action"]) for e in xid.details["events"]] == [(94, "restart_app"), (63, "ignore")]
    with open(log, "a") as fh:
        fh.write(xid_line(8, 61) + xid_line(9, 46))
    xid = [r for r in run(s).results if r.name == "gpu.xid"][0]
    assert (xid.status, xid.summary) == (Status.CRITICAL, "xid=61 action=drain gpu=3 pci=0000:5d:00")
    assert "remedy" not in xid.details


def test_admin_overrides_an_xid_action_and_integer_keys_stay_integers(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(xid_line(5, 94) + xid_line(6, 79))
    s = settings(tmp_path, kernel_log=str(log), checks={"gpu": {"xid": {"actions": {94: "drain", 79: "ignore"}}}})
    assert s.checks.gpu.xid.actions == {94: "drain", 79: "ignore"}
    xid = [r for r in run(s).results if r.name == "gpu.xid"][0]
    assert (xid.status, xid.summary) == (Status.CRITICAL, "xid=94 action=drain gpu=3 pci=0000:5d:00")


def test_kmsg_parsing():
    recs = kmsg.parse_records(["6,1,10,-;hello\n", "garbage\n", "4,2,20,-;NVRM: Xid (PCI:0000:1b:00): 48, DBE\n"])
    assert recs == [(1, "hello"), (2, "NVRM: Xid (PCI:0000:1b:00): 48, DBE")]
    assert [(e.seq, e.code, e.pci_bus_id) for e in kmsg.xid_events(recs, 0)] == [(2, 48, "0000:1b:00")]
    assert kmsg.xid_events(recs, 2) == []


# ---- InfiniBand -------------------------------------------------------------------------
@pytest.mark.parametrize("faults,summary", [
    (["port-down"], "ports=mlx5_3/1 state=DOWN phys_state=Disabled"),
    (["polling"], "ports=mlx5_3/1 state=DOWN phys_state=Polling"),
    (["slow"], "ports=mlx5_3/1 rate=200Gb/s expected>=400"),
])
def test_ib_port_faults(tmp_path, faults, summary):
    write_ib_tree(tmp_path / "root", 8, faults=faults)
    out = run(settings(tmp_path, probe="none", checks={"ib": {"ports": {"min_rate_gbps": 400}}}))
    r = [r for r in out.results if r.name == "ib.ports"][0]
    assert (r.status, r.summary) == (Status.CRITICAL, summary)


def test_ib_port_count_and_link_layer(tmp_path):
    write_ib_tree(tmp_path / "root", 7, link_layer="Ethernet")
    r = ib_checks.check_ports(config.IbPorts(expected_ports=8), sysfs.read_ib_ports(tmp_path / "root"))
    assert r.summary == "ports=7 expected=8"
    r = ib_checks.check_ports(config.IbPorts(link_layer="InfiniBand"), sysfs.read_ib_ports(tmp_path / "root"))
    assert r.summary == ("ports=mlx5_0/1,mlx5_1/1,mlx5_2/1,mlx5_3/1,mlx5_4/1,mlx5_5/1,+1 "
                         "link_layer=Ethernet expected=InfiniBand")
    r = ib_checks.check_ports(config.IbPorts(link_layer="InfiniBand", ignore_hcas=[f"mlx5_{i}" for i in range(7)]),
                              sysfs.read_ib_ports(tmp_path / "root"))
    assert r.status is Status.OK


def test_ib_sysfs_reader(tmp_path):
    write_ib_tree(tmp_path, 2)
    ports = sysfs.read_ib_ports(tmp_path)
    assert [(p.key, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_0/1", "ACTIVE", "LinkUp", 400.0, "InfiniBand"), ("mlx5_1/1", "ACTIVE", "LinkUp", 400.0, "InfiniBand")]
    assert ports[0].counters["link_downed"] == 0
    assert sysfs.read_ib_ports(tmp_path / "nothing") == []
    assert sysfs.parse_rate_gbps("100 Gb/sec (4X EDR)") == 100.0 and sysfs.parse_rate_gbps("junk") is None


@pytest.mark.parametrize("counters,status,summary", [
    ({"local_link_integrity_errors": 3}, Status.CRITICAL, "ports=mlx5_0/1,mlx5_1/1 local_link_integrity_errors+3"),
    ({"symbol_error": 9}, Status.OK, "no error counter growth"),
    ({"symbol_error": 10}, Status.WARN, "ports=mlx5_0/1,mlx5_1/1 symbol_error=10/h"),
    ({"port_rcv_errors": 1000}, Status.CRITICAL, "ports=mlx5_0/1,mlx5_1/1 port_rcv_errors=1000/h"),
    ({"port_rcv_data": 10 ** 9}, Status.OK, "no error counter growth"),
])
def test_ib_counter_deltas_since_previous_run(tmp_path, counters, status, summary):
    s = settings(tmp_path, probe="none")
    write_ib_tree(tmp_path / "root", 2)
    first = [r for r in run(s).results if r.name == "ib.counters"][0]
    assert first.summary == "baseline recorded"
    write_ib_tree(tmp_path / "root", 2, counters=counters)
    r = [r for r in run(s).results if r.name == "ib.counters"][0]
    assert (r.status, r.summary) == (status, summary)


# ---- runner: time boxes, deadline, errors ------------------------------------------------
def test_hung_probe_is_a_timed_out_result_not_a_hung_run(tmp_path):
    s = settings(tmp_path, probe="fixture:h100-8gpu-hang", probe_timeout_s=0.3, deadline_s=1.0)
    t0 = time.monotonic()
    out = run(s)
    assert time.monotonic() - t0 < 1.5
    count = [r for r in out.results if r.name == "gpu.count"][0]
    assert (count.status, count.summary) == (Status.CRITICAL, "NVML probe: timed out after 0.3 s")
    assert out.exit_code == 3
    assert runner.any_probe_thread_alive()


def test_probe_timeout_status_is_configurable(tmp_path):
    s = settings(tmp_path, probe="fixture:h100-8gpu-hang", probe_timeout_s=0.2, probe_timeout_status="UNKNOWN")
    assert run(s).exit_code == 0


def test_failing_probe_is_unknown_and_never_critical(tmp_path):
    out = run(settings(tmp_path, probe=f"fixture:{tmp_path}/missing.json"))
    assert {r.status for r in out.results if r.name.startswith("gpu.")} == {Status.UNKNOWN}
    assert out.exit_code == 0


def test_fixture_is_never_a_fallback_for_nvml(tmp_path):
    out = run(settings(tmp_path, probe="nvml"))
    gpu = [r for r in out.results if r.name.startswith("gpu.")]
    assert gpu and all(r.status is Status.UNKNOWN for r in gpu)
    assert "NVML probe" in gpu[0].summary


def test_snapshot_json_roundtrip_and_unknown_fields():
    data = with_fault(node_snapshot("h200"), "nvlink-down")
    snap = snapshot_from_json(data)
    assert len(snap.gpus) == 8 and snap.gpus[3].nvlinks[5].active is False
    data["gpus"][0]["bogus"] = 1
    with pytest.raises(Exception, match="unknown fields"):
        snapshot_from_json(data)
    assert throttle_names(0x8 | 0x40) == ("hw_slowdown", "hw_thermal_slowdown")
    assert FixtureProbe("h100-8gpu").path.name == "h100-8gpu.json"


# ---- cache and job baselines --------------------------------------------------------------
def test_prolog_cache_skips_nvml_until_a_counter_moves(tmp_path):
    write_ib_tree(tmp_path / "root", 2)
    s = settings(tmp_path, cache_minutes=10)
    assert not run(s).cached
    second = run(s)
    assert second.cached and not any(r.name.startswith("gpu.") for r in second.results)
    write_ib_tree(tmp_path / "root", 2, counters={"symbol_error": 1})
    assert not run(s).cached
    assert not run(s, "epilog").cached


def test_epilog_attributes_deltas_to_the_job(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(xid_line(1, 13))
    write_ib_tree(tmp_path / "root", 2)
    s = settings(tmp_path, kernel_log=str(log))
    run(s, "prolog", job="77")
    run(s, "periodic")                     # a periodic run in between moves the watermark ...
    with open(log, "a") as fh:
        fh.write(xid_line(2, 79))
    write_ib_tree(tmp_path / "root", 2, counters={"local_link_integrity_errors": 1})
    run(s, "periodic")
    out = run(s, "epilog", job="77")       # ... the epilog still compares with the job's baseline
    crit = {r.name: r for r in out.results if r.status is Status.CRITICAL}
    assert crit["gpu.xid"].summary.endswith("(during this job)") and crit["gpu.xid"].details["job_id"] == "77"
    assert crit["ib.counters"].summary == "ports=mlx5_0/1,mlx5_1/1 local_link_integrity_errors+1 (during this job)"
    state = json.loads((tmp_path / "state" / "gpu001" / "state.json").read_text())
    assert "77" not in state["jobs"]


# ---- reports -------------------------------------------------------------------------------
def test_json_and_prometheus_reports(tmp_path):
    prom = tmp_path / "textfile" / "slurmtools.prom"
    out = run(settings(tmp_path, probe="fixture:h100-8gpu-ecc-uncorrected", textfile=str(prom)))
    text = prom.read_text()
    assert 'slurmtools_health_check_status{check="gpu.ecc",phase="prolog"} 2.0' in text
    assert 'slurmtools_health_status{phase="prolog"} 2.0' in text
    last = json.loads((tmp_path / "state" / "gpu001" / "last-prolog.json").read_text())
    assert last["status"] == "CRITICAL" and last == json.loads(json.dumps(out.report))


# ---- config ---------------------------------------------------------------------------------
def test_host_sections_merge_in_order():
    c = parse_config("defaults:\n  checks: {gpu: {count: {expected: 8}}}\nhosts:\n"
                     "  - match: 'gpu[001-064]'\n    gpu_probe: none\n"
                     "  - match: gpu007\n    gpu_probe: 'fixture:h100-8gpu'\n", "h.yaml")
    assert c.for_host("gpu003").gpu_probe == "none"
    assert c.for_host("gpu007").gpu_probe == "fixture:h100-8gpu"
    assert c.for_host("login1").gpu_probe == "nvml"
    assert c.for_host("gpu007").checks.gpu.count.expected == 8


@pytest.mark.parametrize("text,expected", [
    ("defaults:\n  checks:\n    gpu:\n      ecc: {corected_warn: 5}\n",
     "h.yaml:4: defaults.checks.gpu.ecc.corected_warn: unknown key; did you mean 'corrected_warn'?"),
    ("defaults: {probe_timeout_s: 0}\n", "h.yaml:1: defaults.probe_timeout_s: must be >= 0.05, got 0.0"),
    ("hosts:\n  - gpu_probe: none\n", "h.yaml:2: hosts.0: each host section needs `match: <hostlist>`"),
    ("hosts:\n  - match: 'g[1-'\n", "h.yaml:2: hosts.0.match: not a valid hostlist"),
    ("defaults: {gpu_probe: magic}\n", "h.yaml:1: defaults.gpu_probe: must be nvml, none or fixture:<path>"),
    ("default: {}\n", "h.yaml:1: default: unknown key; the top level has `defaults` and `hosts`"),
    ("defaults:\n  checks: {gpu: {count: {phases: [prolog, later]}}}\n",
     "h.yaml:2: defaults.checks.gpu.count.phases: unknown phase 'later'"),
    ("defaults:\n  blame: {handle_in: [periodic, startup]}\n",
     "h.yaml:2: defaults.blame.handle_in: unknown phase 'startup'"),
    ("- a\n", "h.yaml: must be a mapping with `defaults` and/or `hosts`"),
])
def test_config_errors(text, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(text, "h.yaml")
    assert str(info.value).startswith(expected)


def test_config_ownership_rules(tmp_path):
    p = tmp_path / "health.yaml"
    p.write_text("defaults: {}\n")
    p.chmod(0o644)
    assert config.load_config(str(p)).path == p
    p.chmod(0o664)
    with pytest.raises(ConfigError, match="refused: group/world writable"):
        config.load_config(str(p))


def test_config_lookup_order(tmp_path, monkeypatch):
    beside = tmp_path / "slurmtools-health.yaml"
    beside.write_text("defaults: {}\n")
    monkeypatch.delenv(config_file.CONFIG_ENV, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert config_file.find_config_path() == beside
    monkeypatch.setenv(config_file.CONFIG_ENV, "/x/env.yaml")
    assert config_file.find_config_path() == Path("/x/env.yaml")
    assert config_file.find_config_path("/x/explicit.yaml") == Path("/x/explicit.yaml")


def test_example_config_in_etc_is_valid():
    text = (Path(__file__).resolve().parents[2] / "etc" / "health.yaml").read_text()
    c = parse_config(text, "etc/health.yaml")
    assert c.for_host("gpu001").checks.gpu.count.expected == 8


def test_status_severity_order_is_explicit():
    """Nagios numbers are not a severity: UNKNOWN (3) ranks above OK and below WARN, and only
    CRITICAL drains."""
    from slurmtools.health.model import SEVERITY, CheckResult, Status, worst

    assert SEVERITY == (Status.OK, Status.UNKNOWN, Status.WARN, Status.CRITICAL)
    assert [int(s) for s in (Status.OK, Status.WARN, Status.CRITICAL, Status.UNKNOWN)] == [0, 1, 2, 3]
    assert Status.OK.severity < Status.UNKNOWN.severity < Status.WARN.severity < Status.CRITICAL.severity

    def of(*statuses: Status) -> Status:
        return worst([CheckResult(f"c{i}", s, "") for i, s in enumerate(statuses)])

    assert of(Status.OK, Status.UNKNOWN) is Status.UNKNOWN
    assert of(Status.UNKNOWN, Status.WARN) is Status.WARN
    assert of(Status.UNKNOWN, Status.CRITICAL, Status.WARN) is Status.CRITICAL
    assert of() is Status.OK


def test_registry_names_every_check_once_and_filters_by_phase():
    from slurmtools.health import registry
    from slurmtools.health.config import Checks, GpuChecks, GpuProcesses, SystemChecks, SysDisk

    assert registry.names() == ["gpu.count", "gpu.ecc", "gpu.memory", "gpu.xid", "gpu.thermal", "gpu.pcie",
                                "gpu.nvlink", "gpu.processes", "ib.ports", "ib.counters", "ib.flap", "system.memory",
                                "system.disk", "system.mounts", "system.processes", "active.dcgm_diag",
                                "active.nccl_allreduce", "active.ib_write_bw"]
    checks = Checks(gpu=GpuChecks(processes=GpuProcesses(phases=["epilog"])),
                    system=SystemChecks(disk=SysDisk(enabled=False)))
    assert "gpu.processes" not in registry.enabled(checks, "prolog", "gpu")
    assert "gpu.processes" in registry.enabled(checks, "epilog", "gpu")
    assert registry.enabled(checks, "periodic", "system") == ["system.memory", "system.mounts", "system.processes"]
    # the active diagnostics run in their own phase only, the passive checks never in it
    assert registry.enabled(checks, "active", "active") == ["active.dcgm_diag", "active.nccl_allreduce",
                                                            "active.ib_write_bw"]
    assert registry.enabled(checks, "prolog", "active") == [] and registry.enabled(checks, "active", "gpu") == []


@pytest.mark.parametrize("fixture, phase, handle_in, handled", [
    ("h100-8gpu", "prolog", None, False),              # by default outside every job's prolog...
    ("h100-8gpu", "epilog", None, False),              # ...and epilog
    ("h100-8gpu", "periodic", None, True),             # the HealthCheckProgram's run
    ("h100-8gpu-ecc-uncorrected", "periodic", None, True),
    ("h100-8gpu", "prolog", ["prolog", "periodic"], True),          # where the admin chose it
    ("h100-8gpu-ecc-uncorrected", "prolog", ["prolog"], False),     # its own verdict first: the blames wait
])
def test_blames_are_handled_outside_the_prolog_unless_chosen_and_never_by_a_critical_one(
        tmp_path, monkeypatch, fixture, phase, handle_in, handled):
    """Issue 51, finding 6: blame handling ran inside every prolog, whatever the node's verdict; a
    kill at the shim's 60 s then turned a CRITICAL node into a pass, and every job's start waited on
    others' reports. Now the periodic run handles them (blame.handle_in), a prolog only where the
    admin chose it and never one that found its node CRITICAL; bounded by the run's time box (the
    deadline is handed to the spool's handling)."""
    asked = []
    monkeypatch.setattr(gate, "_handle_blames", lambda s, until=None: asked.append(until) or [])
    monkeypatch.setattr(gate, "_take_out_of_service", lambda *args: "drained")
    s = settings(tmp_path, probe=f"fixture:{fixture}", drain=True)
    if handle_in is not None:
        s = replace(s, blame=replace(s.blame, handle_in=handle_in))
    gate.run_phase(s, phase, "gpu001", job_id=None, allow_drain=True)
    assert bool(asked) is handled
    assert all(until is not None for until in asked)
