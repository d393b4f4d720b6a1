"""Active diagnostics: the outputs of `dcgmi diag -j`, nccl-tests' `all_reduce_perf` and
perftest's `ib_write_bw`, parsed and judged into the same results as the passive checks. Pure.

The formats, as those tools document them:
- `dcgmi diag --run N --json`: an object under "DCGM GPU Diagnostic" (DCGM 2/3) or "DCGM
  Diagnostic" (DCGM 4) with "test_categories": [{"category", "tests": [{"name", "results":
  [{"status": "Pass"|"Fail"|"Warn"|"Skip"|..., "gpu_ids" or "entity_id", "warnings"/"errors":
  [{"warning"/"message", "error_id", ...}], "info"}]}]}]. NVIDIA publishes no stable schema
  (release-pin it): a shape this parser does not know is UNKNOWN, never a pass.
- `all_reduce_perf`: a table with one row per size: size count type redop root, then time,
  algbw, busbw and #wrong for out-of-place and again for in-place; "# Out of bounds values : N
  OK|FAILED" and "# Avg bus bandwidth : X" at the end. Any #wrong is corrupted data.
- `ib_write_bw`: a table under "#bytes #iterations BW peak[...] BW average[...] MsgRate[Mpps]",
  the unit in the header: Gb/sec with --report_gbits, else MB/sec (2^20 bytes).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from slurmtools.health import config
from slurmtools.health.model import CheckResult, Status

DCGM_ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
_DCGM_STATUS = {"pass": Status.OK, "skip": Status.OK, "not run": Status.OK, "warn": Status.WARN,
                "warning": Status.WARN, "fail": Status.CRITICAL}


class ParseError(ValueError):
    """The tool's output is not in a format this parser knows."""


# ---- dcgmi diag ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DcgmFinding:
    category: str
    test: str
    gpu: str               # the GPU's id, or "" for a system-wide test
    status: str            # as DCGM wrote it
    message: str


