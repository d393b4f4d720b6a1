"""`minicluster up | down | status | list | kill | partition | heal | restart | restart-controller`.

`up` writes a record (record.json) after every step of what it started or changed, so a
failed `up` is cleaned by `down`, and `down` stops exactly those processes (by pid). Each
named cluster registers itself under /run (name, state dir, slot); `up` refuses, before it
changes anything, a name, bridge, subnet, namespace or port that something else holds.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import socket
import stat
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmtools.blame import spool
from slurmtools.errors import MiniClusterError, SlurmCommandError, UsageError
from slurmtools.minicluster import conf_text
from slurmtools.minicluster import daemons, debroot, degrade, jobcgroups, jobuser, netns, node_files, release
from slurmtools.minicluster import record as record_mod
from slurmtools.minicluster.record import (ETC_SLURM_CONF, allocate_slot, find_layout, held_by_others,
                                           layout_from_record, load_record, registered, save_record)
from slurmtools.slurm import commands as slurm
from slurmtools.train import node_beat

__all__ = ["ETC_SLURM_CONF", "find_layout", "load_record", "layout_for_up", "up", "down"]
from slurmtools.minicluster.faults import kill_namespace
from slurmtools.minicluster.layout import DEFAULT_NAME, JOB_IDS_PER_SLOT, MiniClusterLayout
from slurmtools.minicluster.packages import install_packages
from slurmtools.minicluster.sysrun import require_root

FAKE_GPU_MAJOR = 195
CGROUP_CONTROLLERS = jobcgroups.SLURM_CONTROLLERS


# ---- preconditions -----------------------------------------------------------------
def cgroup_problem() -> Optional[str]:
    """Why this machine cannot confine jobs with cgroup v1 (None: it can)."""
    for controller in CGROUP_CONTROLLERS:
        path = Path("/sys/fs/cgroup") / controller
        if not (path / "cgroup.procs").exists():
            return f"no cgroup v1 {controller} hierarchy at {path}"
        if not os.access(path, os.W_OK):
            return f"cgroup v1 {controller} hierarchy at {path} is not writable"
    return None


def layout_for_up(name: str, state_dir: Optional[Path], *, nodes: int, gpus_per_node: int, prolog_dir: Path,
                  epilog_dir: Path, cgroups: bool = True, slurm_release: Optional[str] = None) -> MiniClusterLayout:
    """The layout `up` will use. With cgroups a node has as many CPUs as the machine (they are
    really bound); without, four (Slurm's config_overrides lets them outnumber the machine's).
    slurm_release: None or the machine's own release runs the machine's packages; another one
    runs from a Debian root (debroot.py)."""
    require_root()
    if slurm_release is not None:
        try:
            release.check_release(slurm_release)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if slurm_release == debroot.host_release():
            slurm_release = None
    if cgroups:
        problem = cgroup_problem()
        if problem:
            raise MiniClusterError(f"cannot confine jobs with cgroups here: {problem} (`up --no-cgroups` runs "
                                   "without them, as task/none)")
    try:
        return MiniClusterLayout(name=name, slot=allocate_slot(name, state_dir), state_dir=state_dir, nodes=nodes,
                                 gpus_per_node=gpus_per_node, controller_host=default_controller_host(),
                                 prolog_dir=prolog_dir.resolve(), epilog_dir=epilog_dir.resolve(), cgroups=cgroups,
                                 cpus_per_node=(os.cpu_count() or 1) if cgroups else 4,
                                 slurm_release=slurm_release or "")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def release_name(slurm_release: str) -> str:
    return f"Slurm {slurm_release}" if slurm_release else "the machine's own Slurm"


# ---- up ----------------------------------------------------------------------------
def write_configs(layout: MiniClusterLayout) -> None:
    for directory in (layout.etc_dir, layout.log_dir, layout.run_dir, layout.fake_gpu_dir, layout.ctld_state_dir):
        directory.mkdir(parents=True, exist_ok=True)
    (layout.etc_dir / "slurm.conf").write_text(conf_text.slurm_conf(layout))
    (layout.etc_dir / "gres.conf").write_text(conf_text.gres_conf(layout))
    layout.hosts_file.write_text(node_files.render_hosts(layout))
    layout.hosts_file.chmod(0o644)
    (layout.etc_dir / "cgroup.conf").write_text(conf_text.cgroup_conf(layout))
    from slurmtools.minicluster.reboot import program_text
    layout.reboot_program.write_text(program_text(layout))
    layout.reboot_program.chmod(0o755)
    dbd = layout.etc_dir / "slurmdbd.conf"
    dbd.write_text(conf_text.slurmdbd_conf(layout, daemons.db_password(layout)))
    dbd.chmod(0o600)
    spool.make_spool(layout.blame_spool)
    layout.blames_program.write_text(node_files.blames_program_text(layout))
    layout.blames_program.chmod(0o755)
    layout.task_prolog.write_text(node_files.task_prolog_text(layout))
    layout.task_prolog.chmod(0o755)
    for node in layout.node_names:
        node_files.wipe_node_memory(layout, node)
    if not layout.health_config.exists():
        layout.health_config.write_text(node_files.render_health_config(layout))
        layout.health_config.chmod(0o644)
    for gpu in range(layout.gpus_per_node):
        # a character device with NVIDIA's numbers (195:N) and no driver behind it: Slurm accepts it
        # as a GPU file, the devices cgroup confines it per job, and opening it never works
        # (ENXIO when allowed, EPERM when the job was not given it)
        dev = layout.fake_gpu_dir / f"nvidia{gpu}"
        if dev.exists() and dev.stat().st_rdev != os.makedev(FAKE_GPU_MAJOR, gpu):
            dev.unlink()
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(FAKE_GPU_MAJOR, gpu))


def link_etc_slurm(layout: MiniClusterLayout, record: Dict[str, Any]) -> None:
    """The default-named cluster points a free /etc/slurm/slurm.conf at its own, so a plain
    `sbatch` works; any other cluster is addressed by SLURM_CONF and never touches /etc/slurm."""
    if layout.name != DEFAULT_NAME or record_mod.etc_slurm_is(layout) or ETC_SLURM_CONF.exists() or ETC_SLURM_CONF.is_symlink():
        return
    ETC_SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    record["etc_slurm"] = {"linked": True}
    save_record(layout, record)
    ETC_SLURM_CONF.symlink_to(layout.slurm_conf)


def up(layout: MiniClusterLayout, *, install: bool = True, wait_s: float = 60.0,
       progress: Callable[[str], None] = lambda line: None) -> List[slurm.NodeInfo]:
    """Bring the cluster up (or back); progress(line) hears each phase as it begins."""
    require_root()
    if install:
        progress("checking the packages (apt-get installs what is missing: minutes the first time)")
        install_packages(("mmdebstrap",) if layout.slurm_root else ())
    record = load_record(layout)
    conflict = held_by_others(layout, record)
    if conflict:
        raise MiniClusterError(f"cluster {layout.name!r} not started: {conflict}")
    made_with = record.get("layout", {}).get("slurm_release")
    if made_with is not None and made_with != layout.slurm_release:
        # its state (slurmctld's, the accounting database) belongs to that release
        raise MiniClusterError(f"cluster {layout.name!r} was made with {release_name(made_with)}, not "
                               f"{release_name(layout.slurm_release)}: `slurmtools minicluster --name {layout.name} "
                               "down --purge` it first")
    record["layout"] = {"name": layout.name, "slot": layout.slot, "nodes": layout.nodes,
                        "cgroups": layout.cgroups, "cpus_per_node": layout.cpus_per_node,
                        "gpus_per_node": layout.gpus_per_node, "controller_host": layout.controller_host,
                        "prolog_dir": str(layout.prolog_dir), "epilog_dir": str(layout.epilog_dir),
                        "slurm_release": layout.slurm_release}
    save_record(layout, record)
    record_mod.register(layout)
    jobuser.ensure(layout, record)          # jobs run as an ordinary user, as on a real cluster
    save_record(layout, record)
    if layout.slurm_root:
        progress(f"the Debian root for Slurm {layout.slurm_release} (built once: a minute or two)")
    debroot.ensure_root(layout)
    progress(f"configs in {layout.etc_dir}, network namespaces for {layout.nodes} nodes")
    write_configs(layout)
    link_etc_slurm(layout, record)
    record["net"] = True
    save_record(layout, record)
    netns.net_up(layout)
    _remove_stale_job_cgroups(layout, top=False)
    pids = record.setdefault("pids", {})
    steps: List[Tuple[str, Callable[[], Optional[int]]]] = [
        ("mariadbd", lambda: daemons.start_mariadb(layout)),
        ("munged", lambda: daemons.start_munged(layout)),
        ("slurmdbd", lambda: daemons.start_slurmdbd(layout)),
        ("slurmctld", lambda: daemons.start_slurmctld(layout))]
    steps += [(f"slurmd-{node}", functools.partial(daemons.start_slurmd, layout, node)) for node in layout.node_names]
    for name, start in steps:
        progress(f"starting {name}")
        pid = start()
        if pid:
            pids[name] = pid
            save_record(layout, record)
    with slurm.using_conf(layout.slurm_conf, layout.client_bin_dir):
        resume_our_stale_states(layout)
        progress(f"waiting up to {wait_s:g} s for every node to be idle")
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
        for candidate in {pid, pids.get(name)} - {None}:     # each only if still this cluster's daemon
            daemons.stop_daemon(layout, name, candidate)
    for node in layout.node_names:
        kill_namespace(layout, node)
        degrade.restore(layout, node)
    _remove_stale_job_cgroups(layout, top=True)
    for name, pidfile, timeout_s in (("mariadbd", layout.run_dir / "mysqld" / "mysqld.pid", 60.0),
                                     ("munged", layout.munge_dir / "munged.pid", 15.0)):
        for candidate in {pids.get(name), daemons.read_pidfile(pidfile)} - {None}:
            daemons.stop_daemon(layout, name, candidate, timeout_s)
    netns.net_down(layout)
    if record_mod.etc_slurm_is(layout):
        ETC_SLURM_CONF.unlink()
    record_mod.unregister(layout)
    record["pids"] = {}
    record["net"] = False
    record["etc_slurm"] = None
    if layout.root.exists():
        save_record(layout, record)
    shutil.rmtree(node_files.node_memory_root(layout), ignore_errors=True)     # the nodes' memory goes with them
    if record.get("job_user"):      # and what the job user's runs outside a task kept in /dev/shm
        shutil.rmtree(node_beat.user_root(Path(node_beat.DEFAULT_NODE_LOCAL_DIR), jobuser.job_user(layout).uid),
                      ignore_errors=True)
    if purge:
        jobuser.remove(layout, record)
    if purge and layout.root.exists():
        shutil.rmtree(layout.root)


def _remove_stale_job_cgroups(layout: MiniClusterLayout, *, top: bool) -> None:
    """The job cgroups a killed slurmd left (jobcgroups.py says why they break the next cluster) on
    nodes whose slurmd is not running. Beside other mini-clusters (their nodes have the same names)
    only this cluster's own job ids (its slot's range; a new cluster in the same slot starts at the
    same id again; none without a record of its own); alone, everything below its nodes' dirs."""
    if not layout.cgroups:
        return
    alone = not any(entry["name"] != layout.name for entry in registered())
    ours = jobcgroups.own_job_ids(layout.first_job_id, JOB_IDS_PER_SLOT, beside_others=not alone,
                                  recorded=layout.record_file.exists())
    for node in layout.node_names:
        if not daemons.pid_alive(daemons.read_pidfile(layout.slurmd_pidfile(node))):
            jobcgroups.remove_job_cgroups(node, top=top and alone, job_ids=ours)


