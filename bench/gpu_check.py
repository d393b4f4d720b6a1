#!/usr/bin/env python3
"""The GPU paths on one machine with an NVIDIA GPU and PyTorch installed (nothing fetched), in at
most 8 minutes; one line per check, `<check>: ok|FAILED|skipped: <why> — figures`:

- device: the torch release, the GPU and its driver;
- health-gate: `slurmtools health run` with real NVML, every passive phase timed as the process
  Slurm waits for, and the NVML probe alone (needs nvidia-ml-py);
- canary: the preflight canary on the GPU against its float64 reference, twice (same digest);
- trainer: the reference trainer on nccl with async checkpoints and snapshots every
  --snapshot-every steps under the default 1 % stall bound: uninterrupted, then a crash after a
  snapshot and a restart that resumes from it; same final hash, snapshots kept at their interval;
- snapshot-stall: the training stream's stall per snapshot (slurmtools.snapshot.host_copy) per GB
  against a plain copy into pinned host memory, for both copy paths at each size, and
  `ratio snapshot-stall/pinned-d2h <x>` for the path the copier picks on its own (goal <= 1.5);
- checkpoint-bench-cpu: bench/checkpoint.py on CPU ranks with the GPU hidden from them.

On a machine without a GPU the GPU lines say "skipped: no GPU" and the CPU line runs. Exit 1 when
a check FAILED.

    bench/gpu_check.sh [--sizes-gb 1,4,16] [--snapshot-every 10]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from slurmtools.common.control_dir import standalone_env  # noqa: E402
from slurmtools.snapshot.host_copy import HostCopier, staging_room  # noqa: E402
from slurmtools.snapshot.rules import DEFAULT_EVERY_STEPS  # noqa: E402

EXAMPLE = REPO / "examples" / "tiny_fsdp" / "train.py"
GB = 1 << 30
# the trainer check's model: ~100M parameters, a state of ~1.6 GB with its optimizer's
MODEL_ARGS = ["--dim", "1024", "--layers", "8", "--seq", "256", "--batch-per-rank", "8"]


class Skipped(Exception):
    """The check cannot run here; the message says why."""


def _need_gpu() -> None:
    if not torch.cuda.is_available():
        raise Skipped("no GPU")


REQUIRED = ("yaml", "psutil", "ClusterShell", "prometheus_client", "xxhash", "regex")


def device(args: argparse.Namespace) -> str:
    import importlib.util
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        return f"FAILED — slurmtools' requirements missing here: {', '.join(missing)} (setup.cfg install_requires)"
    if not torch.cuda.is_available():
        return f"ok — torch {torch.__version__}, no GPU"
    props = torch.cuda.get_device_properties(0)
    driver = "driver unknown (no nvidia-ml-py)"
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = f"driver {pynvml.nvmlSystemGetDriverVersion()}"
    except Exception:  # noqa: BLE001 - a description only
        pass
    return (f"ok — torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, "
            f"{props.total_memory / GB:.0f} GiB, {driver}, {torch.cuda.device_count()} visible")


HEALTH_CONFIG = """defaults:
  gpu_probe: nvml
  kernel_log: {kmsg}
  state_dir: {state}
  textfile: {state}/health.prom
  syslog: false
  drain: false
  checks:
    gpu:
      count: {{expected: {count}}}
    ib:
      ports: {{enabled: {ib}}}
      counters: {{enabled: {ib}}}
      flap: {{enabled: {ib}}}
