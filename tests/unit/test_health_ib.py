"""InfiniBand verdicts on an 8-HCA NDR tree laid out as the kernel lays out /sys: identity (names,
PCI slots, firmware), netdev state, INIT grace, every failing port named, flaps and rates."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmtools.health import config, kmsg, sysfs
from slurmtools.health import remedy
from slurmtools.health.checks import ib
from slurmtools.health.fixture_data import IB_FW_VER, IB_PCI_SLOTS, write_ib_tree
from slurmtools.health.model import CheckResult, Status

EIGHT = [f"mlx5_{i}" for i in range(8)]


def ports_of(root: Path, **tree):
    write_ib_tree(root, 8, **tree)
    return sysfs.read_ib_ports(root)


def test_the_tree_is_the_kernels_layout_and_the_reader_follows_it(tmp_path):
    ports = ports_of(tmp_path)
    link = tmp_path / "sys/class/infiniband/mlx5_2"
    assert os.readlink(link) == "../../devices/pci0000:00/0000:4d:00.0/infiniband/mlx5_2"
    assert os.readlink(tmp_path / "sys/class/net/ibp77s0") == "../../devices/pci0000:00/0000:4d:00.0/net/ibp77s0"
    assert [(p.key, p.pci_slot, p.fw_ver, p.netdevs) for p in ports[:2]] == [
        ("mlx5_0/1", IB_PCI_SLOTS[0], IB_FW_VER, (("ibp26s0", "up"),)),
        ("mlx5_1/1", IB_PCI_SLOTS[1], IB_FW_VER, (("ibp60s0", "up"),))]
    ok = ib.check_ports(config.IbPorts(expected_hcas=EIGHT, fw_ver=IB_FW_VER, min_rate_gbps=400,
                                       hca_pci_slots=dict(zip(EIGHT, IB_PCI_SLOTS))), ports)
    assert (ok.status, ok.summary) == (Status.OK, "8 ports active")


def test_an_active_port_whose_netdev_is_down_is_critical(tmp_path):
    r = ib.check_ports(config.IbPorts(), ports_of(tmp_path, faults=["netdev-down"], bad=[1, 6]))
    assert (r.status, r.summary) == (Status.CRITICAL, "ports=mlx5_1/1,mlx5_6/1 netdev_operstate=down")
    assert ib.check_ports(config.IbPorts(check_netdev=False), ports_of(tmp_path)).status is Status.OK


def test_an_hca_under_the_wrong_name_is_missing_and_unexpected(tmp_path):
    r = ib.check_ports(config.IbPorts(expected_hcas=EIGHT), ports_of(tmp_path, names={2: "mlx5_12"}))
    assert (r.status, r.summary) == (Status.CRITICAL, "hcas=mlx5_2 missing; hcas=mlx5_12 unexpected")
    assert r.details["failing"] == [{"what": "mlx5_2", "problem": "missing", "status": "CRITICAL"},
                                    {"what": "mlx5_12", "problem": "unexpected", "status": "CRITICAL"}]


def test_an_hca_in_the_wrong_pci_slot_or_with_other_firmware_is_critical(tmp_path):
    slots = dict(zip(EIGHT, IB_PCI_SLOTS))
    slots["mlx5_0"], slots["mlx5_1"] = slots["mlx5_1"], slots["mlx5_0"]
    r = ib.check_ports(config.IbPorts(hca_pci_slots=slots), ports_of(tmp_path))
    assert r.summary == "hcas=mlx5_0 pci=0000:1a:00.0 expected=0000:3c:00.0; hcas=mlx5_1 pci=0000:3c:00.0 expected=0000:1a:00.0"
    r = ib.check_ports(config.IbPorts(fw_ver="28.40.1000"), ports_of(tmp_path))
    assert r.summary == "hcas=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,+2 fw=28.39.1002 expected=28.40.1000"
    assert len(r.details["failing"]) == 8


def test_three_ports_down_are_all_named(tmp_path):
    r = ib.check_ports(config.IbPorts(), ports_of(tmp_path, faults=["port-down"], bad=[2, 5, 6]))
    assert (r.status, r.summary) == (Status.CRITICAL, "ports=mlx5_2/1,mlx5_5/1,mlx5_6/1 state=DOWN phys_state=Disabled")
    assert [f["what"] for f in r.details["failing"]] == ["mlx5_2/1", "mlx5_5/1", "mlx5_6/1"]


def test_a_port_in_init_warns_then_is_critical_after_the_grace(tmp_path):
    ports = ports_of(tmp_path, faults=["init"], bad=[4])
    params = config.IbPorts(init_grace_s=300)
    first_seen = ib.init_since_now(ports, {}, 1000.0)
    assert first_seen == {"mlx5_4/1": 1000.0}
    r = ib.check_ports(params, ports, {}, 1000.0)
    assert (r.status, r.summary) == (Status.WARN, "ports=mlx5_4/1 state=INIT")
    assert ib.check_ports(params, ports, first_seen, 1299.0).status is Status.WARN
    r = ib.check_ports(params, ports, ib.init_since_now(ports, first_seen, 1300.0), 1300.0)
    assert (r.status, r.summary) == (Status.CRITICAL, "ports=mlx5_4/1 state=INIT for 300s")
    assert ib.init_since_now(ports_of(tmp_path), first_seen, 1400.0) == {}     # ACTIVE again: forgotten


def test_a_long_list_is_summarised_within_the_reason_limit():
    problems = [ib.Problem(f"mlx5_{i}/1", f"state=DOWN{i % 3}", Status.CRITICAL) for i in range(40)]
    text = ib.summarise(problems)
    assert len(text) <= ib.MAX_SUMMARY_CHARS and text.endswith("...")
    assert text.startswith("ports=mlx5_0/1,mlx5_3/1,mlx5_6/1,mlx5_9/1,mlx5_12/1,mlx5_15/1,+8 state=DOWN0; ")


def _flap(tmp_path, counters, elapsed_s, kernel=0, params=config.IbFlap(), faults=(), bad=()):
    before = ib.counter_state(ports_of(tmp_path))
    return ib.check_flap(params, ports_of(tmp_path, counters=counters, faults=faults, bad=bad), before, elapsed_s,
                         kernel)


def test_link_flaps_warn_and_are_critical_past_the_hourly_count(tmp_path):
    assert _flap(tmp_path, {}, 60).status is Status.OK
    r = _flap(tmp_path, {}, 600, faults=["link-downed"], bad=[3])
    assert (r.status, r.summary) == (Status.WARN, "flaps=1 (1/h) ports=mlx5_3/1x1")
    r = _flap(tmp_path, {"link_error_recovery": 1}, 600, kernel=1, faults=["link-downed"], bad=[3])
    assert (r.status, r.summary) == (Status.CRITICAL, "flaps=9 (9/h) ports=mlx5_0/1x1,mlx5_1/1x1,mlx5_2/1x1,"
                                                      "mlx5_3/1x2,mlx5_4/1x1,mlx5_5/1x1 kernel_link_down=1")
    r = _flap(tmp_path, {}, 600, kernel=2)
    assert (r.status, r.summary) == (Status.WARN, "flaps=2 (2/h) ports=? kernel_link_down=2")
    r = _flap(tmp_path, {}, 600, kernel=4)
    assert (r.status, r.details["per_hour"]) == (Status.CRITICAL, 4.0)
    # the same four flaps over four hours are one an hour
    assert _flap(tmp_path, {}, 4 * 3600, kernel=4).status is Status.WARN


def test_error_counters_are_judged_per_hour(tmp_path):
    before = ib.counter_state(ports_of(tmp_path))
    grown = ports_of(tmp_path, counters={"symbol_error": 40})
    params = config.IbCounters(warn_increase=10, critical_increase=1000)
    assert ib.check_counters(params, grown, before, 600).summary.endswith("symbol_error=40/h")
    assert ib.check_counters(params, grown, before, 8 * 3600).status is Status.OK      # 5/h
    reset = ports_of(tmp_path, counters={"symbol_error": 3})
    assert ib.check_counters(params, reset, {k: {"symbol_error": 40} for k in before}, 60).status is Status.OK


def test_mlx5_link_down_lines_in_the_kernel_log_count_once_each():
    records = kmsg.parse_records(["6,10,1,-;mlx5_core 0000:1a:00.0 ibp26s0: Link down\n",
                                  "6,11,2,-;mlx5_core 0000:1a:00.0 ibp26s0: Link up\n",
                                  "6,12,3,-;e1000e 0000:00:1f.6 eno1: Link down\n",
                                  "6,13,4,-;mlx5_ib: mlx5_ib_event:3013:(pid 0): port 1 link down\n"])
    assert kmsg.link_down_count(records, -1) == 2 and kmsg.link_down_count(records, 10) == 1


def _critical(remedy_mark=None):
    return CheckResult("gpu.xid", Status.CRITICAL, "xid=79", {"remedy": remedy_mark} if remedy_mark else {})


def test_remedy_reboots_a_reset_class_node_a_bounded_number_of_times():
    day = remedy.DAY_S
    assert remedy.decide([_critical("reboot")], [], 1000.0, 1).action == "reboot"
    again = remedy.decide([_critical("reboot")], [1000.0], 1500.0, 1)
    assert (again.action, again.why) == ("drain", "reset-class fault again after 1 reboot(s) in 24 h "
                                                  "(max_reboots_per_day=1): a person must look")
    assert remedy.decide([_critical("reboot")], [1000.0], 1000.0 + day, 1).action == "reboot"
    assert remedy.decide([_critical("reboot"), _critical()], [], 1000.0, 1).action == "drain"
    assert remedy.decide([_critical("reboot")], [], 1000.0, 0).action == "drain"
    assert remedy.recent([1.0, 5000.0, 90000.0], 90001.0) == [5000.0, 90000.0]


@pytest.mark.parametrize("fault", ["bogus"])
def test_an_unknown_fixture_fault_is_an_error(tmp_path, fault):
    with pytest.raises(ValueError, match="unknown IB fault"):
        write_ib_tree(tmp_path, 1, faults=[fault])


def test_record_ib_copies_a_tree_that_reads_back_the_same(tmp_path):
    import subprocess
    import sys
    node = write_ib_tree(tmp_path / "node", 8, faults=["netdev-down", "init"], bad=[5])
    (node / "sys/devices/pci0000:00/0000:1a:00.0/infiniband/mlx5_0/ports/1/counters/unreadable").mkdir()
    out = tmp_path / "recorded"
    done = subprocess.run([sys.executable, "-m", "slurmtools", "health", "record-ib", "--sysfs-root", str(node),
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("recorded 8 HCAs (mlx5_0, mlx5_1,")
    assert sysfs.read_ib_ports(out) == sysfs.read_ib_ports(node)
    for link in (out / "sys/class/infiniband").iterdir():
        assert not os.readlink(link).startswith("/") and link.resolve().is_relative_to(out.resolve())
    again = subprocess.run([sys.executable, "-m", "slurmtools", "health", "record-ib", "--sysfs-root", str(node),
                            "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stderr.strip()) == (2, f"slurmtools: error: --out {out}: not empty "
                                                           "(a recording goes into a new directory)")
    (tmp_path / "a-file").write_text("x")
    onto_file = subprocess.run([sys.executable, "-m", "slurmtools", "health", "record-ib", "--sysfs-root", str(node),
                                "--out", str(tmp_path / "a-file")], capture_output=True, text=True, timeout=60)
    assert (onto_file.returncode, onto_file.stderr.strip()) == (
        2, f"slurmtools: error: --out {tmp_path}/a-file: not a directory")
    none = subprocess.run([sys.executable, "-m", "slurmtools", "health", "record-ib", "--sysfs-root",
                           str(tmp_path / "empty"), "--out", str(tmp_path / "o2")], capture_output=True, text=True)
    assert (none.returncode, none.stderr.strip()) == (
        2, f"slurmtools: error: no InfiniBand devices under {tmp_path}/empty/sys/class/infiniband")
