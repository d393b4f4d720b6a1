"""Preflight decisions, pure: which devices computed wrong or slowly, which node's links are
slow, and the pair rounds that find it.

Links are measured pairwise around a ring of the nodes: every node is paired with both of
its neighbours, in disjoint pairs that run at the same time (2 rounds for an even count, 3
for an odd one, however many nodes), and a node's link figure is its best pair. A healthy
node has at least one healthy neighbour, so only a node whose every pair is slow falls
below the reference: the configured floor, or the median of the nodes' best pairs divided
by the slow factor (with 3 or more nodes; a pair alone cannot say which end is slow).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmtools.preflight.canary import REFERENCE, TOLERANCE, CanaryResult

# a finding's test -> its rank when one node fails several (the drain names the first)
TESTS = ("canary", "throughput", "busbw")


@dataclass(frozen=True)
class Settings:
    """What preflight compares against (from the job spec's preflight_* fields)."""
    budget_s: int
    slow_factor: float
    min_busbw_gbps: Optional[float] = None


@dataclass(frozen=True)
class LinkResult:
    """One all-reduce group's measurement."""
    nodes: Tuple[str, ...]
    busbw_gbps: float
    latency_us: float

    def to_json(self) -> Dict[str, Any]:
        return {"nodes": list(self.nodes), "busbw_gbps": round(self.busbw_gbps, 4),
                "latency_us": round(self.latency_us, 1)}


@dataclass(frozen=True)
class Finding:
    """A failed check; node None when the evidence names no single node (reported, not drained)."""
    test: str
    node: Optional[str]
    measured: str
    expected: str
    detail: str = ""

    def words(self) -> str:
        """The drain reason's detail: node=... measured=... expected=..."""
        return f"node={self.node} measured={self.measured} expected={self.expected}"

    def to_json(self) -> Dict[str, Any]:
        return {"test": self.test, "node": self.node, "measured": self.measured, "expected": self.expected,
                "detail": self.detail}


def _close(summary: Sequence[float], ref: Sequence[float], rtol: float) -> bool:
    scale = max(1.0, abs(ref[0]))
    return all(abs(a - b) <= rtol * scale for a, b in zip(summary, ref))


def judge_canary(results: Sequence[CanaryResult], size: int, chain: int, dtype: str = "float32") -> List[Finding]:
    """Wrong results: a device whose repetitions disagree, whose checksum differs from the
    majority of its kind, or (no majority) whose summaries miss the float64 reference."""
    findings: List[Finding] = []
    ref = REFERENCE.get((dtype, size, chain))
    rtol = TOLERANCE.get(dtype, 1e-3)
    for result in results:
        if not result.consistent:
            findings.append(Finding("canary", result.node, "unrepeatable", "same-checksum-every-time",
                                    f"rank {result.rank} {result.device}: repetitions gave different checksums"))
    kinds: Dict[str, List[CanaryResult]] = {}
    for result in results:
        kinds.setdefault(result.device_kind, []).append(result)
    for kind, members in sorted(kinds.items()):
        counts: Dict[str, int] = {}
        for member in members:
            counts[member.digest] = counts.get(member.digest, 0) + 1
        majority = max(counts.items(), key=lambda item: item[1])
        if majority[1] * 2 > len(members) and len(counts) > 1:
            for member in members:
                if member.digest != majority[0]:
                    findings.append(Finding("canary", member.node, f"sha256:{member.digest[:12]}",
                                            f"sha256:{majority[0][:12]}",
                                            f"rank {member.rank} {member.device} ({kind}) disagrees with "
                                            f"{majority[1]} of {len(members)} devices"))
            continue
        if ref is None:
            if len(counts) > 1:
                findings.append(Finding("canary", None, f"{len(counts)}-checksums", "one-checksum",
                                        f"{kind}: no majority and no reference for {dtype} {size}x{chain}"))
            continue
        off = [member for member in members if not _close(member.summary, ref, rtol)]
        if off and len(off) < len(members):
            for member in off:
                findings.append(Finding("canary", member.node, f"sum={member.summary[0]:.6g}", f"sum={ref[0]:.6g}",
                                        f"rank {member.rank} {member.device} ({kind}) misses the float64 "
                                        f"reference"))
        elif off or len(counts) > 1:
            what = (f"all {len(members)} devices agree but miss the float64 reference" if len(counts) == 1
                    else "devices disagree and no single one is to blame"
                    + (" (all miss the float64 reference)" if off else ""))
            findings.append(Finding("canary", None, f"{len(counts)}-checksums", "one-checksum", f"{kind}: {what}"))
    return findings


def judge_throughput(results: Sequence[CanaryResult], slow_factor: float) -> List[Finding]:
    """A device slower than the job's median device (of its kind) by slow_factor. When the slow
    devices sit on more than half of the job's nodes, the median says nothing about any one of
    them (the job's own load, or a slow kind): reported, no node named."""
    findings: List[Finding] = []
    kinds: Dict[str, List[CanaryResult]] = {}
    for result in results:
        kinds.setdefault(result.device_kind, []).append(result)
    for kind, members in sorted(kinds.items()):
        if len(members) < 2:
            continue
        median = statistics.median(member.gflops for member in members)
        floor = median / slow_factor
        slow = [member for member in members if member.gflops < floor]
        nodes = {member.node for member in members}
        slow_nodes = sorted({member.node for member in slow})
        if len(nodes) >= 2 and len(slow_nodes) * 2 > len(nodes):
            findings.append(Finding("throughput", None, f"{min(m.gflops for m in slow):.3g}GFLOP/s",
                                    f">={floor:.3g}GFLOP/s",
                                    f"{kind}: slow devices on {','.join(slow_nodes)}: too many to name one node"))
            continue
        for member in slow:
            findings.append(Finding("throughput", member.node, f"{member.gflops:.3g}GFLOP/s", f">={floor:.3g}GFLOP/s",
                                    f"rank {member.rank} {member.device}: {median / max(member.gflops, 1e-9):.1f}x "
                                    f"slower than the median device"))
    return findings


def fastest_of(first: Sequence[CanaryResult], second: Sequence[CanaryResult]) -> List[CanaryResult]:
    """Each device's faster timing of two (its checksums stay the first run's): a device is slow only
    when it is slow both times. A burst of the OS's or another process's work is not a slow device."""
    again = {(result.rank, result.device): result for result in second}
    out = []
    for result in first:
        other = again.get((result.rank, result.device))
        out.append(result if other is None or other.seconds >= result.seconds else replace(result, seconds=other.seconds))
    return out


def pair_rounds(nodes: Sequence[str]) -> List[List[Tuple[str, str]]]:
    """Rounds of disjoint neighbour pairs around the ring of nodes: every node meets both neighbours."""
    count = len(nodes)
    if count < 2:
        return []
    if count == 2:
        return [[(nodes[0], nodes[1])]]
    edges = [(nodes[i], nodes[(i + 1) % count]) for i in range(count)]
    if count % 2 == 0:
        return [edges[0::2], edges[1::2]]
    return [edges[0:count - 1:2], edges[1::2], [edges[-1]]]


def best_of(first: Sequence[LinkResult], second: Sequence[LinkResult]) -> List[LinkResult]:
    """Each group's better measurement of two (bandwidth up, latency down): a link is slow only when
    it is slow both times. A burst of another job's traffic or the OS's work is not a bad link."""
    again = {result.nodes: result for result in second}
    out = []
    for result in first:
        other = again.get(result.nodes)
        out.append(result if other is None else LinkResult(result.nodes, max(result.busbw_gbps, other.busbw_gbps),
                                                           min(result.latency_us, other.latency_us)))
    return out


def judge_links(nodes: Sequence[str], pairs: Sequence[LinkResult], ring: Optional[LinkResult],
                settings: Settings) -> List[Finding]:
    """Slow links named by node (see the module's doc); a slow ring no node explains is reported."""
    best: Dict[str, float] = {}
    for pair in pairs:
        for node in pair.nodes:
            best[node] = max(best.get(node, 0.0), pair.busbw_gbps)
    findings: List[Finding] = []
    if settings.min_busbw_gbps is not None:
        reference = settings.min_busbw_gbps
    elif len(best) >= 3:
        reference = statistics.median(best.values()) / settings.slow_factor
    else:
        reference = None
    if reference is not None:
        slow = sorted((node for node in best if best[node] < reference), key=list(nodes).index)
        if slow and len(best) >= 3 and len(slow) * 2 < len(best):
            for node in slow:
                findings.append(Finding("busbw", node, f"{best[node]:.3g}Gbps", f">={reference:.3g}Gbps",
                                        f"every pair with {node} is slow (best {best[node]:.3g} Gb/s)"))
        elif slow:
            findings.append(Finding("busbw", None, f"{min(best[node] for node in slow):.3g}Gbps",
                                    f">={reference:.3g}Gbps",
                                    f"slow pairs on {','.join(slow)}: too many to name one node"))
    if (ring is not None and settings.min_busbw_gbps is not None and ring.busbw_gbps < settings.min_busbw_gbps
            and not any(finding.test == "busbw" for finding in findings)):
        findings.append(Finding("busbw", None, f"{ring.busbw_gbps:.3g}Gbps", f">={settings.min_busbw_gbps:.3g}Gbps",
                                "the all-node ring is below the floor but no node's pairs are"))
    return findings


def named(findings: Sequence[Finding]) -> Dict[str, Finding]:
    """Each named node with its first finding in TESTS order (what its drain reason says)."""
    out: Dict[str, Finding] = {}
    for finding in sorted(findings, key=lambda f: TESTS.index(f.test) if f.test in TESTS else len(TESTS)):
        if finding.node is not None and finding.node not in out:
            out[finding.node] = finding
    return out
