#!/usr/bin/env python3
"""Write the reference pages that are generated from the code, so they cannot drift from it:

    docs/job-spec.md       every key of a job spec, its default, what it does (slurmtools/spec.py)
    docs/health-config.md  every key of health.yaml's settings, likewise (slurmtools/health/config.py)
    docs/cli.md            every command's --help (slurmtools/cli.py and the command modules)
    docs/environment.md    every SLURMTOOLS_* variable (the comment beside its constant) and exit code
    docs/control-dir.md    the control dir's layout (slurmtools/common/control_dir.py's docstring)
    docs/python-api.md     the public Python API: signatures and docstrings, read from the source

    python3 scripts/gen-reference.py        # from the repository's root; rewrites the three pages

tests/unit/test_reference_pages.py fails when a page and the code differ.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

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


def comment_of(lines: List[str], lineno: int) -> str:
    """The comment a constant carries: beside it on its line, else the comment lines right above."""
    line = lines[lineno - 1]
    if "  # " in line:
        return line.split("  # ", 1)[1].strip()
    above: List[str] = []
    for previous in reversed(lines[:lineno - 1]):
        if not previous.lstrip().startswith("#"):
            break
        above.insert(0, previous.strip().lstrip("#").strip())
    return " ".join(above)


def string_constants(path: Path) -> Iterator[Tuple[str, str, str]]:
    """(name, value, comment) of each module-level string constant of a source file."""
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            yield node.targets[0].id, node.value.value, comment_of(lines, node.lineno)


def environment_page() -> str:
    """Every variable slurmtools reads or sets, found as a `SLURMTOOLS_*` constant of its source: a
    variable whose constant carries no comment is an error here (its page would not say what it is)."""
    rows = []
    for path in sorted((ROOT / "slurmtools").rglob("*.py")):
        for name, value, comment in string_constants(path):
            if value.startswith("SLURMTOOLS_"):
                if not comment:
                    raise SystemExit(f"{path.relative_to(ROOT)}: {name} has no comment to document {value}")
                rows.append(f"| `{value}` | `{path.relative_to(ROOT)}` | {cell(comment)} |")
    lines = (ROOT / "slurmtools" / "errors.py").read_text().splitlines()
    from slurmtools.errors import Exit
    codes = [f"| {code.value} | `{code.name}` | {cell(comment_of(lines, _line_of(lines, code.name)))} |"
             for code in Exit]
    return f"""# Environment variables and exit codes

{GENERATED}

## Environment variables

The generated script, the supervisor and the notebook path set most of these for every rank; a
trainer reads them through `slurmtools.runtime`. A site or a test sets the rest.

| variable | defined in | what it is |
|---|---|---|
""" + "\n".join(sorted(rows)) + f"""

## Exit codes

Every command exits with one of these (`slurmtools.errors.Exit`); an error is one line on stderr,
and with `--json` also `{{"error": ..., "exit_code": ...}}` on stdout.

| code | name | meaning |
|---|---|---|
""" + "\n".join(codes) + "\n"


def _line_of(lines: List[str], name: str) -> int:
    return next(number for number, line in enumerate(lines, 1) if line.strip().startswith(f"{name} = "))


def control_dir_page() -> str:
    tree = ast.parse((ROOT / "slurmtools" / "common" / "control_dir.py").read_text())
    return f"""# The control dir

Where the generated script, the supervisor, the notebook path and every rank of a job meet
(`slurmtools/common/control_dir.py`, the one contract between them). {GENERATED}