# ---- status ------------------------------------------------------------------------
def node_rows(nodes: List[slurm.NodeInfo]) -> List[Dict[str, str]]:
    """What `status` shows of each node (its --json)."""
    return [{"node": n.name, "state": n.display_state, "gres": n.gres, "reason": n.reason or ""} for n in nodes]


def format_table(nodes: List[slurm.NodeInfo]) -> str:
    rows = [("NODE", "STATE", "GRES", "REASON")]
    rows += [(row["node"], row["state"], row["gres"], row["reason"] or "-") for row in node_rows(nodes)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)


def cluster_rows() -> List[Dict[str, str]]:
    """Every registered cluster: name, slot, subnet, nodes, state (up or stopped), state dir."""
    rows = []
    for entry in registered():
        layout = layout_from_record(Path(entry["state_dir"]), entry["name"])
        alive = daemons.pid_alive(daemons.read_pidfile(layout.run_dir / "slurmctld.pid"))
        rows.append({"name": layout.name, "slot": str(layout.slot), "subnet": layout.subnet,
                     "nodes": layout.nodelist, "state": "up" if alive else "stopped", "state_dir": str(layout.root)})
    return rows


def format_list() -> str:
    """NAME SLOT SUBNET NODES STATE STATE_DIR for every registered cluster."""
    rows: List[Tuple[str, ...]] = [("NAME", "SLOT", "SUBNET", "NODES", "STATE", "STATE_DIR")]
    rows += [tuple(row.values()) for row in cluster_rows()]
    widths = [max(len(row[col]) for row in rows) for col in range(5)]
    return "\n".join("  ".join(f"{row[col]:<{widths[col]}}" for col in range(5)) + "  " + row[5] for row in rows)


def format_env(layout: MiniClusterLayout) -> str:
    """`export` lines a shell evaluates to address this cluster with Slurm's own commands."""
    lines = [f"export SLURM_CONF={shlex.quote(str(layout.slurm_conf))}"]
    if layout.client_bin_dir:
        lines.append(f"export PATH={shlex.quote(str(layout.client_bin_dir))}:\"$PATH\"")
    return "\n".join(lines)


def default_controller_host() -> str:
    return socket.gethostname().split(".")[0]