def parse_dcgm_diag(text: str) -> List[DcgmFinding]:
    """Every (test, entity) result of a `dcgmi diag -j` run."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"not JSON ({exc})") from None
    root = next((data[key] for key in DCGM_ROOTS if isinstance(data, dict) and key in data), None)
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise ParseError(f"no {' or '.join(repr(k) for k in DCGM_ROOTS)} object with test_categories")
    findings = []
    for category in root["test_categories"]:
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            raise ParseError("a test category without a list of tests")
        for test in category["tests"]:
            if not isinstance(test, dict) or not isinstance(test.get("results"), list):
                raise ParseError("a test without a list of results")
            for result in test["results"]:
                if not isinstance(result, dict) or not isinstance(result.get("status"), str):
                    raise ParseError(f"a result of {test.get('name')!r} without a status")
                findings.append(DcgmFinding(str(category.get("category", "")), str(test.get("name", "")),
                                            _dcgm_entity(result), result["status"], _dcgm_message(result)))
    if not findings:
        raise ParseError("no results")
    return findings


def _dcgm_entity(result: Dict[str, Any]) -> str:
    for key in ("gpu_ids", "entity_id", "gpu_id"):
        if key in result:
            return str(result[key])
    return ""


def _dcgm_message(result: Dict[str, Any]) -> str:
    for key in ("warnings", "errors"):
        items = result.get(key)
        if isinstance(items, list) and items:
            first = items[0]
            if isinstance(first, dict):
                return str(first.get("warning") or first.get("message") or first.get("error") or "")
            return str(first)
    return str(result.get("info") or "")


def check_dcgm_diag(params: config.ActiveDcgmDiag, findings: List[DcgmFinding]) -> CheckResult:
    graded: List[Tuple[Status, DcgmFinding]] = []
    for finding in findings:
        status = _DCGM_STATUS.get(finding.status.strip().lower())
        if status is None:
            return CheckResult("active.dcgm_diag", Status.UNKNOWN,
                               f"unknown status {finding.status!r} of {finding.test}")
        graded.append((status, finding))
    bad = [(status, finding) for status, finding in graded if status is not Status.OK]
    details = {"level": params.level, "results": len(findings),
               "failed": [f"{f.test}/{'gpu ' + f.gpu if f.gpu else 'system'}: {f.message}" for _, f in bad]}
    if not bad:
        return CheckResult("active.dcgm_diag", Status.OK, f"level={params.level}: {len(findings)} results pass",
                           details)
    status, first = max(bad, key=lambda item: item[0].severity)
    summary = f"level={params.level} test={first.test.replace(' ', '_')}" + (f" gpu={first.gpu}" if first.gpu else "")
    summary += f" status={first.status}" + (f" {first.message}" if first.message else "")
    return CheckResult("active.dcgm_diag", status, summary, details)


# ---- nccl-tests all_reduce_perf -------------------------------------------------------------
@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    busbw_gbps: float          # out-of-place bus bandwidth, GB/s
    wrong: int                 # out-of-place + in-place #wrong


@dataclass(frozen=True)
class NcclRun:
    rows: Tuple[NcclRow, ...]
    out_of_bounds: Optional[int]
    avg_busbw_gbps: Optional[float]


_NCCL_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+-?\d+\s+(.*)$")
_NCCL_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")


def parse_all_reduce_perf(text: str) -> NcclRun:
    rows = []
    out_of_bounds = avg = None
    for line in text.splitlines():
        row = _NCCL_ROW.match(line)
        if row:
            # time algbw busbw #wrong (out-of-place), time algbw busbw #wrong (in-place); #wrong is N/A without -c
            cells = row.group(3).split()
            if len(cells) < 8:
                raise ParseError(f"a result row with {len(cells)} columns after root, expected 8: {line.strip()!r}")
            try:
                busbw = float(cells[2])
                wrong = sum(int(cells[i]) for i in (3, 7) if cells[i] != "N/A")
            except ValueError:
                raise ParseError(f"a result row that is not numbers: {line.strip()!r}") from None
            rows.append(NcclRow(int(row.group(1)), busbw, wrong))
            continue
        oob = _NCCL_OOB.match(line)
        if oob:
            out_of_bounds = int(oob.group(1))
        found = _NCCL_AVG.match(line)
        if found:
            avg = float(found.group(1))
    if not rows:
        raise ParseError("no result rows (size count type redop root time algbw busbw #wrong ...)")
    return NcclRun(tuple(rows), out_of_bounds, avg)


def check_nccl_allreduce(params: config.ActiveNcclAllReduce, run: NcclRun) -> CheckResult:
    largest = max(run.rows, key=lambda row: row.size_bytes)
    wrong = sum(row.wrong for row in run.rows) + (run.out_of_bounds or 0)
    details = {"largest_bytes": largest.size_bytes, "busbw_gbps": largest.busbw_gbps, "wrong": wrong,
               "avg_busbw_gbps": run.avg_busbw_gbps}
    if wrong:
        return CheckResult("active.nccl_allreduce", Status.CRITICAL, f"wrong={wrong} results (corrupted data)",
                           details)
    if params.min_busbw_gbps is not None and largest.busbw_gbps < params.min_busbw_gbps:
        return CheckResult("active.nccl_allreduce", Status.CRITICAL,
                           f"busbw={largest.busbw_gbps:g}GB/s expected>={params.min_busbw_gbps:g} "
                           f"at {largest.size_bytes}B", details)
    return CheckResult("active.nccl_allreduce", Status.OK, f"busbw={largest.busbw_gbps:g}GB/s at "
                       f"{largest.size_bytes}B, no wrong results", details)


# ---- perftest ib_write_bw ----------------------------------------------------------------------
_IB_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec|MiB/sec)\]\s+BW average\[")
_IB_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def parse_ib_write_bw(text: str) -> Tuple[int, float]:
    """(message bytes, average bandwidth in Gb/s) of the largest message size reported."""
    unit = None
    best: Optional[Tuple[int, float]] = None
    for line in text.splitlines():
        header = _IB_HEADER.search(line)
        if header:
            unit = header.group(1)
            continue
        row = _IB_ROW.match(line)
        if row and unit is not None:
            average = float(row.group(4))
            gbps = average if unit == "Gb/sec" else average * 1024 * 1024 * 8 / 1e9
            size = int(row.group(1))
            if best is None or size >= best[0]:
                best = (size, gbps)
    if unit is None:
        raise ParseError("no '#bytes #iterations BW peak[...] BW average[...]' header")
    if best is None:
        raise ParseError("a header but no result row")
    return best


def check_ib_write_bw(params: config.ActiveIbWriteBw, per_device: Dict[str, Tuple[int, float]]) -> CheckResult:
    details = {device: round(gbps, 2) for device, (_, gbps) in sorted(per_device.items())}
    if not per_device:
        return CheckResult("active.ib_write_bw", Status.UNKNOWN, "no InfiniBand device to test", details)
    if params.min_bw_gbps is not None:
        for device, (size, gbps) in sorted(per_device.items()):
            if gbps < params.min_bw_gbps:
                return CheckResult("active.ib_write_bw", Status.CRITICAL,
                                   f"device={device} bw={gbps:.1f}Gb/s expected>={params.min_bw_gbps:g} "
                                   f"at {size}B", details)
    return CheckResult("active.ib_write_bw", Status.OK, ", ".join(f"{d} {g:.1f}Gb/s" for d, g in details.items()),
                       details)
