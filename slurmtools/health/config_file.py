"""Where the health config is, and reading it as root: only a root-owned file, not group/world
writable, in a directory of the same kind, read from one open file (checked with fstat)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from slurmtools.common.schema import MAX_YAML_BYTES
from slurmtools.errors import ConfigError

DEFAULT_PATH = Path("/etc/slurmtools/health.yaml")
CONFIG_ENV = "SLURMTOOLS_HEALTH_CONFIG"  # the health config's path, not /etc/slurmtools/health.yaml
BESIDE_SLURM_CONF = "slurmtools-health.yaml"
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")


def find_config_path(explicit: Optional[str] = None) -> Optional[Path]:
    """--config, then $SLURMTOOLS_HEALTH_CONFIG, then slurmtools-health.yaml beside slurm.conf
    ($SLURM_CONF, which Slurm sets in prologs, else /etc/slurm/slurm.conf, symlinks resolved: a
    per-cluster config), then /etc/slurmtools/health.yaml."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    slurm_conf = Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    try:
        beside = slurm_conf.resolve().parent / BESIDE_SLURM_CONF
    except OSError:
        beside = slurm_conf.parent / BESIDE_SLURM_CONF
    if beside.exists():
        return beside
    return DEFAULT_PATH if DEFAULT_PATH.exists() else None


def _refuse_untrusted(info: os.stat_result, what: str, path: Path) -> None:
    if info.st_uid != 0:
        raise ConfigError(f"refused: owned by uid {info.st_uid}, not root ({what}; it decides which nodes drain)",
                          file=str(path))
    if info.st_mode & 0o022:
        raise ConfigError(f"refused: group/world writable ({what}, mode {oct(info.st_mode & 0o777)})", file=str(path))


def read_trusted(path: Path) -> str:
    """The config's text, read from one open file: as root that file (fstat of the open fd, so it
    cannot be swapped between the check and the read) and its directory must be root-owned and
    not group/world writable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("no such file", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("not a regular file", file=str(path))
        if os.geteuid() == 0:
            _refuse_untrusted(info, "the file", path)
            _refuse_untrusted(os.stat(os.path.dirname(os.path.realpath(path))), "its directory", path)
        raw = handle.read(MAX_YAML_BYTES + 1)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(path)) from None
