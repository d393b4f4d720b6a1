"""What exists of a named mini-cluster on this machine: its record (what `up` started and
changed), the registry of live clusters, slots, and the resources another program holds."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurmtools.common.fsutil import write_json_atomic
from slurmtools.errors import MiniClusterError
from slurmtools.minicluster import daemons, netns
from slurmtools.minicluster.layout import DEFAULT_NAME, MAX_SLOTS, REGISTRY_DIR, MiniClusterLayout

ETC_SLURM_CONF = Path("/etc/slurm/slurm.conf")


# ---- record ----------------------------------------------------------------------
def load_record(layout: MiniClusterLayout) -> Dict[str, Any]:
    try:
        record: Dict[str, Any] = json.loads(layout.record_file.read_text())
        return record
    except (OSError, ValueError):
        return {"pids": {}, "etc_slurm": None, "net": False}


def save_record(layout: MiniClusterLayout, record: Dict[str, Any]) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.record_file, record)


def layout_from_record(state_dir: Path, name: str = DEFAULT_NAME) -> MiniClusterLayout:
    """Rebuild the layout `up` used, so `down`/`kill` need no repeated flags."""
    try:
        saved = json.loads((state_dir / "record.json").read_text())["layout"]
        return MiniClusterLayout(name=saved.get("name", name), slot=int(saved.get("slot", 0)), state_dir=state_dir,
                                 nodes=saved["nodes"], gpus_per_node=saved["gpus_per_node"],
                                 cgroups=bool(saved.get("cgroups", True)),
                                 cpus_per_node=int(saved.get("cpus_per_node", 4)),
                                 controller_host=saved["controller_host"], prolog_dir=Path(saved["prolog_dir"]),
                                 epilog_dir=Path(saved["epilog_dir"]), slurm_release=str(saved.get("slurm_release", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return MiniClusterLayout(name=name, state_dir=state_dir)


# ---- the registry of named clusters ---------------------------------------------------
def registered() -> List[Dict[str, Any]]:
    """Every cluster `up` registered on this machine: name, state_dir, slot."""
    out = []
    for path in sorted(REGISTRY_DIR.glob("*.json")) if REGISTRY_DIR.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
            out.append({"name": str(entry["name"]), "state_dir": str(entry["state_dir"]), "slot": int(entry["slot"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def find_layout(name: str, state_dir: Optional[Path] = None) -> MiniClusterLayout:
    """The layout of a named cluster: its explicit state dir, else the one it registered, else the default."""
    if state_dir is None:
        entry = next((e for e in registered() if e["name"] == name), None)
        state_dir = Path(entry["state_dir"]) if entry else MiniClusterLayout(name=name).root
    return layout_from_record(state_dir, name)


def allocate_slot(name: str, state_dir: Optional[Path]) -> int:
    """The slot this cluster had (its record), else the lowest one no other registered cluster uses."""
    previous = find_layout(name, state_dir)
    if previous.record_file.exists():
        return previous.slot
    taken = {entry["slot"] for entry in registered() if entry["name"] != name}
    free = [slot for slot in range(MAX_SLOTS) if slot not in taken]
    if not free:
        raise MiniClusterError(f"all {MAX_SLOTS} mini-cluster slots are taken on this machine")
    return free[0]


def register(layout: MiniClusterLayout) -> None:
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.registry_file, {"name": layout.name, "state_dir": str(layout.root), "slot": layout.slot},
                      durable=False)


def unregister(layout: MiniClusterLayout) -> None:
    try:
        entry = json.loads(layout.registry_file.read_text())
    except (OSError, ValueError):
        return
    if entry.get("state_dir") == str(layout.root):
        layout.registry_file.unlink(missing_ok=True)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def held_by_others(layout: MiniClusterLayout, record: Dict[str, Any]) -> Optional[str]:
    """What this cluster needs that something else holds (None: all free or already ours)."""
    pids = record.get("pids", {})
    for entry in registered():
        if entry["name"] == layout.name and entry["state_dir"] != str(layout.root):
            return f"the name {layout.name!r} belongs to the cluster in {entry['state_dir']}"
        if entry["name"] != layout.name and entry["slot"] == layout.slot:
            return f"slot {layout.slot} belongs to cluster {entry['name']!r}"
    if not record.get("net"):
        if netns.link_exists(layout.bridge):
            return (f"network interface {layout.bridge} exists and is not this cluster's "
                    f"(a leftover? `slurmtools minicluster down --name {layout.name}`)")
        if netns.subnet_in_use(layout):
            return f"subnet {layout.subnet} is already routed on this machine"
        taken = [layout.netns(node) for node in layout.node_names if netns.netns_exists(layout.netns(node))]
        if taken:
            return f"network namespace {taken[0]} exists and is not this cluster's"
    for daemon, host, port in (("slurmctld", "0.0.0.0", layout.slurmctld_port),
                               ("slurmdbd", "0.0.0.0", layout.slurmdbd_port),
                               ("mariadbd", "127.0.0.1", layout.db_port)):
        if not daemons.pid_alive(pids.get(daemon)) and not _port_free(host, port):
            return f"port {port} ({daemon}) is in use by another program"
    if layout.name == DEFAULT_NAME and not etc_slurm_is(layout) and (
            ETC_SLURM_CONF.exists() or ETC_SLURM_CONF.is_symlink()):
        return f"{ETC_SLURM_CONF} belongs to another Slurm (the default cluster links it only when it is free)"
    return None


def etc_slurm_is(layout: MiniClusterLayout) -> bool:
    return ETC_SLURM_CONF.is_symlink() and Path(os.readlink(ETC_SLURM_CONF)) == layout.slurm_conf
