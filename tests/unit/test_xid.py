"""XID policy: every code of NVIDIA's XID catalogue (1-172) held to its action, the message-
dependent NVLink5 (144-150) and recovery-action (154) codes, overrides, and the requeue policy."""
from __future__ import annotations

from typing import List, Tuple

import pytest

from slurmtools.common import xid


def _spans(*spans: Tuple[int, int]) -> List[int]:
    return [code for low, high in spans for code in range(low, high + 1)]


# the catalogue's "immediate action" column read as our actions (CONTACT_SUPPORT, CHECK_MECHANICALS,
# UPDATE_SWFW -> drain; RESET_GPU, RESTART_BM/VM and the XID 48 / NVLink workflows -> reboot;
# RESTART_APP, CHECK_UVM, the XID 45 workflow -> restart_app; IGNORE -> ignore), written out
# independently of slurmtools/common/xid.py's table
EXPECTED = {
    "drain": _spans((1, 7), (9, 10), (12, 12), (15, 24), (26, 30), (33, 36), (42, 42), (47, 47), (49, 59), (61, 61),
                    (65, 65), (73, 73), (78, 78), (81, 81), (87, 87), (90, 91), (111, 118), (122, 125), (138, 138),
                    (142, 142), (165, 165), (168, 168)),
    "reboot": [46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158, 167, 169, 171, 172],
    "restart_app": _spans((8, 8), (11, 11), (13, 13), (25, 25), (31, 32), (39, 41), (45, 45), (60, 60), (68, 72),
                          (75, 77), (80, 80), (82, 86), (88, 89), (94, 94), (96, 105), (126, 135), (139, 139),
                          (159, 159), (166, 166)),
    "ignore": _spans((14, 14), (37, 38), (43, 44), (63, 63), (66, 67), (92, 93), (106, 108), (121, 121), (137, 137),
                     (141, 141), (152, 153), (157, 157), (160, 164), (170, 170)),
}
BY_MESSAGE = _spans((144, 150)) + [154]


def test_the_catalogue_lists_every_code_from_1_to_172_once():
    assert sorted(xid.CATALOGUE) == list(range(1, 173))
    listed = sorted(code for codes in EXPECTED.values() for code in codes) + BY_MESSAGE
    assert sorted(listed) == list(range(1, 173))


@pytest.mark.parametrize("action", sorted(EXPECTED))
def test_every_catalogue_code_has_its_action(action):
    wrong = {code: xid.default_action(code) for code in EXPECTED[action] if xid.default_action(code) != action}
    assert wrong == {}


@pytest.mark.parametrize("code,action", [(46, "reboot"), (63, "ignore"), (92, "ignore"), (94, "restart_app"),
                                         (69, "restart_app"), (61, "drain"), (79, "reboot"), (48, "reboot")])
def test_the_codes_the_fleet_replay_found_misjudged(code, action):
    assert xid.default_action(code) == action


@pytest.mark.parametrize("message,action", [
    ("NVRM: Xid (PCI:0008:06:00): 145, RLW_REMAP Nonfatal XC0 i0 Link -1 (0x00000001 0x0 0x0)", "ignore"),
    ("NVRM: Xid (PCI:0008:06:00): 144, SAW_MVB Non-fatal XC0 i0 Link 04 (0x00000004 0x0)", "ignore"),
    ("NVRM: Xid (PCI:0008:06:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x004505c6 0x0)", "reboot"),
    ("NVRM: Xid (PCI:0008:06:00): 147, TREX (0x00000002)", "drain"),     # says neither: cannot judge
])
def test_nvlink5_follows_the_severity_in_the_message(message, action):
    code = xid.xid_codes(message)[0]
    assert xid.default_action(code, message) == action


@pytest.mark.parametrize("named,action", [("None", "ignore"), ("GPU Reset Required", "reboot"),
                                          ("Node Reboot Required", "reboot"), ("Drain P2P", "drain"),
                                          ("Drain and Reset", "reboot"), ("Something New", "drain")])
def test_xid_154_follows_the_recovery_action_it_names(named, action):
    message = f"NVRM: Xid (PCI:0000:1b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 ({named})"
    assert xid.default_action(154, message) == action
    assert xid.default_action(154, "NVRM: Xid (PCI:0000:1b:00): 154, garbled") == "drain"


def test_a_code_the_catalogue_does_not_list_drains_and_overrides_win():
    assert xid.default_action(173) == "drain" and xid.default_action(999) == "drain"
    assert xid.action(79, "", {79: "ignore"}) == "ignore" and xid.action(94, "", {79: "ignore"}) == "restart_app"
    assert xid.check_overrides([(79, "drain"), (94, "ignore")]) is None
    assert xid.check_overrides([(0, "drain")]) == "XID 0 is out of range (1-999)"
    assert xid.check_overrides([(79, "rma")]) == "XID 79: unknown action 'rma'; actions are drain, reboot, restart_app, ignore"


def test_the_requeue_policy_blames_the_node_only_for_node_class_xids():
    log = ("NVRM: Xid (PCI:0000:1b:00): 94, pid=1, Contained memory error\n"
           "NVRM: Xid (PCI:0000:1b:00): 63, pid=1, Row Remapper: New row marked\n")
    assert xid.node_fault_xids(log) == []
    log += "NVRM: Xid (PCI:0000:1b:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04\nNVRM: Xid (PCI:0000:1b:00): 79, off the bus\n"
    assert xid.node_fault_xids(log) == [149, 79]
