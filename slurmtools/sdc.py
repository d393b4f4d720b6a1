"""Silent-data-corruption canary: every rank recomputes one fixed reference batch on the current
weights and the ranks compare checksums of the result (logits and loss) with one all-gather.

Ranks of one job run the same code on the same weights and inputs, so they agree bit for bit; a
GPU that computes wrong numbers without raising an error disagrees. The ranks that differ from a
strict majority are named with their nodes (pure: `odd_ones`, `verdict`); without a strict
majority nothing is named, but training still stops: which side is right is unknown. The
trainer checks every `distributed.sdc_check_every` steps and before sealing any checkpoint, so a
corrupted state is never the newest complete checkpoint.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class Vote:
    rank: int
    host: str
    digest: str


@dataclass(frozen=True)
class Verdict:
    step: int
    odd_ranks: List[int]
    node: Optional[str]          # the one node every odd rank is on, when there is one
    detail: str


def odd_ones(votes: Sequence[Vote]) -> Optional[List[Vote]]:
    """The votes that differ from a strict majority ([] when all agree); None when no digest
    has a strict majority."""
    if not votes:
        return []
    digest, count = Counter(vote.digest for vote in votes).most_common(1)[0]
    if count == len(votes):
        return []
    if 2 * count <= len(votes):
        return None
    return [vote for vote in votes if vote.digest != digest]


def verdict(votes: Sequence[Vote], step: int) -> Optional[Verdict]:
    """None when every rank agrees; else what to record and whom to blame."""
    odd = odd_ones(votes)
    if odd == []:
        return None
    if odd is None:
        kinds = len({vote.digest for vote in votes})
        return Verdict(step, [], None, f"{kinds} different results of the reference batch among {len(votes)} "
                                       f"ranks at step {step}, no majority")
    hosts = sorted({vote.host for vote in odd})
    ranks = [vote.rank for vote in odd]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
    node = hosts[0] if len(hosts) == 1 else None
    where = f" on {node}" if node else f" on {','.join(hosts)}"
    return Verdict(step, ranks, node, f"{who}{where} disagree(s) with {len(votes) - len(odd)} of {len(votes)} "
                                      f"ranks on the reference batch at step {step}")
