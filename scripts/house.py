#!/usr/bin/env python3
"""Print the house: slurmtools' parties (its top-level packages and modules), floor by floor from
the top, each with its size and the parties it imports, read from the code as it stands (every
import of slurmtools, lazy ones inside functions too). A party stands one floor above the highest
party it imports; an import that closes a circle between parties is printed and exits 1.

    python3 scripts/house.py            # from the repository's root

The order the parties must keep is a test's (tests/unit/test_layers.py); this prints what is.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "slurmtools"


def party_of(module: str) -> str:
    """'slurmtools.train.control' -> 'train'; 'slurmtools' itself (its __version__) -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules(package: Path = PACKAGE) -> Iterator[Tuple[str, Path]]:
    """(dotted name, path) of every module of the package; a package is named by its folder."""
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        yield ".".join(parts), path


def imports_of(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, imported module) for every import of slurmtools in the file, lazy ones included;
    `from slurmtools import x` names x's module when x is a top-level party."""
    top_level = {child.stem for child in PACKAGE.iterdir() if child.suffix == ".py" or child.is_dir()}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name.startswith("slurmtools"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("slurmtools"):
            module = node.module or ""
            if module == "slurmtools":
                yield from ((node.lineno, f"slurmtools.{alias.name}" if alias.name in top_level else module)
                            for alias in node.names)
            else:
                yield node.lineno, module


def party_imports() -> Tuple[Dict[str, Dict[str, int]], Dict[str, int]]:
    """({party: {imported party: imports}}, {party: lines})."""
    arrows: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    lines: Dict[str, int] = defaultdict(int)
    for module, path in modules():
        mine = party_of(module)
        lines[mine] += len(path.read_text().splitlines())
        arrows[mine]
        for _, imported in imports_of(path):
            theirs = party_of(imported)
            if theirs != mine:
                arrows[mine][theirs] += 1
    return arrows, lines


def floors(arrows: Dict[str, Dict[str, int]]) -> Tuple[Dict[str, int], List[str]]:
    """({party: floor}, the parties on a circle); floor 1 imports no other party."""
    floor: Dict[str, int] = {}
    circle: List[str] = []
    visiting: Set[str] = set()

    def visit(party: str) -> int:
        if party in floor:
            return floor[party]
        if party in visiting:
            circle.append(party)
            return 0
        visiting.add(party)
        floor[party] = 1 + max((visit(other) for other in arrows.get(party, {})), default=0)
        visiting.discard(party)
        return floor[party]

    for party in sorted(arrows):
        visit(party)
    return floor, circle


def main() -> int:
    arrows, lines = party_imports()
    floor, circle = floors(arrows)
    for party in sorted(floor, key=lambda name: (-floor[name], name)):
        imported = ", ".join(f"{other} ({count})" for other, count in sorted(arrows[party].items()))
        print(f"floor {floor[party]:2}  {party:14} {lines[party]:6} lines   imports: {imported or '-'}")
    print(f"{len(floor)} parties; circles: {', '.join(circle) if circle else 'none'}")
    return 1 if circle else 0


if __name__ == "__main__":
    sys.exit(main())
