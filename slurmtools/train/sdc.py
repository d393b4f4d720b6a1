"""Silent-data-corruption canary: every rank recomputes one fixed reference batch on the current
weights and the ranks compare checksums of the result (logits and loss) with one all-gather.

Ranks of one job run the same code on the same weights and inputs, so they agree bit for bit; a
GPU that computes wrong numbers without raising an error disagrees. The ranks that differ from a
strict majority are named with their nodes, on one node or several (pure: `odd_ones`, `verdict`).
Without a strict majority (1 rank against 1, a node-wide fault on a 2-node job, 4 against 4) the
checksums cannot say which side is right: every rank then runs the device canary of preflight,
whose result has a float64 reference, and the nodes whose devices miss it are named
(`by_reference`); training stops either way. The trainer checks every `distributed.sdc_check_every` steps and before sealing any checkpoint, so a
corrupted state is never the newest complete checkpoint.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Vote:
    rank: int
    host: str
    digest: str


@dataclass(frozen=True)
class Verdict:
    step: int
    odd_ranks: List[int]
    node: Optional[str]          # the first node to blame (None: nobody)
    detail: str
    nodes: Tuple[str, ...] = ()  # every node to blame, node first


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
    return Verdict(step, ranks, hosts[0], f"{who} on {','.join(hosts)} disagree(s) with {len(votes) - len(odd)} of "
                                          f"{len(votes)} ranks on the reference batch at step {step}", tuple(hosts))


def by_reference(found: Verdict, votes: Sequence[Vote], off_nodes: Sequence[str]) -> Verdict:
    """A verdict without a majority, decided by the device canary's float64 reference: the nodes
    whose devices missed it (off_nodes) are named; none missed it: still nobody."""
    nodes = sorted(set(off_nodes))
    if found.odd_ranks or not nodes:
        return found
    ranks = [vote.rank for vote in votes if vote.host in nodes]
    return Verdict(found.step, ranks, nodes[0], f"{found.detail}; the device canary on {','.join(nodes)} misses "
                                                f"the float64 reference", tuple(nodes))
