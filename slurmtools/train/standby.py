"""A warm standby on a spare node, and one on each training node (docs/recovery.md, "In place"):
started with the step, as the step's own command would be, it imports torch and the trainer
script's own imports, then waits for the supervisor's go (the control dir's standby-<host>.json:
the generation, the first rank of the block it takes, the world, the first local rank: a rank
restarted on its node keeps its own), or for training's end (then it exits 0). On the go it
becomes that block's rank: the environment the wrapper would have given a replacement, then the
script run as __main__ in this process. A replacement so skips its start (srun, the interpreter,
the imports): seconds on a loaded node, minutes from a shared file system at thousands of ranks.

    python -m slurmtools.train.standby SCRIPT [ARGS...]     (as a task of the standby step)
"""
from __future__ import annotations

import ast
import importlib
import os
import runpy
import socket
import sys
import time
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

from slurmtools.common.control_dir import (COMPLETE_FILE, CONTROL_DIR_ENV, GENERATION_ENV, LOCAL_RANK_BASE_ENV,
                                           RANK_BASE_ENV, WORLD_SIZE_ENV)
from slurmtools.common.fsutil import read_small_regular
from slurmtools.common.generation import go_file, parse_go
from slurmtools.common.import_pause import collector_paused
from slurmtools.errors import UsageError

# how often a standby looks for its go (a stat of one file, on the control dir's file system: 8 spares
# of 8 ranks make 320 a second)
GO_POLL_S = 0.2


def _module_level(statements: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at a module's top: its body's, and those of its with and try blocks
    (imports under `with collector_paused():`, or a try of an optional import)."""
    for node in statements:
        if isinstance(node, (ast.With, ast.Try)):
            yield from _module_level(node.body)
        else:
            yield node


def top_level_imports(script: Path) -> List[str]:
    """The modules the script imports at its top (absolute imports only), in order."""
    tree = ast.parse(script.read_text(), str(script))
    names: List[str] = []
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module != "__future__":
            names.append(node.module)
    return names


# what every replacement would import anyway: torch, and torch._dynamo, which torch imports
# only on the first call of a function it keeps out of compilation (DTensor.from_local: a
# trainer's first fully_shard): measured 0.4-0.6 s of a replacement's model build, 0.02 s after
TORCH_MODULES = ("torch", "torch.distributed", "torch._dynamo")


def warm(script: Path) -> None:
    """torch and the script's own imports, as its run would import them (its directory first on
    sys.path); one that fails is left for the run itself to report."""
    sys.path.insert(0, str(script.parent))
    with collector_paused():
        for name in [*TORCH_MODULES, *top_level_imports(script)]:
            try:
                importlib.import_module(name)
            except Exception:             # noqa: BLE001  # the trainer's own run says it, in its words
                continue


def wait_for_go(path: Path, done: Path) -> Optional[Tuple[int, int, int, int]]:
    """Block until the go file is there and whole (a file that is no go is an error), or until
    training completed (done: the complete marker; None, nothing to take)."""
    while True:
        if done.exists():
            return None
        raw = read_small_regular(path, 4096) if path.exists() else None
        if raw is not None:
            try:
                return parse_go(raw.decode())
            except (ValueError, UnicodeDecodeError) as exc:
                raise UsageError(f"{path} is no go: {exc}") from None
        time.sleep(GO_POLL_S)


def become(go: Tuple[int, int, int, int], environ: "os._Environ[str]") -> None:
    """The environment a replacement rank of that block gets (the srun wrapper's, told its bases)."""
    number, rank_base, world, local_base = go
    task = int(environ.get("SLURM_LOCALID", "0"))
    environ.update({GENERATION_ENV: str(number), RANK_BASE_ENV: str(rank_base), WORLD_SIZE_ENV: str(world),
                    LOCAL_RANK_BASE_ENV: str(local_base), "RANK": str(rank_base + task),
                    "LOCAL_RANK": str(local_base + task), "WORLD_SIZE": str(world)})


def main(argv: Optional[Sequence[str]] = None, environ: Mapping[str, str] = os.environ) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].endswith(".py"):
        print("slurmtools.train.standby: error: usage: python -m slurmtools.train.standby SCRIPT.py [ARGS...]",
              file=sys.stderr)
        return 2
    control = environ.get(CONTROL_DIR_ENV, "")
    if not control:
        print(f"slurmtools.train.standby: error: {CONTROL_DIR_ENV} is not set", file=sys.stderr)
        return 2
    script = Path(args[0]).resolve()
    try:
        warm(script)
        go = wait_for_go(go_file(Path(control), environ.get("SLURMD_NODENAME") or socket.gethostname()),
                         Path(control) / COMPLETE_FILE)
    except (OSError, SyntaxError, UsageError) as exc:
        print(f"slurmtools.train.standby: error: {exc}", file=sys.stderr)
        return 2
    if go is None:                     # training completed without needing this standby
        return 0
    become(go, os.environ)
    sys.argv = [str(script), *args[1:]]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
