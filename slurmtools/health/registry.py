"""The health checks, declared once: the `Checks` dataclass in config.py is the table.

Each check is a field `<group>.<check>` of that table (`gpu.ecc`, `ib.ports`, ...) whose value
holds its `enabled` switch and its `phases`; its name in results, reports, drain reasons and
the config is that dotted path. The runner, the check modules and check-config select checks
here and nowhere else.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

from slurmtools.health.config import CheckParams, Checks

GROUPS: Tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Checks))


def names() -> List[str]:
    """Every check's name, in table order."""
    defaults = Checks()
    return [f"{group}.{field.name}" for group in GROUPS for field in dataclasses.fields(getattr(defaults, group))]


def params(checks: Checks, name: str) -> CheckParams:
    group, _, check = name.partition(".")
    value = getattr(getattr(checks, group), check)
    assert isinstance(value, CheckParams)
    return value


def runs(check: CheckParams, phase: str) -> bool:
    return check.enabled and phase in check.phases


def enabled(checks: Checks, phase: str, group: str) -> List[str]:
    """The checks of group that run in phase, in table order."""
    section = getattr(checks, group)
    return [f"{group}.{field.name}" for field in dataclasses.fields(section)
            if runs(getattr(section, field.name), phase)]
