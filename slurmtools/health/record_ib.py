"""`slurmtools health record-ib`: copy a node's InfiniBand sysfs into a directory, in the layout
the kernel uses (and sysfs.py reads), so its verdicts can be replayed later with
`sysfs_root: <that directory>`, or turned into a test fixture.

Only the files the checks read are copied (sysfs holds thousands, some of them unreadable or
slow); links are recreated as relative links inside the copy, never pointing outside it.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import List, Optional

from slurmtools.errors import UsageError
from slurmtools.health.sysfs import IB_CLASS

HCA_FILES = ("fw_ver", "node_type", "board_id", "hca_type")
PORT_FILES = ("state", "phys_state", "rate", "link_layer")
NETDEV_FILES = ("dev_port", "operstate", "type", "address", "mtu")


def _copy_text(source: Path, target: Path) -> bool:
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return True


def _relative_link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _inside(path: Path, top: Path) -> Optional[Path]:
    """path relative to top, or None when it lies outside it."""
    try:
        return path.relative_to(top)
    except ValueError:
        return None


def record(root: Path, out: Path) -> List[str]:
    """Copy root's InfiniBand tree into out; the HCAs recorded."""
    base = root / IB_CLASS
    if not base.is_dir():
        raise UsageError(f"no InfiniBand devices under {base}")
    sys_dir = (root / "sys").resolve()
    recorded = []
    for hca_link in sorted(base.iterdir()):
        device = hca_link.resolve()                   # .../devices/pci.../<pci>/infiniband/<hca>
        rel_device = _inside(device, sys_dir)
        if rel_device is None or _inside(device.parent.parent, sys_dir) is None:
            continue                                  # a link out of the recorded tree: not copied
        copy = out / "sys" / rel_device
        for name in HCA_FILES:
            _copy_text(device / name, copy / name)
        for port in sorted(p for p in (device / "ports").iterdir() if p.name.isdigit()):
            for name in PORT_FILES:
                _copy_text(port / name, copy / "ports" / port.name / name)
            counters = port / "counters"
            for counter in sorted(counters.iterdir()) if counters.is_dir() else []:
                _copy_text(counter, copy / "ports" / port.name / "counters" / counter.name)
        pci = device.parent.parent
        (copy / "device").symlink_to(Path("../../..") / pci.name)      # as the kernel writes it
        _relative_link(out / IB_CLASS / hca_link.name, copy)
        net = pci / "net"
        for iface in sorted(net.iterdir()) if net.is_dir() else []:
            rel_iface = _inside(iface.resolve(), sys_dir)
            if rel_iface is None:
                continue                              # net/ or an interface linking out of the tree
            iface_copy = out / "sys" / rel_iface
            for name in NETDEV_FILES:
                _copy_text(iface / name, iface_copy / name)
            _relative_link(out / "sys" / "class" / "net" / iface.name, iface_copy)
        recorded.append(hca_link.name)
    if not recorded:
        raise UsageError(f"no InfiniBand devices under {base}")
    return recorded


def cmd_record_ib(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a directory")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty (a recording goes into a new directory)")
    try:
        hcas = record(Path(args.sysfs_root), out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write the recording: {exc.strerror or exc}") from None
    print(f"recorded {len(hcas)} HCAs ({', '.join(hcas)}) into {out}; replay with `sysfs_root: {out}`")
    return 0
