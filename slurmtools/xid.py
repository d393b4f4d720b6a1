"""NVIDIA XID codes: which ones mean the node's hardware needs a reset, reboot or RMA.

Data, not code, shared by the health checks (kernel-log XIDs drain a node) and the requeue
policy (an XID in a failed job's output blames its node). Extend the tables here only.
"""
from __future__ import annotations

import re
from typing import List

# XIDs whose recovery action is a GPU reset / node reboot / RMA (fatal for the node)
FATAL_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 69, 74, 79, 92, 94, 95, 109, 110, 119, 120, 136, 140,
                        143, 144, 145, 146, 147, 148, 149, 150, 151, 154, 155, 156, 158})
# application-level XIDs (the job's own fault, page faults): reported, never drained
MONITOR_XIDS = frozenset({13, 31, 32, 38, 43, 45, 61, 68, 121, 137})

# the kernel's log line: "NVRM: Xid (PCI:0000:1b:00): 79, pid=..., GPU has fallen off the bus"
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")


def xid_codes(text: str) -> List[int]:
    """Every XID code in text, in order."""
    return [int(match.group(2)) for match in XID_LINE.finditer(text)]
