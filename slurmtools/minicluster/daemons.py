"""Start and stop the mini-cluster's daemons, each tracked by pid so `down` stops only what `up` started."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster.layout import MiniClusterLayout
from slurmtools.minicluster.sysrun import run

def daemon_alive(name: str, pid: Optional[int]) -> bool:
    """The daemon `name` (mariadbd, munged, slurmdbd, slurmctld, slurmd-<node>) still runs as pid:
    alive and its program is that daemon. pid numbers wrap (pid_max 32768 here): one freed by a
    stopped daemon is soon another process's (R38: a kernel worker took a stopped slurmd's)."""
    if not pid_alive(pid):
        return False
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return program == name.split("-")[0][:15]


def pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pidfile(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise MiniClusterError(f"{what} not ready after {timeout_s:g} s")


def is_ours(layout: MiniClusterLayout, name: str, pid: Optional[int]) -> bool:
    """pid still runs the daemon `name` that this cluster started: its program is that daemon
    (daemon_alive) and its command line or environment names this cluster's state dir (a Slurm
    daemon's SLURM_CONF, MariaDB's --datadir, munged's --socket). A stopped or killed daemon's pid
    is soon another process's (pid_max 32768, hundreds of processes a minute in the test command):
    R131's 128-node cluster, going down, sent SIGTERM to the pid its killed node's slurmd had had,
    by then another lane's srun, whose job failed."""
    if not daemon_alive(name, pid):
        return False
    marker = (str(layout.root).rstrip("/") + "/").encode()
    for part in ("cmdline", "environ"):
        try:
            if marker in Path(f"/proc/{pid}/{part}").read_bytes():
                return True
        except OSError:
            return False
    return False


def stop_daemon(layout: MiniClusterLayout, name: str, pid: Optional[int], timeout_s: float = 15.0) -> None:
    """SIGTERM, wait, then SIGKILL, each only while pid is still this cluster's daemon `name`
    (is_ours): a daemon that ignores TERM still goes, a pid another process has taken is left alone."""
    if not is_ours(layout, name, pid):
        return
    assert pid is not None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    if is_ours(layout, name, pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def daemon_env(layout: MiniClusterLayout) -> Dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "SLURM_CONF": str(layout.slurm_conf), "LANG": "C.UTF-8"}
    env.update(layout.extra_env)
    return env


# ---- MariaDB ---------------------------------------------------------------
def db_password(layout: MiniClusterLayout) -> str:
    path = layout.etc_dir / "db-password"
    if not path.exists():
        path.write_text(secrets.token_hex(12))
        path.chmod(0o600)
    return path.read_text().strip()


def untraversable_parent(path: Path) -> Optional[Path]:
    """The first existing ancestor that other users cannot enter (MariaDB runs as `mysql`)."""
    for parent in reversed(path.resolve().parents):
        if parent.exists() and not parent.stat().st_mode & 0o001:
            return parent
    return None


def start_mariadb(layout: MiniClusterLayout) -> Optional[int]:
    """Our own MariaDB data dir and port (127.0.0.1 only): never touches a system database."""
    blocked = untraversable_parent(layout.root)
    if blocked is not None:
        raise MiniClusterError(f"MariaDB runs as user mysql and cannot reach {layout.root}: {blocked} is not "
                               "world-traversable; choose a --state-dir under /var/lib or /var/tmp")
    sock_dir = layout.run_dir / "mysqld"
    sock_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(sock_dir, "mysql", "mysql")
    pidfile = sock_dir / "mysqld.pid"
    if pid_alive(read_pidfile(pidfile)):
        return None
    if not (layout.db_dir / "mysql").exists():
        layout.db_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(layout.db_dir, "mysql", "mysql")
        run(layout.command(["/usr/bin/mariadb-install-db", "--user=mysql", f"--datadir={layout.db_dir}",
             "--auth-root-authentication-method=socket", "--skip-test-db"]), timeout_s=180)
    # start-stop-daemon (dpkg) detaches it properly: own session, no parent waiting on it. It is
    # matched by this cluster's pid file only: another MariaDB (the machine's own, another
    # cluster's) is never taken for this one.
    pidfile.unlink(missing_ok=True)
    run(layout.command(["/usr/sbin/start-stop-daemon", "--start", "--background", "--output", str(layout.log_dir / "mariadb.out"),
         "--pidfile", str(pidfile), "--exec", "/usr/sbin/mariadbd", "--",
         "--no-defaults", "--user=mysql", f"--datadir={layout.db_dir}",
         f"--socket={sock_dir}/mysqld.sock", f"--pid-file={pidfile}", "--bind-address=127.0.0.1",
         f"--port={layout.db_port}", f"--log-error={layout.log_dir}/mariadb.err",
         "--innodb-buffer-pool-size=512M", "--innodb-lock-wait-timeout=900", "--skip-name-resolve"]))
    wait_for(lambda: port_open("127.0.0.1", layout.db_port) and pid_alive(read_pidfile(pidfile)), 120,
             f"MariaDB (see {layout.log_dir}/mariadb.err)")
    password = db_password(layout)
    # the database made here, not by slurmdbd: slurmdbd 24.11 creating it with MariaDB 11.8's
    # Connector/C reuses the failed connection's handle and dies on its first query
    # ("Number of columns in result (=1) set execeeds maxmimum allowed number of columns (=0)")
    sql = ("CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
           f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
           "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';")
    run(layout.command(["/usr/bin/mariadb", "--no-defaults", f"--socket={sock_dir}/mysqld.sock", "-u", "root", "-e",
                        sql]))
    return read_pidfile(pidfile)