"""


def health_gate(args: argparse.Namespace) -> str:
    _need_gpu()
    try:
        import pynvml
    except ImportError:
        raise Skipped("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    sys.path.insert(0, str(REPO / "bench"))
    import health_gate as bench_health
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    kmsg = "/dev/kmsg" if os.access("/dev/kmsg", os.R_OK) else "null"
    ib = str(Path("/sys/class/infiniband").is_dir()).lower()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "health.yaml"
        cfg.write_text(HEALTH_CONFIG.format(kmsg=kmsg, state=tmp, count=count, ib=ib))
        parts, worst = [], 0
        for phase in ("prolog", "epilog", "periodic"):
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "slurmtools", "health", "run", "--phase", phase, "--config",
                                   str(cfg), "--no-drain", "--quiet"], capture_output=True, text=True, timeout=120,
                                  cwd=REPO)
            parts.append(f"{phase} {time.perf_counter() - started:.2f} s (exit {proc.returncode})")
            worst = max(worst, proc.returncode)
            if proc.returncode:
                parts.append(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:])
        probes_s, checks_s, _, _ = bench_health.in_process(cfg)
    verdict = "ok" if worst == 0 else "FAILED"
    return (f"{verdict} — {count} GPU(s), IB checks {'on' if ib == 'true' else 'off (no /sys/class/infiniband)'}; "
            f"{'; '.join(parts)}; in process: probes {probes_s * 1000:.0f} ms, checks {checks_s * 1000:.1f} ms")


def canary(args: argparse.Namespace) -> str:
    _need_gpu()
    from slurmtools.preflight import canary as preflight_canary
    from slurmtools.preflight.judge import judge_canary
    shape = preflight_canary.SHAPES["cuda"]
    first = preflight_canary.run_on("cuda:0", shape)
    second = preflight_canary.run_on("cuda:0", shape)
    reference = preflight_canary.REFERENCE[(preflight_canary.DTYPE, shape.size, shape.chain)]
    scale = max(1.0, abs(reference[0]))
    error = max(abs(a - b) / scale for a, b in zip(first.summary, reference))
    findings = judge_canary([first], shape.size, shape.chain)
    same = first.digest == second.digest and first.consistent and second.consistent
    verdict = "ok" if not findings and same else "FAILED"
    return (f"{verdict} — relative error {error:.1e} (tolerance {preflight_canary.TOLERANCE['float32']:g}), "
            f"{'the same digest twice' if same else 'digests differ'}, {first.gflops / 1000:.1f} TFLOP/s fp32, "
            f"{len(findings)} finding(s){': ' + findings[0].detail if findings else ''}")


def _train_run(work: Path, name: str, extra: List[str], attempt: str) -> Tuple[List[Dict[str, object]], str, int]:
    env = dict(os.environ, **standalone_env(work / name / "control", attempt, work / "memory"))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(EXAMPLE),
            "--steps", "60", *MODEL_ARGS, "--checkpoint-every", "20", "--checkpoint-dir", str(work / name / "ckpt"), "--loader-workers", "0",
            *extra]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return events, proc.stderr, proc.returncode


def _crash_step(every: int) -> int:
    """Two steps after the newest snapshot before step 48 that no checkpoint (every 20) shares a
    step with: the restart must come back from the snapshot, not the older checkpoint."""
    snapshots = [step for step in range(every, 48, every) if step % 20] if every >= 3 else []
    if not snapshots:
        raise Skipped(f"--snapshot-every {every} leaves no snapshot between the checkpoints (use 3 to 19)")
    return snapshots[-1] + 2


def trainer(args: argparse.Namespace) -> str:
    _need_gpu()
    every = str(args.snapshot_every)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        work = Path(tmp)
        (work / "memory").mkdir()
        started = time.monotonic()
        reference, ref_err, ref_rc = _train_run(work, "reference", ["--snapshot-every", every], "47.0")
        reference_s = time.monotonic() - started
        finals = [e for e in reference if e.get("event") == "final"]
        if ref_rc or not finals:
            return f"FAILED — the uninterrupted run exited {ref_rc}: {ref_err.strip()[-300:]}"
        crash_at = _crash_step(args.snapshot_every)
        _, crash_err, crash_rc = _train_run(work, "job", ["--snapshot-every", every, "--fail-at-step", str(crash_at)],
                                            "47.0")
        again, again_err, again_rc = _train_run(work, "job", ["--snapshot-every", every], "47.0.1")
    resumed = [e for e in again if e.get("event") == "resumed"]
    final_again = [e for e in again if e.get("event") == "final"]
    spaced = [line for line in (ref_err + crash_err).splitlines() if "snapshots every" in line]
    same = bool(final_again) and final_again[0]["state_sha256"] == finals[0]["state_sha256"]
    path = resumed[0].get("path") if resumed else "no resume"
    verdict = "ok" if same and crash_rc != 0 and again_rc == 0 and "snapshot" in str(path) and not spaced else "FAILED"
    return (f"{verdict} — nccl, async checkpoints every 20, snapshots every {every} steps "
            f"({'kept' if not spaced else 'spaced out: ' + spaced[-1].strip()}); uninterrupted {reference_s:.0f} s; "
            f"crash at step {crash_at}, resumed from {path}; final hash "
            f"{'the same' if same else 'DIFFERS: ' + (again_err.strip()[-300:] or 'no final line')}")


def _timed(fn: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _stall(state: Dict[str, object], params: List[torch.Tensor], staging: bool, rounds: int = 3) -> float:
    """Median stall of a snapshot: host time in start() plus the training stream's measured share,
    with a step (matmuls, then an optimizer step) running while it drains."""
    optim = torch.optim.SGD(params, lr=1e-6)
    for p in params:
        p.grad = torch.zeros_like(p)
    work = torch.randn(4096, 4096, device="cuda")
    copier = HostCopier()
    copier.prepare(state)
    stalls = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        started = time.perf_counter()
        copier.start(state, optim, staging=staging)
        host_s = time.perf_counter() - started
        for _ in range(40):                       # a forward and backward's worth of device work
            work = torch.tanh(work @ work)
        optim.step()
        torch.cuda.synchronize()
        copier.finish()
        stalls.append(host_s + copier.device_stall_s())
    copier.close()
    return statistics.median(stalls)


def _pinned_copy_s(params: List[torch.Tensor]) -> float:
    """The link's rate: the best of three plain async copies into pinned buffers allocated once."""
    pinned = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]

    def copy() -> None:
        for buffer, param in zip(pinned, params):
            buffer.copy_(param, non_blocking=True)
    return min(_timed(copy) for _ in range(3))


