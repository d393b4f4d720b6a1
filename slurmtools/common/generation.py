"""The generation file of in-place recovery (docs/recovery.md): the supervisor's word on the process
group the ranks form next (its number, world size and the store to meet on), written whole into
the control dir, and read by every rank (train/inplace.py). No torch here: the supervisor writes it.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Tuple

from slurmtools.common.control_dir import (GENERATION_ENV, GENERATION_FILE, GENERATION_FORMED_PREFIX,
                                           GROUP_BROKEN_PREFIX, STANDBY_GO_PREFIX)
from slurmtools.common.fsutil import read_small_regular, write_json_atomic
from slurmtools.errors import UsageError, one_line


@dataclass(frozen=True)
class Generation:
    """A process group the ranks form in place: its number (1, 2, ... within an attempt), its
    world size, and the store every rank meets on (one that outlives the lost node)."""
    number: int
    world: int
    store_host: str
    store_port: int

    @classmethod
    def parse(cls, text: str) -> "Generation":
        """From generation.json; ValueError naming what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"number", "world", "store_host", "store_port"}:
            raise ValueError("expected number, world, store_host and store_port")
        number, world, host, port = data["number"], data["world"], data["store_host"], data["store_port"]
        if not (isinstance(number, int) and number > 0 and isinstance(world, int) and world > 0
                and isinstance(host, str) and host and isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"out of range: {data}")
        return cls(number, world, host, port)


def write(control_dir: Path, generation: Generation) -> None:
    """The supervisor's word: written whole (renamed into place), read by every rank."""
    write_json_atomic(control_dir / GENERATION_FILE, asdict(generation), durable=False)


def read(control_dir: Path) -> Optional[Generation]:
    """The newest generation written, or None (none yet, or a file that is not one: said)."""
    raw = read_small_regular(control_dir / GENERATION_FILE, 4096)
    if raw is None:
        return None
    try:
        return Generation.parse(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"slurmtools: {control_dir / GENERATION_FILE} is no generation: {one_line(str(exc))}", file=sys.stderr,
              flush=True)
        return None


def current(environ: Mapping[str, str] = os.environ) -> int:
    """The generation this process runs in (0: its first group)."""
    text = environ.get(GENERATION_ENV, "0") or "0"
    if not text.isdigit():
        raise UsageError(f"{GENERATION_ENV} must be a generation number, got {text!r}")
    return int(text)


def wait_for_next(control_dir: Path, after: int, wait_s: float, poll_s: float = 0.1) -> Optional[Generation]:
    """The first generation newer than `after` written within wait_s, or None."""
    deadline = time.monotonic() + wait_s
    while True:
        generation = read(control_dir)
        if generation is not None and generation.number > after:
            return generation
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def report_broken(control_dir: Path, number: int, host: str, error: str) -> None:
    """A node's word that its ranks' group of generation `number` broke, written before they wait:
    the supervisor looks for the lost node now, not after the node timeout. Never fails a rank."""
    name = f"{GROUP_BROKEN_PREFIX}{number}.{_UNSAFE.sub('_', host)[:200]}.json"
    try:
        write_json_atomic(control_dir / name, {"generation": number, "host": host, "error": error[:500]},
                          durable=False)
    except OSError as exc:
        print(f"slurmtools: cannot report the broken group in {control_dir}: {exc.strerror}", file=sys.stderr,
              flush=True)


def broken_reports(control_dir: Path, number: int) -> int:
    """How many nodes said generation `number`'s group broke (their files; a writer's temp file is none)."""
    prefix = f"{GROUP_BROKEN_PREFIX}{number}."
    try:
        return sum(1 for entry in os.scandir(control_dir) if entry.name.startswith(prefix)
                   and entry.name.endswith(".json"))
    except OSError:
        return 0


def report_formed(control_dir: Path, number: int) -> None:
    """Rank 0's word that generation `number`'s group formed (its init returns once every rank
    joined): the supervisor stops waiting for it. Never fails a rank."""
    try:
        write_json_atomic(control_dir / f"{GENERATION_FORMED_PREFIX}{number}.json", {"generation": number},
                          durable=False)
    except OSError as exc:
        print(f"slurmtools: cannot report the formed group in {control_dir}: {exc.strerror}", file=sys.stderr,
              flush=True)


def formed(control_dir: Path, number: int) -> bool:
    return (control_dir / f"{GENERATION_FORMED_PREFIX}{number}.json").is_file()


def go_file(control_dir: Path, host: str) -> Path:
    """Where the supervisor gives host's warm standby its go (train/standby.py)."""
    return control_dir / f"{STANDBY_GO_PREFIX}{_UNSAFE.sub('_', host)[:200]}.json"


def write_go(control_dir: Path, host: str, number: int, rank_base: int, world: int, local_base: int = 0) -> None:
    """The go: host's standby becomes the ranks from rank_base (its tasks' local ranks from
    local_base: a rank restarted on its own node keeps its local rank), in generation number."""
    write_json_atomic(go_file(control_dir, host), {"generation": number, "rank_base": rank_base, "world": world,
                                                   "local_base": local_base}, durable=False)


def parse_go(text: str) -> Tuple[int, int, int, int]:
    """(generation, first rank, world, first local rank) from a go file; ValueError naming what is wrong."""
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {"generation", "rank_base", "world", "local_base"}:
        raise ValueError("expected generation, rank_base, world and local_base")
    values = data["generation"], data["rank_base"], data["world"], data["local_base"]
    if not (all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            and values[0] > 0 and 0 <= values[1] < values[2] and 0 <= values[3] < values[2]):
        raise ValueError(f"out of range: {data}")
    return values[0], values[1], values[2], values[3]
