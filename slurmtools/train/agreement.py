"""Every rank acts on a checkpoint request at the same step: one small all-reduce MAX.

A request (the warning, a straggler swap) reaches each rank's control dir at a different moment;
ranks that saved or stopped at different steps would deadlock in the save's collectives. `agree`
asks every step; `RequestAgreement` asks about every `interval_s` (the framework adapters: a
gloo all-reduce after a step costs ~1 ms, 1% of a 100-ms step) and in the same all-reduce the
ranks agree on the step of the next check, so the request is acted on within about interval_s.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

MAX_STEPS_BETWEEN_CHECKS = 50       # a request waits at most this many steps, however short they are


def all_ranks_max(values: Sequence[int]) -> List[int]:
    """The element-wise maximum over all ranks (the values themselves without torch.distributed)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return list(values)
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(value) for value in tensor.tolist()]


def barrier() -> None:
    """Every rank here before any goes on; nothing without torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def agree(flag: bool) -> bool:
    """True on every rank if it is true on any rank; the plain flag without torch.distributed."""
    return bool(all_ranks_max([1 if flag else 0])[0])


def steps_until_next_check(step_s: float, interval_s: float) -> int:
    """How many steps of step_s fit in interval_s: at least 1, at most MAX_STEPS_BETWEEN_CHECKS."""
    if not step_s > 0 or not math.isfinite(step_s):
        return 1
    return max(1, min(MAX_STEPS_BETWEEN_CHECKS, int(interval_s / step_s)))


class RequestAgreement:
    """`check(step, requested, step_s)` on every rank after every step: True on all ranks at the
    same step once any rank was asked. Ranks must call it with the same step numbers."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.next_check_step: Optional[int] = None          # the first call checks

    def check(self, step: int, requested: bool, step_s: float) -> bool:
        """Whether every rank checkpoints now, after step (requested: this rank's own view; step_s:
        the step's time, which spaces the collective out to about every interval_s)."""
        if self.next_check_step is not None and step < self.next_check_step:
            return False
        proposal = step + steps_until_next_check(step_s, self.interval_s)
        # MAX of the negated proposals is the earliest one: every rank checks again at the same step
        any_requested, earliest_negated = all_ranks_max([1 if requested else 0, -proposal])
        self.next_check_step = -earliest_negated
        return bool(any_requested)
