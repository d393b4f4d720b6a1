"""`minicluster up | down | status | kill | partition | heal | restart`.

`up` writes a record (record.json) after every step of what it started or changed, so a
failed `up` is cleaned by `down`, and `down` stops exactly those processes (by pid).
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmtools import slurm
from slurmtools.errors import MiniClusterError, SlurmCommandError
from slurmtools.minicluster import daemons, netns
from slurmtools.minicluster.layout import REQUIRED_PACKAGES, MiniClusterLayout

ETC_SLURM_CONF = Path("/etc/slurm/slurm.conf")


# ---- record ----------------------------------------------------------------------
def load_record(layout: MiniClusterLayout) -> Dict[str, Any]:
    try:
        record: Dict[str, Any] = json.loads(layout.record_file.read_text())
        return record
    except (OSError, ValueError):
        return {"pids": {}, "etc_slurm": None, "hosts": False}


def save_record(layout: MiniClusterLayout, record: Dict[str, Any]) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.record_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, layout.record_file)


def layout_from_record(state_dir: Path) -> MiniClusterLayout:
    """Rebuild the layout `up` used, so `down`/`kill` need no repeated flags."""
    try:
        saved = json.loads((state_dir / "record.json").read_text())["layout"]
    except (OSError, ValueError, KeyError):
        return MiniClusterLayout(state_dir=state_dir)
    return MiniClusterLayout(state_dir=state_dir, nodes=saved["nodes"], gpus_per_node=saved["gpus_per_node"],
                             controller_host=saved["controller_host"], prolog_dir=Path(saved["prolog_dir"]),
                             epilog_dir=Path(saved["epilog_dir"]))


# ---- preconditions -----------------------------------------------------------------
def require_root() -> None:
    if os.geteuid() != 0:
        raise MiniClusterError("the mini-cluster needs root (namespaces, daemons, /etc/hosts); run it as root")


def missing_packages() -> List[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *REQUIRED_PACKAGES],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    installed = {ln.split()[0] for ln in out.stdout.splitlines() if len(ln.split()) > 1 and ln.split()[1] == "ii"}
    return [p for p in REQUIRED_PACKAGES if p not in installed]


def install_packages() -> List[str]:
    """Install Debian's Slurm, munge and MariaDB only where missing (daemons are not started by apt)."""
    if not shutil.which("dpkg-query") or not shutil.which("apt-get"):
        raise MiniClusterError("apt-get/dpkg not found: the mini-cluster installs Debian packages (Debian 12 or newer)")
    missing = missing_packages()
    if not missing:
        return []
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=900)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise MiniClusterError(f"{' '.join(argv[:3])} failed: {tail[-1] if tail else proc.returncode}")
    return missing


