"""Spec settings as `slurmtools run` flags: rendered into the sbatch script, parsed back on the node.

One source: each flag's name, type, default and choices come from a spec field (every
RequeueSpec field; JobSpec's preflight fields), so a new setting is added to the spec alone;
the values are validated by the spec's own rules.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Union, get_args, get_origin, get_type_hints

from slurmtools.preflight.judge import Settings
from slurmtools.spec import JobSpec, RequeueSpec

# JobSpec's preflight settings that `slurmtools run` takes (`preflight` itself: --[no-]preflight)
PREFLIGHT_FIELDS = ("preflight_budget_s", "preflight_slow_factor", "preflight_min_busbw_gbps")


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _fields(cls: Any, names: Optional[Sequence[str]]) -> List[Any]:
    return [field for field in dataclasses.fields(cls) if names is None or field.name in names]


def _render(obj: Any, names: Optional[Sequence[str]] = None) -> List[str]:
    argv = []
    for field in _fields(type(obj), names):
        value = getattr(obj, field.name)
        if isinstance(value, bool):
            argv.append(flag(field.name) if value else "--no-" + field.name.replace("_", "-"))
        elif value is not None:
            argv.append(f"{flag(field.name)}={value}")
    return argv


def render(requeue: RequeueSpec) -> List[str]:
    """`--name=value` for every setting (booleans as `--name` / `--no-name`), in field order."""
    return _render(requeue)


def render_preflight(spec: JobSpec) -> List[str]:
    """`--preflight` and its settings when the job checks its nodes first, else `--no-preflight`."""
    if not spec.preflight_enabled:
        return ["--no-preflight"]
    return ["--preflight", *_render(spec, PREFLIGHT_FIELDS)]


def _add(parser: argparse.ArgumentParser, cls: Any, names: Optional[Sequence[str]]) -> None:
    hints = get_type_hints(cls)
    for field in _fields(cls, names):
        kind = hints[field.name]
        if get_origin(kind) is Union:          # Optional[X]: the flag takes an X, absent means None
            kind = next(arg for arg in get_args(kind) if arg is not type(None))
        help_text = field.metadata.get("doc", "").replace("%", "%%")     # argparse formats help with %
        if kind is bool:
            parser.add_argument(flag(field.name), dest=field.name, action=argparse.BooleanOptionalAction,
                                default=field.default, help=help_text)
        else:
            parser.add_argument(flag(field.name), dest=field.name, type=kind, default=field.default,
                                choices=field.metadata.get("choices"), help=help_text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add(parser, RequeueSpec, None)
    parser.add_argument("--preflight", dest="preflight", action=argparse.BooleanOptionalAction, default=False,
                        help="check the allocation's nodes before the first training step")
    add_preflight_arguments(parser)


def add_preflight_arguments(parser: argparse.ArgumentParser) -> None:
    _add(parser, JobSpec, PREFLIGHT_FIELDS)


def from_args(args: argparse.Namespace) -> RequeueSpec:
    """The parsed flags as a validated RequeueSpec (a bad value is a SpecError naming the flag's key)."""
    values: Dict[str, Any] = {field.name: getattr(args, field.name) for field in dataclasses.fields(RequeueSpec)}
    return RequeueSpec(**values)


def preflight_from_args(args: argparse.Namespace) -> Optional[Settings]:
    """The preflight settings (validated by JobSpec's rules), or None with --no-preflight."""
    if not args.preflight:
        return None
    values = {name: getattr(args, name) for name in PREFLIGHT_FIELDS}
    checked = JobSpec(name="preflight", **values)
    return Settings(checked.preflight_budget_s, checked.preflight_slow_factor, checked.preflight_min_busbw_gbps)