# ---- munge -----------------------------------------------------------------
def munge_works(layout: MiniClusterLayout) -> bool:
    try:
        proc = subprocess.run(layout.command(["/usr/bin/munge", "-n", f"--socket={layout.munge_socket}"]),
                              capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def start_munged(layout: MiniClusterLayout) -> Optional[int]:
    """This cluster's own munged: its own key, socket, pid and log (the machine's munged, if any,
    is never used or touched). munged runs as user munge and insists on owning its files."""
    pidfile = layout.munge_dir / "munged.pid"
    if pid_alive(read_pidfile(pidfile)) and munge_works(layout):
        return None
    layout.munge_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(layout.munge_dir, "munge", "munge")
    layout.munge_dir.chmod(0o755)          # munged: its socket dir must be reachable by every client
    key = layout.munge_dir / "munge.key"
    if not key.exists() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    pidfile.unlink(missing_ok=True)
    run(layout.command(["/usr/sbin/runuser", "-u", "munge", "--", "/usr/sbin/munged", f"--socket={layout.munge_socket}",
         f"--key-file={key}", f"--pid-file={pidfile}", f"--log-file={layout.munge_dir / 'munged.log'}",
         f"--seed-file={layout.munge_dir / 'munged.seed'}"]))
    wait_for(lambda: munge_works(layout), 15, f"munged (see {layout.munge_dir}/munged.log)")
    return read_pidfile(pidfile)


# ---- Slurm daemons ---------------------------------------------------------
def _start_listener(layout: MiniClusterLayout, daemon: str, host: str, port: int) -> Optional[int]:
    """Start a self-daemonizing Slurm daemon unless its pid file names a live one; wait for its port."""
    pidfile = layout.run_dir / f"{daemon}.pid"
    if pid_alive(read_pidfile(pidfile)):
        return None
    run(layout.command([f"/usr/sbin/{daemon}"]), env=daemon_env(layout))
    wait_for(lambda: port_open(host, port), 30, f"{daemon} (port {port})")
    return read_pidfile(pidfile)


def start_slurmdbd(layout: MiniClusterLayout) -> Optional[int]:
    return _start_listener(layout, "slurmdbd", layout.controller_addr, layout.slurmdbd_port)


def start_slurmctld(layout: MiniClusterLayout) -> Optional[int]:
    return _start_listener(layout, "slurmctld", layout.controller_addr, layout.slurmctld_port)


def start_slurmd(layout: MiniClusterLayout, node: str) -> Optional[int]:
    """slurmd in the node's network namespace, a fresh UTS namespace (hostname = node name) and
    a private mount namespace whose /etc/hosts is the cluster's own (jobs inherit all three).

    nsenter, not `ip netns exec`: the latter remounts /sys and slurmd 22.05 then fails to
    find /sys/fs/cgroup (`error: No filesystem mounted on /sys/fs/cgroup`). `unshare --mount`
    copies the mount table, /sys/fs/cgroup included, and only /etc/hosts is bound over.
    """
    pidfile = layout.slurmd_pidfile(node)
    if pid_alive(read_pidfile(pidfile)):
        return None
    layout.slurmd_spool_dir(node).mkdir(parents=True, exist_ok=True)
    pidfile.unlink(missing_ok=True)
    run(["nsenter", f"--net=/run/netns/{layout.netns(node)}", "unshare", "--uts", "--mount", "--propagation",
         "private", "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"', "sh",
         str(layout.hosts_file), node, *layout.command(["/usr/sbin/slurmd", "-N", node])], env=daemon_env(layout))
    wait_for(lambda: pid_alive(read_pidfile(pidfile)), 15, f"slurmd on {node}")
    return read_pidfile(pidfile)