```text
{ast.get_docstring(tree)}
```
"""


# the public API: (how a user imports it, the file that defines it, its names there)
API: List[Tuple[str, str, Tuple[str, ...]]] = [
    ("slurmtools.runtime", "slurmtools/train/control.py", ("TrainingControl",)),
    ("slurmtools.train.agreement", "slurmtools/train/agreement.py", ("RequestAgreement",)),
    ("slurmtools.checkpoint", "slurmtools/checkpoint/manager.py", ("CheckpointManager", "Checkpoint", "verify_dir")),
    ("slurmtools.integrations.lightning", "slurmtools/integrations/lightning.py", ("SlurmtoolsCallback", "resume_path")),
    ("slurmtools.integrations.lightning_inplace", "slurmtools/integrations/lightning_inplace.py",
     ("RankEnvironment", "fit")),
    ("slurmtools.integrations.transformers", "slurmtools/integrations/transformers.py",
     ("SlurmtoolsTrainerCallback", "resume_path")),
    ("slurmtools.notebook", "slurmtools/job/notebook.py", ("executor", "executor_parameters", "load", "status",
                                                           "JobStatus", "CheckpointableTrainer", "TinyFSDPJob")),
    ("slurmtools.spec", "slurmtools/spec.py", ("load_spec", "spec_from_dict", "JobSpec")),
    ("slurmtools.train.inplace", "slurmtools/train/inplace.py", ("start", "run")),
]
Defined = Union[ast.FunctionDef, ast.ClassDef]


def _signature(node: Union[ast.FunctionDef, ast.AsyncFunctionDef], drop_self: bool) -> str:
    args = node.args
    if drop_self and args.args and args.args[0].arg in ("self", "cls"):
        args = ast.arguments(posonlyargs=args.posonlyargs, args=args.args[1:], vararg=args.vararg,
                             kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                             defaults=args.defaults[-len(args.args) + 1:] if len(args.defaults) >= len(args.args)
                             else args.defaults)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"({ast.unparse(args)}){returns}"


def _doc(node: Defined) -> str:
    return ast.get_docstring(node) or ""


def _entry(module: str, node: Defined) -> str:
    if isinstance(node, ast.ClassDef):
        out = [f"### `{module}.{node.name}`\n", _doc(node) + "\n"]
        for item in node.body:
            # the constructor, and each public method that says what it does (a framework's hook
            # that only implements the framework's contract has no docstring of its own)
            if isinstance(item, ast.FunctionDef) and (item.name == "__init__" or (
                    not item.name.startswith("_") and _doc(item))):
                said = " ".join(_doc(item).split())
                if "property" in {ast.unparse(d) for d in item.decorator_list}:
                    shown = f"`{item.name}` (property)"
                elif item.name == "__init__":
                    shown = f"`{node.name}{_signature(item, True)}`"
                else:
                    shown = f"`{item.name}{_signature(item, True)}`"
                out.append(f"- {shown}: {said}" if said else f"- {shown}")
        return "\n".join(out).rstrip() + "\n"
    return f"### `{module}.{node.name}{_signature(node, False)}`\n\n{_doc(node)}\n"


def python_api_page() -> str:
    parts = []
    for module, source, names in API:
        defined: Dict[str, Defined] = {node.name: node for node in ast.parse((ROOT / source).read_text()).body
                                       if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        missing: Optional[str] = next((name for name in names if name not in defined), None)
        if missing:
            raise SystemExit(f"{source}: no {missing} (scripts/gen-reference.py's API list)")
        parts.append(f"## `{module}`\n\n" + "\n".join(_entry(module, defined[name]) for name in names))
    return f"""# Python API

What a trainer, a notebook or a script imports from slurmtools: each name with its signature and
docstring, read from the source. {GENERATED} Everything else is internal and may change.

""" + "\n".join(parts)


PAGES: Dict[str, Callable[[], str]] = {"docs/job-spec.md": job_spec_page, "docs/health-config.md": health_config_page,
                                       "docs/cli.md": cli_page, "docs/environment.md": environment_page,
                                       "docs/control-dir.md": control_dir_page, "docs/python-api.md": python_api_page}

if __name__ == "__main__":
    for page, render in PAGES.items():
        (ROOT / page).write_text(render())
        print(f"wrote {page}")
