"""InfiniBand facts from sysfs, laid out as the kernel lays them out; the root is a parameter,
so tests and rehearsals point it at a recorded or generated tree.

    /sys/class/infiniband/<hca>          -> ../../devices/pci.../<pci>/infiniband/<hca>
    /sys/class/infiniband/<hca>/fw_ver
    /sys/class/infiniband/<hca>/device   -> ../../../<pci>        (the PCI slot it is bound to)
    /sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,link_layer,counters/*}
    /sys/class/infiniband/<hca>/device/net/<ifname>/{dev_port,operstate}   (IPoIB or RoCE netdev;
                                                                            dev_port is port - 1)
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from slurmtools.health.model import IbPort

IB_CLASS = Path("sys/class/infiniband")


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


def _pci_slot(hca: Path) -> str:
    """The PCI address of the device the HCA's `device` link points to ("0000:1a:00.0")."""
    device = hca / "device"
    return os.path.basename(os.path.realpath(device)) if device.is_symlink() else ""


def _netdevs(hca: Path) -> Dict[int, List[Tuple[str, str]]]:
    """port number -> [(ifname, operstate)] for the HCA's network interfaces."""
    out: Dict[int, List[Tuple[str, str]]] = {}
    net = hca / "device" / "net"
    if not net.is_dir():
        return out
    for iface in sorted(net.iterdir()):
        dev_port = _read(iface / "dev_port")
        port = int(dev_port) + 1 if dev_port and dev_port.isdigit() else 1
        out.setdefault(port, []).append((iface.name, _read(iface / "operstate") or "unknown"))
    return out


def _counters(port: Path) -> Dict[str, int]:
    counters: Dict[str, int] = {}
    cdir = port / "counters"
    if cdir.is_dir():
        for counter_file in cdir.iterdir():
            value = _read(counter_file)
            if value is not None and value.isdigit():
                counters[counter_file.name] = int(value)
    return counters


def read_ib_ports(root: Path = Path("/")) -> List[IbPort]:
    base = root / IB_CLASS
    ports: List[IbPort] = []
    if not base.is_dir():
        return ports
    for hca in sorted(base.iterdir()):
        pdir = hca / "ports"
        if not pdir.is_dir():
            continue
        fw_ver = _read(hca / "fw_ver") or ""
        slot = _pci_slot(hca)
        netdevs = _netdevs(hca)
        for port in sorted((p for p in pdir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            number = int(port.name)
            ports.append(IbPort(hca=hca.name, port=number, state=_after_colon(_read(port / "state")),
                                phys_state=_after_colon(_read(port / "phys_state")),
                                rate_gbps=parse_rate_gbps(_read(port / "rate")),
                                link_layer=_read(port / "link_layer") or "", counters=_counters(port),
                                fw_ver=fw_ver, pci_slot=slot, netdevs=tuple(netdevs.get(number, ()))))
    return ports
