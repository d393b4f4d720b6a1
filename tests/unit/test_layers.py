"""The house by who runs it: every import of slurmtools points down between the parties, or stays
inside its own package; lazy imports (inside a function) are held to the same rule, so none hides an
arrow that runs back up. And every name the README, docs/ and the examples import is importable
where they import it (the thin re-exports at the top of the package keep those paths)."""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurmtools"
_spec = importlib.util.spec_from_file_location("house", ROOT / "scripts" / "house.py")
assert _spec and _spec.loader
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)       # the readers `scripts/house.py` prints the house with
party_of, modules, imports_of = house.party_of, house.modules, house.imports_of

# From the top down: a module may import its own package and any party on a lower line, never one
# on its own line or above. Parties on one line share a floor and import neither each other.
PARTIES_TOP_DOWN: List[Tuple[str, ...]] = [
    ("__main__",),                                     # `python -m slurmtools`
    ("cli",),                                          # the command line
    ("runtime", "notebook", "notebook_view", "tiny_fsdp"),   # public paths, handed on
    ("job",),                                          # the job's author: sbatch, submit, notebook
    ("minicluster",),                                  # the rehearsal
    ("reference",),                                    # the reference trainer
    ("integrations",),                                 # Lightning and HF Trainer adapters
    ("report",),                                       # a job's story, read back by its user
    ("requeue",),                                      # the supervisor (the batch step)
    ("spec", "health"),                                # the job's description; root's gate and config
    ("blame", "metricsrelay"),                         # root's blame intake and metrics relay
    ("snapshot",),                                     # inside the ranks: in-memory snapshots
    ("checkpoint",),                                   # inside the ranks: checkpoints
    ("train",),                                        # inside the ranks: the control contract
    ("preflight",),                                    # inside the ranks: the preflight check
    ("slurm",),                                        # the one place that runs Slurm commands
    ("common",),                                       # the floor
    ("errors", "__init__"),                            # its ground: the errors, the version
]
FLOOR = {party: level for level, line in enumerate(PARTIES_TOP_DOWN) for party in line}


def test_every_party_has_a_floor() -> None:
    top_level = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()
                 if (path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists()))}
    assert top_level == set(FLOOR)


def test_imports_point_down_between_parties() -> None:
    assert [line for module, path in modules() for line in upward_imports(module, path)] == []


def test_the_floor_imports_nothing_above_it() -> None:
    for module, path in modules():
        if party_of(module) in ("common", "errors"):
            assert {party_of(imported) for _, imported in imports_of(path)} <= {"common", "errors"}, module


def upward_imports(module: str, path: Path) -> List[str]:
    """Each import in the file that runs to a party on the importer's floor or above it."""
    mine = party_of(module)
    return [f"{path.relative_to(path.parents[2])}:{line} ({mine}) imports {imported} ({party_of(imported)})"
            for line, imported in imports_of(path)
            if party_of(imported) != mine and FLOOR[party_of(imported)] <= FLOOR[mine]]


def test_a_lazy_upward_import_is_found(tmp_path: Path) -> None:
    """The rule's own check: an import inside a function counts like one at the top."""
    path = tmp_path / "slurmtools" / "train" / "lazy.py"
    path.parent.mkdir(parents=True)
    path.write_text("def f():\n    from slurmtools.requeue import policy\n    from slurmtools.common import ledger\n")
    assert upward_imports("slurmtools.train.lazy", path) == [
        "slurmtools/train/lazy.py:2 (train) imports slurmtools.requeue (requeue)"]


def documented_imports() -> Dict[str, List[str]]:
    """{module: [names]} from every `from slurmtools... import ...` in the README, docs/ and examples/."""
    found: Dict[str, List[str]] = {}
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.py")),
             *sorted((ROOT / "examples").rglob("*.ipynb"))]
    pattern = re.compile(r"from (slurmtools(?:\.\w+)*) import \(?([\w, ]+)")
    for path in texts:
        for module, names in pattern.findall(path.read_text()):
            found.setdefault(module, []).extend(name.strip() for name in names.split(",") if name.strip())
    return found


def test_the_documented_imports_were_found() -> None:
    found = documented_imports()
    assert found["slurmtools.runtime"] and found["slurmtools.checkpoint"] == ["CheckpointManager"] * len(
        found["slurmtools.checkpoint"])
    assert {"slurmtools", "slurmtools.notebook", "slurmtools.notebook_view", "slurmtools.tiny_fsdp",
            "slurmtools.errors", "slurmtools.integrations.lightning", "slurmtools.integrations.transformers"} <= set(found)


@pytest.mark.parametrize("module", sorted(documented_imports()))
def test_every_documented_name_imports_where_the_docs_import_it(module: str) -> None:
    imported = importlib.import_module(module)
    for name in documented_imports()[module]:
        assert hasattr(imported, name) or importlib.import_module(f"{module}.{name}"), f"{module}.{name}"


def test_the_house_script_prints_every_party_and_no_circle() -> None:
    arrows, lines = house.party_imports()
    floor, circle = house.floors(arrows)
    assert circle == [] and set(floor) == set(FLOOR)
    assert floor["errors"] == 1 and floor["__main__"] == max(floor.values())
    assert all(floor[party] > floor[other] for party in arrows for other in arrows[party])


def test_the_house_script_finds_a_circle() -> None:
    floor, circle = house.floors({"a": {"b": 1}, "b": {"a": 2}, "c": {}})
    assert circle == ["a"] and floor["c"] == 1



def test_every_path_the_docs_name_exists():
    """A page that names a file the move renamed sends its reader nowhere: every repository path in
    the README, CONTRIBUTING.md and docs/ must exist (globs and <placeholders> aside)."""
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    pattern = re.compile(r"(?<![\w/.$-])((?:docs|examples|scripts|etc|slurmtools|bench|tests|prolog\.d|epilog\.d)"
                         r"/[\w./-]*[\w/])")
    missing = [(path.name, ref) for path in texts for ref in pattern.findall(path.read_text())
               if not any(char in ref for char in "*<>%$") and not (ROOT / ref).exists()]
    assert missing == []
