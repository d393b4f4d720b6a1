"""GPU facts through NVML (nvidia-ml-py's `pynvml` module), or from a recorded snapshot.

NVML errors are wrapped here and nowhere else: a call a GPU does not support is a None fact;
anything else becomes ProbeError. The fixture probe is only ever chosen explicitly
(`gpu_probe: fixture:<path or builtin name>`), never as a fallback when NVML is missing.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple, TypeVar

from slurmtools.errors import SlurmToolsError
from slurmtools.health.model import GpuFacts, GpuSnapshot, NvLink

BUILTIN_FIXTURES = Path(__file__).parent / "fixtures"
Result = TypeVar("Result")

# NVML clock-event (throttle) reason bits -> names used in facts and config
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class ProbeError(Exception):
    """A probe could not gather its facts (not a verdict about the node)."""


class GpuProbe(Protocol):
    def snapshot(self) -> GpuSnapshot: ...


def throttle_names(mask: int) -> Tuple[str, ...]:
    return tuple(name for bit, name in sorted(THROTTLE_BITS.items()) if mask & bit)


class NvmlProbe:
    """Reads every GPU once per call; nvmlShutdown always follows nvmlInit."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise ProbeError("nvidia-ml-py is not installed (pip install 'slurmtools[nvml]')") from exc
        self.nv = pynvml

    def _opt(self, fn: Callable[..., Result], *args: Any) -> Optional[Result]:
        """A fact this GPU may not support: None instead of an error."""
        try:
            return fn(*args)
        except self.nv.NVMLError_NotSupported:
            return None
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise

    def snapshot(self) -> GpuSnapshot:
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise ProbeError(f"init failed: {exc}") from None
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
            return GpuSnapshot(driver, tuple(self._gpu(i) for i in range(nv.nvmlDeviceGetCount())))
        except nv.NVMLError as exc:
            raise ProbeError(f"query failed: {exc}") from None
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass

    def _gpu(self, index: int) -> GpuFacts:
        nv, opt = self.nv, self._opt
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        ecc_u = opt(nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        ecc_c = opt(nv.nvmlDeviceGetTotalEccErrors, handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        pending = opt(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remap = opt(nv.nvmlDeviceGetRemappedRows, handle)  # (corrected, uncorrected, pending, failure)
        reasons = opt(nv.nvmlDeviceGetCurrentClocksEventReasons, handle)
        links: List[NvLink] = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            state = opt(nv.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue
            err = [opt(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, c) or 0 for c in
                   (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT)]
            links.append(NvLink(link, bool(state), *err))
        procs: List[Any] = opt(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return GpuFacts(
            index=index, name=_text(nv.nvmlDeviceGetName(handle)), uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(handle).busId),
            ecc_uncorrected_volatile=ecc_u, ecc_corrected_volatile=ecc_c,
            retired_pages_pending=None if pending is None else bool(pending),
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            temperature_c=opt(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            throttle_reasons=throttle_names(reasons) if reasons is not None else (),
            pcie_gen_current=opt(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            pcie_gen_max=opt(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            pcie_width_current=opt(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
            pcie_width_max=opt(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
            nvlinks=tuple(links), compute_pids=tuple(int(p.pid) for p in procs))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---- snapshots as JSON (recorded fixtures) ---------------------------------------------
def snapshot_to_json(snap: GpuSnapshot) -> Dict[str, Any]:
    return {"driver_version": snap.driver_version, "gpus": [dataclasses.asdict(g) for g in snap.gpus]}


def snapshot_from_json(data: Dict[str, Any]) -> GpuSnapshot:
    fields = {f.name for f in dataclasses.fields(GpuFacts)}
    gpus = []
    for gpu in data.get("gpus", []):
        unknown = set(gpu) - fields
        if unknown:
            raise ProbeError(f"fixture GPU {gpu.get('index')}: unknown fields {sorted(unknown)}")
        gpu = dict(gpu)
        gpu["nvlinks"] = tuple(NvLink(**link) for link in gpu.get("nvlinks", ()))
        gpu["throttle_reasons"] = tuple(gpu.get("throttle_reasons", ()))
        gpu["compute_pids"] = tuple(gpu.get("compute_pids", ()))
        gpus.append(GpuFacts(**gpu))
    return GpuSnapshot(str(data.get("driver_version", "")), tuple(gpus))


class FixtureProbe:
    """A recorded snapshot: `fixture:/path.json` or `fixture:<builtin name>`. A fixture may set
    `hang_s` to behave like a hung NVML (for time-box tests)."""

    def __init__(self, ref: str) -> None:
        path = Path(ref)
        if not path.suffix and not path.is_absolute():
            path = BUILTIN_FIXTURES / f"{ref}.json"
        self.path = path

    def check(self) -> None:
        """As root a fixture decides what a node reports: it must be root-owned and not
        group/world writable, like the config that names it."""
        from slurmtools.health.config_file import read_trusted
        if not self.path.exists():
            return                # the probe reports it (UNKNOWN): a missing file is no sick node
        try:
            read_trusted(self.path)
        except SlurmToolsError as exc:
            raise ProbeError(f"GPU fixture: {exc}") from None

    def snapshot(self) -> GpuSnapshot:
        self.check()
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ProbeError(f"cannot read GPU fixture {self.path}: {exc}") from None
        if not isinstance(data, dict):
            raise ProbeError(f"GPU fixture {self.path}: not a JSON object")
        hang_s = data.get("hang_s")
        if isinstance(hang_s, (int, float)) and not isinstance(hang_s, bool) and 0 < hang_s < 3600:
            time.sleep(float(hang_s))
        try:
            return snapshot_from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProbeError(f"GPU fixture {self.path}: malformed ({type(exc).__name__}: {exc})") from None


def make_gpu_probe(spec: str) -> Optional[GpuProbe]:
    """`nvml`, `fixture:<path|name>` or `none` (this node has no GPUs to check)."""
    if spec == "none":
        return None
    if spec == "nvml":
        return NvmlProbe()
    if spec.startswith("fixture:"):
        return FixtureProbe(spec[len("fixture:"):])
    raise ProbeError(f"unknown gpu_probe {spec!r}")


def record_this_node() -> str:
    """This node's NVML readings in the fixture format (`slurmtools health record-gpu`)."""
    try:
        snap = NvmlProbe().snapshot()
    except ProbeError as exc:
        raise SlurmToolsError(f"cannot record GPUs: {exc}") from None
    return json.dumps(dict(snapshot_to_json(snap), source="recorded by slurmtools health record-gpu"), indent=1)
