"""RequeueSpec as `slurmtools run` flags: rendered into the sbatch script, parsed back on the node.

One source: each flag's name, type, default and choices come from a RequeueSpec field, so a
new setting is added to the spec alone; the values are validated by the spec's own rules.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, List, get_type_hints

from slurmtools.spec import RequeueSpec


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def render(requeue: RequeueSpec) -> List[str]:
    """`--name=value` for every setting (booleans as `--name` / `--no-name`), in field order."""
    argv = []
    for field in dataclasses.fields(RequeueSpec):
        value = getattr(requeue, field.name)
        if isinstance(value, bool):
            argv.append(flag(field.name) if value else "--no-" + field.name.replace("_", "-"))
        else:
            argv.append(f"{flag(field.name)}={value}")
    return argv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    hints = get_type_hints(RequeueSpec)
    for field in dataclasses.fields(RequeueSpec):
        kind = hints[field.name]
        help_text = field.metadata.get("doc", "")
        if kind is bool:
            parser.add_argument(flag(field.name), dest=field.name, action=argparse.BooleanOptionalAction,
                                default=field.default, help=help_text)
        else:
            parser.add_argument(flag(field.name), dest=field.name, type=kind, default=field.default,
                                choices=field.metadata.get("choices"), help=help_text)


def from_args(args: argparse.Namespace) -> RequeueSpec:
    """The parsed flags as a validated RequeueSpec (a bad value is a SpecError naming the flag's key)."""
    values: Dict[str, Any] = {field.name: getattr(args, field.name) for field in dataclasses.fields(RequeueSpec)}
    return RequeueSpec(**values)
