"""A unit test's rank processes (`python -c SCRIPT`) import torch first with the garbage collector
paused, as the reference trainer's ranks do (slurmtools/common/import_pause.py): a fifth less CPU a
rank, and the suite starts hundreds of them. `fsdp=True` also imports torch._dynamo, which an FSDP2
model's first forward imports anyway (with the collector running, there)."""
from __future__ import annotations

import sys
from typing import List


def paused_imports(fsdp: bool) -> str:
    """The lines a rank script starts with: torch's import under collector_paused."""
    modules = "torch, torch.distributed" + (", torch._dynamo" if fsdp else "")
    return ("from slurmtools.common.import_pause import collector_paused\n"
            f"with collector_paused():\n    import {modules}\n")


def rank_argv(script: str, *args: str, fsdp: bool = False) -> List[str]:
    """The command line of one rank running `script` with `args` (its sys.argv[1:])."""
    return [sys.executable, "-c", paused_imports(fsdp) + script, *args]