def snapshot_stall(args: argparse.Namespace) -> str:
    _need_gpu()
    lines, chosen_ratio = [], 0.0
    for size_gb in [float(x) for x in args.sizes_gb.split(",")]:
        nbytes = int(size_gb * GB)
        free, _ = torch.cuda.mem_get_info()
        if nbytes * 2.2 > free:
            lines.append(f"{size_gb:g} GB: not run ({free / GB:.0f} GiB free on the device)")
            continue
        params = [torch.randn(nbytes // 4 // 64, device="cuda") for _ in range(64)]
        state = {"model": {f"p{i}": p for i, p in enumerate(params)}}
        d2h_s = _pinned_copy_s(params)
        overlapped = _stall(state, params, staging=False)
        staged = _stall(state, params, staging=True) if staging_room(nbytes) else None
        default = staged if staged is not None else overlapped
        chosen_ratio = default / d2h_s
        lines.append(f"{size_gb:g} GB: pinned d2h {d2h_s / size_gb:.3f} s/GB ({size_gb / d2h_s:.1f} GB/s); stall "
                     f"overlapped {overlapped:.3f} s, staged {f'{staged:.3f} s' if staged is not None else 'no room'}; "
                     f"default path {'staged' if staged is not None else 'overlapped'} {default / size_gb:.4f} s/GB")
        del params, state
        torch.cuda.empty_cache()
    if not lines:
        raise Skipped("no size fits this device")
    verdict = "ok" if chosen_ratio <= 1.5 else "FAILED"
    return f"{verdict} — " + "; ".join(lines) + f"\nratio snapshot-stall/pinned-d2h {chosen_ratio:.3f} (goal <= 1.5)"


def checkpoint_bench_cpu(args: argparse.Namespace) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "checkpoint.py"), "--procs", "4", "--saves", "3"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    if proc.returncode:
        return f"FAILED — exit {proc.returncode}: {proc.stderr.strip()[-600:]}"
    lines = proc.stdout.splitlines()
    figures = [line.strip() for line in lines if line.startswith(("model ", "sync save", "async save", "ratio "))]
    return "ok — 4 CPU ranks, the GPU hidden: " + " | ".join(figures)


CHECKS: List[Tuple[str, Callable[[argparse.Namespace], str]]] = [
    ("device", device), ("health-gate", health_gate), ("canary", canary), ("trainer", trainer),
    ("snapshot-stall", snapshot_stall), ("checkpoint-bench-cpu", checkpoint_bench_cpu)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-gb", default="1,4,16", help="state sizes of the snapshot-stall check")
    ap.add_argument("--snapshot-every", type=int, default=DEFAULT_EVERY_STEPS,
                    help="the trainer check's snapshot interval (steps; the spec's default)")
    args = ap.parse_args()
    failed = False
    print(f"gpu_check on {socket.gethostname()}, {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    for name, check in CHECKS:
        started = time.monotonic()
        try:
            line = check(args)
        except Skipped as why:
            line = f"skipped: {why}"
        except Exception as exc:  # noqa: BLE001 - one check's failure is its line, the others still run
            line = f"FAILED — {type(exc).__name__}: {str(exc)[-400:]}"
        failed = failed or line.startswith("FAILED")
        print(f"{name}: {line} [{time.monotonic() - started:.0f} s]", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
