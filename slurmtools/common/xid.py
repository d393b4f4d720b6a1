"""NVIDIA XID codes and what each one asks of the node: policy as data, one source.

Shared by the health checks (a kernel-log XID drains, reboots or only warns) and the requeue
policy (an XID in a failed job's output blames its node only when it is the hardware's fault).

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer GPUs),
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the "Resolution Bucket
(Immediate Action)" column for XIDs 1-172 and the "XID 144-150 Decode" sheet, as published in
2025-10 and read for this table on 2026-11-30. CATALOGUE below is that column verbatim; the
mapping to our four actions is ACTION_OF_BUCKET. Codes 162-172 have an empty column in that
edition: their actions (BLANK_IN_CATALOGUE) are ours, from the catalogue's descriptions.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

# our actions, mildest last
DRAIN = "drain"              # hardware suspect: out of service until a person looks
REBOOT = "reboot"            # a GPU reset / node reboot clears it: reboot, then back into service
RESTART_APP = "restart_app"  # the job's own fault: the job restarts, the node stays in service
IGNORE = "ignore"            # informational
ACTIONS = (DRAIN, REBOOT, RESTART_APP, IGNORE)
NODE_ACTIONS = frozenset({DRAIN, REBOOT})   # the node, not the job, is at fault


def _codes(*spans: Tuple[int, int]) -> List[int]:
    return [code for low, high in spans for code in range(low, high + 1)]


_BUCKETS: Dict[str, List[int]] = {
    "CONTACT_SUPPORT": _codes((1, 7), (9, 10), (12, 12), (15, 24), (26, 30), (33, 36), (42, 42), (47, 47),
                              (49, 53), (55, 59), (61, 61), (65, 65), (73, 73), (81, 81), (87, 87), (90, 91),
                              (111, 118), (122, 125), (138, 138), (142, 142)),
    "RESTART_APP": _codes((8, 8), (11, 11), (13, 13), (25, 25), (31, 32), (39, 41), (60, 60), (68, 72), (75, 77),
                          (80, 80), (82, 86), (88, 89), (94, 94), (96, 105), (126, 135), (139, 139)),
    "IGNORE": _codes((14, 14), (37, 38), (43, 44), (63, 63), (66, 67), (92, 93), (106, 108), (121, 121), (137, 137),
                     (141, 141), (152, 153), (157, 157), (160, 161)),
    "RESET_GPU": _codes((46, 46), (62, 62), (64, 64), (95, 95), (109, 110), (119, 120), (136, 136), (140, 140),
                        (143, 143), (155, 156), (158, 158)),
    "WORKFLOW_XID_45": [45], "WORKFLOW_XID_48": [48], "CHECK_MECHANICALS": [54], "WORKFLOW_NVLINK_ERR": [74],
    "UPDATE_SWFW": [78], "RESTART_BM": [79], "WORKFLOW_NVLINK5_ERR": _codes((144, 150)), "RESTART_VM": [151],
    "XID_154": [154], "CHECK_UVM": [159], "": _codes((162, 172)),
}
CATALOGUE: Dict[int, str] = {code: bucket for bucket, codes in _BUCKETS.items() for code in codes}

ACTION_OF_BUCKET: Dict[str, str] = {
    "CONTACT_SUPPORT": DRAIN, "CHECK_MECHANICALS": DRAIN, "UPDATE_SWFW": DRAIN,
    "RESET_GPU": REBOOT, "RESTART_BM": REBOOT, "RESTART_VM": REBOOT,
    "WORKFLOW_XID_48": REBOOT,        # double-bit ECC: the row remap it triggers applies on reset
    "WORKFLOW_NVLINK_ERR": REBOOT,    # Hopper NVLink: most register patterns resolve by GPU reset
    "RESTART_APP": RESTART_APP, "CHECK_UVM": RESTART_APP,
    "WORKFLOW_XID_45": RESTART_APP,   # preemptive cleanup after another XID, which is judged itself
    "IGNORE": IGNORE,
}
# the empty column of 162-172: power-smoothing notices are informational, its lifetime exhausted
# is hardware; a PCIe fatal timeout or a micro-controller halt is reset-class (as XID 62);
# reduced memory capacity is hardware; the DRAM/SRAM details of an XID 48 follow XID 48
BLANK_IN_CATALOGUE: Dict[int, str] = {162: IGNORE, 163: IGNORE, 164: IGNORE, 165: DRAIN, 166: RESTART_APP,
                                      167: REBOOT, 168: DRAIN, 169: REBOOT, 170: IGNORE, 171: REBOOT, 172: REBOOT}

# NVLink5 (144-150): the decode sheet gives each rule a severity; the driver prints it in the
# message ("NETIR_LINK_EVT Fatal XC0 ..." / "RLW_REMAP Nonfatal ..."). Non-fatal rules are IGNORE,
# fatal ones RESET_GPU; a message that says neither cannot be judged and drains.
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)
_FATAL = re.compile(r"\bfatal\b", re.IGNORECASE)
# XID 154 names the recovery action NVML now wants: "... changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_RECOVERY = re.compile(r"\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")
RECOVERY_ACTIONS: Dict[str, str] = {"none": IGNORE, "gpu reset required": REBOOT, "node reboot required": REBOOT,
                                    "drain and reset": REBOOT, "drain p2p": DRAIN}

# the kernel's log line: "NVRM: Xid (PCI:0000:1b:00): 79, pid=..., GPU has fallen off the bus"
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")


def default_action(code: int, message: str = "") -> str:
    """The catalogue's action for one XID event (its message decides 144-150 and 154); an XID
    the catalogue does not list drains: new codes appear with new drivers and hardware."""
    bucket = CATALOGUE.get(code)
    if bucket is None:
        return DRAIN
    if bucket == "WORKFLOW_NVLINK5_ERR":
        if _NONFATAL.search(message):
            return IGNORE
        return REBOOT if _FATAL.search(message) else DRAIN
    if bucket == "XID_154":
        match = _RECOVERY.search(message)
        return RECOVERY_ACTIONS.get(match.group(1).strip().lower(), DRAIN) if match else DRAIN
    if bucket == "":
        return BLANK_IN_CATALOGUE[code]
    return ACTION_OF_BUCKET[bucket]


def action(code: int, message: str = "", overrides: Optional[Mapping[int, str]] = None) -> str:
    """The action for one XID event: the admin's override for the code, else the catalogue's."""
    if overrides and code in overrides:
        return overrides[code]
    return default_action(code, message)


def xid_codes(text: str) -> List[int]:
    """Every XID code in text, in order."""
    return [int(match.group(2)) for match in XID_LINE.finditer(text)]


def node_fault_xids(text: str, overrides: Optional[Mapping[int, str]] = None) -> List[int]:
    """The XIDs in text (a job's output or a kernel log) that put the node at fault (drain or
    reboot), each judged with its own line's message."""
    found = []
    for line in text.splitlines():
        for match in XID_LINE.finditer(line):
            if action(int(match.group(2)), line, overrides) in NODE_ACTIONS:
                found.append(int(match.group(2)))
    return found


def check_overrides(overrides: Iterable[Tuple[int, str]]) -> Optional[str]:
    """Why an admin's per-code table is invalid, or None."""
    for code, chosen in overrides:
        if not 1 <= code <= 999:
            return f"XID {code} is out of range (1-999)"
        if chosen not in ACTIONS:
            return f"XID {code}: unknown action {chosen!r}; actions are {', '.join(ACTIONS)}"
    return None