# ---- up ----------------------------------------------------------------------------
def write_configs(layout: MiniClusterLayout) -> None:
    for directory in (layout.etc_dir, layout.log_dir, layout.run_dir, layout.fake_gpu_dir, layout.ctld_state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    (layout.etc_dir / "slurm.conf").write_text(layout.render_slurm_conf())
    (layout.etc_dir / "gres.conf").write_text(layout.render_gres_conf())
    # cgroup.conf is read even with proctrack/linuxproc on some builds; keep it explicit and inert.
    (layout.etc_dir / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
    dbd = layout.etc_dir / "slurmdbd.conf"
    dbd.write_text(layout.render_slurmdbd_conf(daemons.db_password(layout)))
    dbd.chmod(0o600)
    if not layout.health_config.exists():
        layout.health_config.write_text(layout.render_health_config())
        layout.health_config.chmod(0o644)
    for gpu in range(layout.gpus_per_node):
        dev = layout.fake_gpu_dir / f"nvidia{gpu}"
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # char device, /dev/null's numbers


def link_etc_slurm(layout: MiniClusterLayout, record: Dict[str, Any]) -> None:
    """Point /etc/slurm/slurm.conf at ours so plain `sbatch` works; back up an admin's file first."""
    if ETC_SLURM_CONF.is_symlink() and Path(os.readlink(ETC_SLURM_CONF)) == layout.slurm_conf:
        return
    ETC_SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if ETC_SLURM_CONF.exists() or ETC_SLURM_CONF.is_symlink():
        backup = layout.state_dir / "backup" / "slurm.conf"
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(ETC_SLURM_CONF), backup)
    record["etc_slurm"] = {"backup": str(backup) if backup else None}
    save_record(layout, record)
    ETC_SLURM_CONF.symlink_to(layout.slurm_conf)


def up(layout: MiniClusterLayout, *, install: bool = True, wait_s: float = 60.0) -> List[slurm.NodeInfo]:
    require_root()
    if install:
        install_packages()
    record = load_record(layout)
    record["layout"] = {"nodes": layout.nodes, "gpus_per_node": layout.gpus_per_node,
                        "controller_host": layout.controller_host, "prolog_dir": str(layout.prolog_dir),
                        "epilog_dir": str(layout.epilog_dir)}
    save_record(layout, record)
    write_configs(layout)
    link_etc_slurm(layout, record)
    record["hosts"] = True
    save_record(layout, record)
    netns.hosts_add(layout)
    netns.net_up(layout)
    pids = record.setdefault("pids", {})
    steps: List[Tuple[str, Callable[[], Optional[int]]]] = [
        ("mariadbd", lambda: daemons.start_mariadb(layout)),
        ("munged", daemons.start_munged),
        ("slurmdbd", lambda: daemons.start_slurmdbd(layout)),
        ("slurmctld", lambda: daemons.start_slurmctld(layout))]
    steps += [(f"slurmd-{node}", functools.partial(daemons.start_slurmd, layout, node)) for node in layout.node_names]
    for name, start in steps:
        pid = start()
        if pid:
            pids[name] = pid
            save_record(layout, record)
    resume_our_stale_states(layout)
    return wait_until_idle(layout, wait_s)


def resume_our_stale_states(layout: MiniClusterLayout) -> None:
    """After a restart slurmctld restores saved node state; a node left DOWN by a previous
    run of ours (not responding) is brought back. Drains with a reason are left alone."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            nodes = slurm.nodes()
            break
        except SlurmCommandError:
            time.sleep(0.2)
    else:
        return
    for node in nodes:
        if node.state == "down" and node.reason.startswith("Not responding"):
            try:
                slurm.resume_node(node.name)
            except SlurmCommandError:
                pass


def wait_until_idle(layout: MiniClusterLayout, timeout_s: float) -> List[slurm.NodeInfo]:
    """Wait until every node answers (no '*'), is not down/unknown; a drained node is accepted."""
    deadline = time.monotonic() + timeout_s
    last: List[slurm.NodeInfo] = []
    while time.monotonic() < deadline:
        try:
            last = slurm.nodes()
        except SlurmCommandError:
            last = []
        if len(last) == layout.nodes and all(
                n.state in ("idle", "allocated", "mixed") and "NOT_RESPONDING" not in n.flags for n in last):
            return last
        time.sleep(0.25)
    states = ", ".join(f"{n.name}={n.display_state}" for n in last) or "no answer from slurmctld"
    raise MiniClusterError(f"nodes not ready after {timeout_s:g} s ({states}); logs in {layout.log_dir}")


# ---- down --------------------------------------------------------------------------
def down(layout: MiniClusterLayout, *, purge: bool = False) -> None:
    """Stop what `up` started (by pid), kill leftovers in the node namespaces, undo system edits."""
    require_root()
    record = load_record(layout)
    pids: Dict[str, int] = record.get("pids", {})
    # Slurm daemons also by pidfile: a failed `up` may not have recorded them.
    slurm_pids = {f"slurmd-{n}": daemons.read_pidfile(layout.slurmd_pidfile(n)) for n in layout.node_names}
    slurm_pids["slurmctld"] = daemons.read_pidfile(layout.run_dir / "slurmctld.pid")
    slurm_pids["slurmdbd"] = daemons.read_pidfile(layout.run_dir / "slurmdbd.pid")
    for name, pid in slurm_pids.items():
        if pid and name in pids and pids[name] != pid:
            continue  # pidfile points at a process we did not start
        daemons.stop_pid(pid if pid else pids.get(name))
    for node in layout.node_names:
        kill_namespace(layout, node)
    daemons.stop_pid(pids.get("mariadbd") or daemons.read_pidfile(layout.run_dir / "mysqld" / "mysqld.pid"), 60)
    if pids.get("munged"):
        daemons.stop_pid(pids["munged"])
    netns.net_down(layout)
    netns.hosts_remove()
    restore_etc_slurm(layout, record)
    record["pids"] = {}
    record["hosts"] = False
    record["etc_slurm"] = None
    if layout.state_dir.exists():
        save_record(layout, record)
    if purge and layout.state_dir.exists():
        shutil.rmtree(layout.state_dir)


def restore_etc_slurm(layout: MiniClusterLayout, record: Dict[str, Any]) -> None:
    if ETC_SLURM_CONF.is_symlink() and Path(os.readlink(ETC_SLURM_CONF)) == layout.slurm_conf:
        ETC_SLURM_CONF.unlink()
    info = record.get("etc_slurm") or {}
    backup = info.get("backup")
    if backup and Path(backup).exists() and not ETC_SLURM_CONF.exists():
        shutil.move(backup, ETC_SLURM_CONF)


# ---- faults --------------------------------------------------------------------------
def kill_namespace(layout: MiniClusterLayout, node: str) -> List[int]:
    """SIGKILL every process in the node's network namespace: slurmd, slurmstepd, tasks."""
    killed = []
    for pid in netns.namespace_pids(layout, node):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def kill_node(layout: MiniClusterLayout, node: str) -> List[int]:
    require_root()
    return kill_namespace(layout, node)


def partition_node(layout: MiniClusterLayout, node: str) -> None:
    require_root()
    netns.set_link(layout, node, up=False)


def heal_node(layout: MiniClusterLayout, node: str) -> None:
    require_root()
    netns.set_link(layout, node, up=True)


def restart_node(layout: MiniClusterLayout, node: str) -> None:
    """Restart the node's slurmd (brings a killed node back; ReturnToService=2 makes it idle)."""
    require_root()
    daemons.stop_pid(daemons.read_pidfile(layout.slurmd_pidfile(node)))
    pid = daemons.start_slurmd(layout, node)
    record = load_record(layout)
    if pid:
        record.setdefault("pids", {})[f"slurmd-{node}"] = pid
        save_record(layout, record)


# ---- status ------------------------------------------------------------------------
def format_table(nodes: List[slurm.NodeInfo]) -> str:
    rows = [("NODE", "STATE", "GRES", "REASON")]
    rows += [(n.name, n.display_state, n.gres, n.reason or "-") for n in nodes]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)


def default_controller_host() -> str:
    return socket.gethostname().split(".")[0]
