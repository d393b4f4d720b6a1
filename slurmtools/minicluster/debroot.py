"""Build (once) and use the Debian root a mini-cluster of another Slurm release runs from.

The root is built into `<state dir>/slurm-root.partial` and renamed into place only when it
is complete (Slurm of the asked release inside, a stamp written), so a failed or interrupted
build leaves nothing that a later `up` would take for a root; `up` reuses a complete one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from slurmtools.errors import MiniClusterError
from slurmtools.minicluster import release
from slurmtools.minicluster.layout import MiniClusterLayout

BUILD_TIMEOUT_S = 900.0
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def host_release() -> Optional[str]:
    """The Slurm release of the machine's own packages: the installed one, else the one its
    Debian suite ships (None: neither is known)."""
    try:
        proc = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "slurm-client"], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if proc.returncode == 0 and proc.stdout.strip():
            return release.release_of_version(proc.stdout.strip())
    except (OSError, ValueError):
        pass
    try:
        os_release = Path("/etc/os-release").read_text()
    except OSError:
        return None
    return release.release_of_suite(os_release)


def host_archive() -> str:
    sources = []
    for path in APT_SOURCES:
        files = sorted(path.glob("*")) if path.is_dir() else [path]
        for file in files:
            try:
                text = file.read_text()
            except OSError:
                continue
            sources += release.deb822_uris(text) if file.suffix == ".sources" else release.one_line_uris(text)
    return release.archive_url(sources)


def root_ready(root: Path, slurm_release: str) -> bool:
    try:
        stamp = json.loads((root / release.ROOT_STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("release") == slurm_release
            and stamp.get("packages") == list(release.ROOT_PACKAGES))


def ensure_root(layout: MiniClusterLayout) -> Optional[Path]:
    """The cluster's Slurm root, built if missing (None: the cluster runs the machine's Slurm)."""
    root = layout.slurm_root
    if root is None:
        return None
    if not root_ready(root, layout.slurm_release):
        build_root(root, layout.slurm_release)
    write_wrappers(layout)
    return root


def build_root(root: Path, slurm_release: str) -> None:
    suite = release.RELEASES[slurm_release].suite
    partial = root.with_name(root.name + ".partial")
    for leftover in (partial, root):
        if leftover.exists():
            shutil.rmtree(leftover)
    root.parent.mkdir(parents=True, exist_ok=True)
    if not shutil.which("mmdebstrap"):
        raise MiniClusterError("mmdebstrap not found: `apt-get install mmdebstrap` (up installs it unless --no-install)")
    argv = release.mmdebstrap_argv(slurm_release, str(partial), host_archive())
    try:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise MiniClusterError(f"building the Debian {suite} root for Slurm {slurm_release} took over "
                                   f"{BUILD_TIMEOUT_S:g} s; nothing kept") from None
        if proc.returncode != 0:
            raise MiniClusterError(f"building the Debian {suite} root for Slurm {slurm_release} failed "
                                   f"(mmdebstrap exited {proc.returncode}): {last_error(proc.stderr)}")
        try:
            status = (partial / "var/lib/dpkg/status").read_text()
        except OSError:
            status = ""
        version = release.dpkg_version(status, "slurm-client")
        if version is None or release.release_of_version(version) != slurm_release:
            raise MiniClusterError(f"Debian {suite} serves Slurm {version or 'nothing'} now, not {slurm_release}")
        (partial / release.ROOT_STAMP).write_text(json.dumps({"release": slurm_release, "suite": suite,
                                                              "slurm_version": version,
                                                              "packages": list(release.ROOT_PACKAGES)}) + "\n")
        os.rename(partial, root)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def last_error(stderr: str) -> str:
    """mmdebstrap's reason: its last `E:` line, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no output"])[-1][:300]


def write_wrappers(layout: MiniClusterLayout) -> List[Path]:
    """in-root and one wrapper per Slurm client command in the cluster's bin dir."""
    root = layout.slurm_root
    assert root is not None
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    written = []
    binds = release.python_binds(sys.base_prefix, (sys.version_info.major, sys.version_info.minor))
    for bind in binds:      # mount points, made here as root: a user's namespace cannot write the root
        (root / bind.lstrip("/")).mkdir(parents=True, exist_ok=True)
    scripts = {"in-root": release.render_in_root(str(root), binds)}
    scripts.update({cmd: release.render_client_wrapper(str(layout.in_root), cmd) for cmd in release.CLIENT_COMMANDS})
    for name, text in scripts.items():
        path = layout.bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
        written.append(path)
    return written
