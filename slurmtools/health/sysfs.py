"""InfiniBand facts from sysfs (/sys/class/infiniband/<hca>/ports/<n>/); the root is a parameter,
so tests and rehearsals point it at a recorded or generated tree."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional

from slurmtools.health.model import IbPort


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _after_colon(text: Optional[str]) -> str:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_rate_gbps(text: Optional[str]) -> Optional[float]:
    """'400 Gb/sec (4X NDR)' -> 400.0."""
    if not text:
        return None
    match = re.match(r"^\s*([\d.]+)\s*Gb/sec", text)
    return float(match.group(1)) if match else None


def read_ib_ports(root: Path = Path("/")) -> List[IbPort]:
    base = root / "sys" / "class" / "infiniband"
    ports: List[IbPort] = []
    if not base.is_dir():
        return ports
    for hca in sorted(p for p in base.iterdir()):
        pdir = hca / "ports"
        if not pdir.is_dir():
            continue
        for port in sorted((p for p in pdir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            counters: Dict[str, int] = {}
            cdir = port / "counters"
            if cdir.is_dir():
                for counter_file in cdir.iterdir():
                    value = _read(counter_file)
                    if value is not None and value.isdigit():
                        counters[counter_file.name] = int(value)
            ports.append(IbPort(hca=hca.name, port=int(port.name), state=_after_colon(_read(port / "state")),
                                phys_state=_after_colon(_read(port / "phys_state")),
                                rate_gbps=parse_rate_gbps(_read(port / "rate")),
                                link_layer=_read(port / "link_layer") or "", counters=counters))
    return ports
