"""Which Slurm release a mini-cluster runs (pure): the releases Debian serves these machines,
the suite each comes from, and where its root filesystem and client wrappers live.

A release other than the host's runs from a Debian root filesystem built once with mmdebstrap
(debroot.py). Its daemons and every Slurm client command run with that root's /usr bound over
/usr in a private mount namespace: the nodes keep their network and UTS namespaces, the
project's Python (outside /usr) stays the same, and so do /etc's users and the state dirs.
Measured on this kind of machine: a minbase trixie or sid root with Slurm's daemons, client,
munge and MariaDB builds in 15-17 s (about 580 MB); sid's Release file as served here has
expired, so its validity check is relaxed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from slurmtools.slurm.parse import version_tuple


@dataclass(frozen=True)
class DebianSuite:
    suite: str
    relax_valid_until: bool = False    # the archive's Release file may have expired (sid here)


# Slurm release (major.minor) -> the Debian suite that ships it
RELEASES: Dict[str, DebianSuite] = {
    "22.05": DebianSuite("bookworm"),
    "24.11": DebianSuite("trixie"),
    "26.05": DebianSuite("sid", relax_valid_until=True),
}

# What a root needs: Slurm's daemons and client, munge, MariaDB, util-linux (unshare, with which an
# ordinary user maps itself back to its uid), and the shared libraries the project's Python and its
# extension modules (expat, ssl, ctypes, sqlite3, bz2, lzma, torch) load, which bind-mounting the
# root's /usr replaces. A root is rebuilt when this list changes (its stamp records it).
ROOT_PACKAGES = ("slurm-client", "slurmctld", "slurmd", "slurmdbd", "munge", "mariadb-server", "util-linux",
                 "libexpat1", "libssl3t64", "libffi8", "libsqlite3-0", "libbz2-1.0", "liblzma5", "zlib1g", "libuuid1",
                 "libstdc++6", "libgomp1")

# Every Slurm client command: the cluster's bin dir has one wrapper of each name.
CLIENT_COMMANDS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab",
                   "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")

DEFAULT_ARCHIVE = "http://deb.debian.org/debian"
ROOT_STAMP = ".slurmtools-root.json"


def release_of_version(version: str) -> str:
    """'22.05.8-4+deb12u1' or 'slurm-wlm 24.11.5' -> '22.05' (major.minor)."""
    found = version_tuple(version)
    if found is None:
        raise ValueError(f"not a Slurm version: {version!r}")
    return f"{found[0]:02d}.{found[1]:02d}"


def release_of_suite(os_release: str) -> Optional[str]:
    """The Slurm release the machine's Debian suite ships, from /etc/os-release's text."""
    match = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", os_release, re.MULTILINE)
    codename = match.group(1) if match else ""
    return next((rel for rel, suite in RELEASES.items() if suite.suite == codename), None)


def release_tuple(release: str) -> Tuple[int, int]:
    """'24.11' -> (24, 11)."""
    found = version_tuple(release)
    if found is None:
        raise ValueError(f"not a Slurm release: {release!r}")
    return found


def check_release(release: str) -> str:
    if release not in RELEASES:
        raise ValueError(f"unknown Slurm release {release!r}; choose one of {', '.join(RELEASES)}")
    return release


def deb822_uris(text: str) -> List[Tuple[str, str]]:
    """(uri, suites) of each deb822 stanza (`Types: deb`), in order."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        for line in stanza.splitlines():
            match = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
            if match and not line.startswith("#"):
                fields[match.group(1).lower()] = match.group(2)
        if "deb" in fields.get("types", "").split() and fields.get("uris"):
            out += [(uri, fields.get("suites", "")) for uri in fields["uris"].split()]
    return out


def one_line_uris(text: str) -> List[Tuple[str, str]]:
    """(uri, suite) of each `deb [opts] URI SUITE COMPONENTS` line."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
        if match:
            out.append((match.group(1), match.group(2)))
    return out


def archive_url(sources: Iterable[Tuple[str, str]]) -> str:
    """The host's Debian archive (the first http(s) source that is not the security archive),
    so a root comes from the same mirror the machine already reaches; else deb.debian.org."""
    for uri, suites in sources:
        if uri.startswith(("http://", "https://")) and "security" not in uri and "security" not in suites:
            return uri.rstrip("/")
    return DEFAULT_ARCHIVE


def mmdebstrap_argv(release: str, target: str, archive: str) -> List[str]:
    suite = RELEASES[check_release(release)]
    argv = ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet", f"--include={','.join(ROOT_PACKAGES)}"]
    if suite.relax_valid_until:
        argv.append('--aptopt=Acquire::Check-Valid-Until "false"')
    return argv + [suite.suite, target, archive]


def dpkg_version(status_text: str, package: str) -> Optional[str]:
    """The installed version of a package from a dpkg status file's text."""
    for stanza in status_text.split("\n\n"):
        if re.search(rf"^Package: {re.escape(package)}$", stanza, re.MULTILINE) and \
                re.search(r"^Status: install ok installed$", stanza, re.MULTILINE):
            match = re.search(r"^Version: (\S+)$", stanza, re.MULTILINE)
            return match.group(1) if match else None
    return None


def python_binds(base_prefix: str, version: Tuple[int, int]) -> List[str]:
    """What of the machine's /usr the project's Python needs inside a root, which replaces /usr:
    its standard library, when that Python is Debian's own (the .venv is made from
    /usr/bin/python3 with copies, so ordinary users can run it). A Python elsewhere (a build in
    /opt) needs nothing."""
    if base_prefix.rstrip("/") != "/usr":
        return []
    return [f"/usr/lib/python{version[0]}.{version[1]}"]


def render_in_root(root: str, binds: Sequence[str] = ()) -> str:
    """The script that runs a command from the root: /usr and the loader's cache bound over the
    machine's in a private mount namespace, the machine's paths in binds (under /usr) carried
    into it first. Inside a node (slurmd's namespace, a job) /usr is already the root's, and it
    just runs the command. An ordinary user (a job's owner submitting from the test side) cannot
    make a mount namespace of the machine's: it makes one in a user namespace of its own that maps
    it to root, binds there, then maps itself back to its own uid and gid, so Slurm and munge see
    exactly that user, as on a real login node."""
    steps = [f'mount --bind {path} "$0{path}"' for path in binds]
    steps += ['mount --rbind "$0/usr" /usr', 'mount --bind "$0/etc/ld.so.cache" /etc/ld.so.cache']
    mounts = " && ".join(steps)
    return "\n".join([
        "#!/bin/sh",
        "# Written by `slurmtools minicluster up`: run a command with this cluster's Slurm root as /usr.",
        f"root='{root}'",
        'if [ /usr/bin/scontrol -ef "$root/usr/bin/scontrol" ]; then exec "$@"; fi',
        f"mounts='{mounts}'",
        'if [ "$(id -u)" = 0 ]; then',
        "  exec unshare --mount --propagation private -- /bin/sh -c \"$mounts\"' && exec \"$@\"' \"$root\" \"$@\"",
        "fi",
        "exec unshare --user --map-root-user --mount --propagation private -- /bin/sh -c \"$mounts\"' && uid=$1 gid=$2 "
        "&& shift 2 && exec unshare --user --map-user=\"$uid\" --map-group=\"$gid\" -- \"$@\"' "
        "\"$root\" \"$(id -u)\" \"$(id -g)\" \"$@\"",
    ]) + "\n"


def render_client_wrapper(in_root: str, command: str) -> str:
    return f"#!/bin/sh\nexec '{in_root}' /usr/bin/{command} \"$@\"\n"
