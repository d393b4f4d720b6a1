#!/usr/bin/env python3
"""Write the reference pages that are generated from the code, so they cannot drift from it:

    docs/job-spec.md       every key of a job spec, its default, what it does (slurmtools/spec.py)
    docs/health-config.md  every key of health.yaml's settings, likewise (slurmtools/health/config.py)
    docs/cli.md            every command's --help (slurmtools/cli.py and the command modules)

    python3 scripts/gen-reference.py        # from the repository's root; rewrites the three pages

tests/unit/test_reference_pages.py fails when a page and the code differ.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout, installed or not

GENERATED = "This page is generated from the code: `python3 scripts/gen-reference.py`; a unit test fails when the two differ."


def cell(text: str) -> str:
    """One table cell: pipes escaped, line breaks folded."""
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: List[Tuple[str, str, str]]) -> str:
    lines = ["| key | default | what it does |", "|---|---|---|"]
    lines += [f"| `{key}` | `{cell(default)}` | {cell(doc)} |" for key, default, doc in rows]
    return "\n".join(lines) + "\n"


def job_spec_page() -> str:
    from slurmtools.spec import field_docs
    return f"""# Job spec reference

Every key of a job spec (the YAML file `render`, `submit` and the notebook path read, or the same
keys as a Python dict), its default and what it does. Nested keys are written with a dot: in YAML,
`requeue.max_restarts: 20` is

```yaml
requeue:
  max_restarts: 20
```

{GENERATED}

{table(field_docs())}"""


def health_config_page() -> str:
    from slurmtools.common.schema import field_docs
    from slurmtools.health.config import NodeSettings
    return f"""# Health config reference

Every setting of `/etc/slurmtools/health.yaml` (etc/health.yaml is a commented example), its
default and what it does. Each goes under `defaults:` for every node, or under a `hosts:` entry
(`match: "gpu[001-064]"`) for some; nested keys are written with a dot. Check a config with
`slurmtools health check-config --node NAME`.

{GENERATED}

{table(field_docs(NodeSettings))}"""


def _commands(parser: argparse.ArgumentParser, path: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:                       # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, path + (name,))


def cli_page() -> str:
    """Each command's help as `slurmtools ... --help` prints it at 100 columns, with what depends on
    the machine (this checkout's path, the environment's cluster name and base dir) as documented."""
    from slurmtools import cli
    from slurmtools.minicluster import command as minicluster_command, layout
    saved_env = {name: os.environ.pop(name) for name in ("COLUMNS", "SLURMTOOLS_MINICLUSTER_NAME")
                 if name in os.environ}
    saved = (minicluster_command.REPO_ROOT, layout.BASE_DIR)
    os.environ["COLUMNS"] = "100"
    minicluster_command.REPO_ROOT, layout.BASE_DIR = Path("<checkout>"), Path("/var/lib/slurmtools/minicluster")
    try:
        parts = [f"## slurmtools {' '.join(path)}".rstrip() + f"\n\n```\n{parser.format_help().rstrip()}\n```\n"
                 for path, parser in _commands(cli.build_parser())]
    finally:
        minicluster_command.REPO_ROOT, layout.BASE_DIR = saved
        del os.environ["COLUMNS"]
        os.environ.update(saved_env)
    return "# Command reference\n\nEvery command's `--help`. " + GENERATED + "\n\n" + "\n".join(parts)


PAGES: Dict[str, Callable[[], str]] = {"docs/job-spec.md": job_spec_page, "docs/health-config.md": health_config_page,
                                       "docs/cli.md": cli_page}

if __name__ == "__main__":
    for page, render in PAGES.items():
        (ROOT / page).write_text(render())
        print(f"wrote {page}")
