#!/usr/bin/env python3
"""Write the built-in GPU fixtures (slurmtools/health/fixtures/*.json) from fixture_data.

Run after changing fixture_data; the JSON files are committed so that rehearsals and tests
read the same bytes a recorded fixture would give.
"""
import json
from pathlib import Path

from slurmtools.health.fixture_data import GPU_FAULTS, node_snapshot, with_fault

OUT = Path(__file__).resolve().parent.parent / "slurmtools" / "health" / "fixtures"


def write(name: str, data: dict) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write("h100-8gpu", node_snapshot("h100"))
    write("h200-8gpu", node_snapshot("h200"))
    for fault in GPU_FAULTS:
        write(f"h100-8gpu-{fault}", with_fault(node_snapshot("h100"), fault))
    # the mini-cluster's fake nodes have 4 GPUs and no NVLink
    write("minicluster-4gpu", node_snapshot("h100", gpus=4, nvlinks=0))
    for fault in ("ecc-uncorrected", "stray-process", "hang"):
        write(f"minicluster-4gpu-{fault}", with_fault(node_snapshot("h100", gpus=4, nvlinks=0), fault))


if __name__ == "__main__":
    main()
