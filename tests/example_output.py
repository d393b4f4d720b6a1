"""What the framework examples (examples/light, the HF Trainer's) say on their standard output,
read back by the unit and cluster tests alike."""
from __future__ import annotations

import re
from typing import List


def steps_said(out: str) -> List[int]:
    """The steps a framework example said, in order ("step N/..." lines)."""
    return [int(n) for n in re.findall(r"^step (\d+)/", out, re.M)]


def resumed_at(out: str) -> List[int]:
    """The steps a framework example said it resumed at ("resumed at step N" lines)."""
    return [int(n) for n in re.findall(r"^resumed at step (\d+)$", out, re.M)]
