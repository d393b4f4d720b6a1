"""The compute canary: a fixed-seed chain of matrix multiplies whose result must be the same,
bit for bit, on every device of one kind, and match a reference recorded in float64.

The inputs come from a seeded CPU generator (the same on every node and device type); the
result's checksum (sha256 of its bytes) is compared across devices of the same kind, since
different BLAS libraries or GPU generations may round differently but one kind must agree
with itself; its summaries (sum |x|, sum x^2, a fixed weighted sum) are compared to
REFERENCE, recorded with `python -m slurmtools.preflight.canary --record`, within the
dtype's tolerance. Every repetition's checksum must equal the first: a device that computes
the same thing twice differently is as wrong as one that disagrees with its peers.

Test-only fault injection: CANARY_FAULT_ENV names nodes whose first device computes wrong
results (adds 1.0 to one element): `node2` from the start (the preflight canary sees it),
`node2@6` from training step 6 on (only the in-training SDC canary sees it), comma-separated.
Only the two canaries read it (fault_from_step); slurmtools never sets it; it exists so that
the tests can show that a wrong-results node is named. Never set it on a real job.
"""
from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

SEED = 20261130
CANARY_FAULT_ENV = "SLURMTOOLS_TEST_CANARY_FAULT_NODES"  # tests only: nodes whose canary computes wrong


@dataclass(frozen=True)
class Shape:
    """The canary's work: a chain of `chain` (size x size) multiplies, repeated `reps` times."""
    size: int
    chain: int
    reps: int

    @property
    def flops(self) -> float:
        return 2.0 * self.size ** 3 * self.chain * self.reps


# sized for about half a second: CPUs do ~50 GFLOP/s per core, a data-centre GPU tens of TFLOP/s
SHAPES: Dict[str, Shape] = {"cpu": Shape(384, 4, 40), "cuda": Shape(4096, 4, 20)}
DTYPE = "float32"
# relative to sum |x| of the result: float32 against the float64 reference (summaries only;
# the bitwise checksum across devices is the fine-grained test)
TOLERANCE = {"float32": 1e-5}
# (dtype, size, chain) -> (sum |x|, sum x^2, sum x*w), recorded in float64 by record()
REFERENCE: Dict[Tuple[str, int, int], Tuple[float, float, float]] = {
    ("float32", 384, 4): (43949.992900175166, 19029.803517548255, -19.04751609505638),
    ("float32", 4096, 4): (4976076.279031107, 2146363.131928565, -873.3360508297225),
}


@dataclass(frozen=True)
class CanaryResult:
    """One device's canary: where it ran, what it computed, how fast."""
    node: str
    rank: int
    device: str                         # "cpu" or "cuda:N"
    device_kind: str                    # "cpu" or the GPU's name: checksums are compared within a kind
    digest: str
    summary: Tuple[float, float, float]
    consistent: bool                    # every repetition gave the same checksum
    seconds: float
    flops: float

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_json(self) -> Dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "device": self.device, "device_kind": self.device_kind,
                "digest": self.digest, "summary": list(self.summary), "consistent": self.consistent,
                "seconds": round(self.seconds, 6), "gflops": round(self.gflops, 3)}


def _inputs(shape: Shape, dtype: Any) -> "Tuple[List[Any], Any, Any]":
    import torch
    gen = torch.Generator().manual_seed(SEED + shape.size)
    mats = [torch.randn(shape.size, shape.size, generator=gen).to(dtype) / shape.size ** 0.5
            for _ in range(shape.chain)]
    x = torch.randn(shape.size, shape.size, generator=gen).to(dtype)
    weights = torch.randn(shape.size, shape.size, generator=gen).to(dtype)
    return mats, x, weights


def _chain(mats: List[Any], x: Any) -> Any:
    import torch
    for mat in mats:
        x = torch.tanh(mat @ x)
    return x


def summarize(result: Any, weights: Any) -> Tuple[float, float, float]:
    import torch
    r = result.to(torch.float64).cpu()
    w = weights.to(torch.float64).cpu()
    return (float(r.abs().sum()), float((r * r).sum()), float((r * w).sum()))


def _digest(result: Any) -> str:
    return hashlib.sha256(result.cpu().contiguous().numpy().tobytes()).hexdigest()


def fault_from_step(environ: Mapping[str, str], host: str) -> Optional[int]:
    """The training step from which this host's first device computes wrong results (0: from
    the start, before training), per the test-only CANARY_FAULT_ENV; None: it computes right."""
    for item in environ.get(CANARY_FAULT_ENV, "").split(","):
        name, _, step = item.strip().partition("@")
        if name and name == host:
            return int(step) if step.isdigit() else 0
    return None


def run_on(device: str, shape: Shape, *, fault: bool = False, rank: int = 0) -> CanaryResult:
    """The canary on one device: the checksum of every repetition and the time they took."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, DTYPE)
    mats, x, weights = _inputs(shape, dtype)
    mats = [mat.to(device) for mat in mats]
    x = x.to(device)
    kind = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    result = _chain(mats, x)          # warm-up, and the result that is judged
    sync()
    if fault:
        result = result.clone()
        result.view(-1)[0] += 1.0
    digest = _digest(result)
    start = time.perf_counter()
    again = result
    for _ in range(shape.reps):
        again = _chain(mats, x)
    sync()
    seconds = time.perf_counter() - start
    # the last repetition must give what the first gave (the injected fault only changes the first)
    consistent = _digest(again) == digest or fault
    return CanaryResult(node=socket.gethostname(), rank=rank, device=device, device_kind=kind, digest=digest,
                        summary=summarize(result, weights), consistent=consistent, seconds=seconds,
                        flops=shape.flops)


def reference(shape: Shape) -> Tuple[float, float, float]:
    """The canary's result computed in float64 from the same (float32) inputs."""
    import torch
    mats, x, weights = _inputs(shape, torch.float32)
    exact = _chain([mat.to(torch.float64) for mat in mats], x.to(torch.float64))
    return summarize(exact, weights)


def record() -> Dict[Tuple[str, int, int], Tuple[float, float, float]]:
    return {(DTYPE, shape.size, shape.chain): reference(shape) for shape in SHAPES.values()}


if __name__ == "__main__":
    for key, value in record().items():
        print(f"    {key!r}: {value!r},")
