"""The cyclic garbage collector paused while a rank imports torch.

torch's import (with FSDP2, DCP and torch._dynamo, which a first fully_shard imports) makes
hundreds of thousands of objects, and the collector's passes over them while they are made cost
about a fifth of that import's CPU (measured on a 2-core machine: 5.0 CPU-s with the collector on,
4.0 with it paused). Each rank of a job pays the import at every start, a replacement's too: a
relaunch at thousands of ranks pays it thousands of times over. After the imports the objects are
frozen out of the collector's generations (gc.freeze: they live as long as the process anyway), so
later full passes of the training loop do not walk them either.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block (a process's heavy imports) with the collector off; freeze what it made and
    turn the collector back on as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
