"""The reference pages generated from the code (docs/job-spec.md, docs/health-config.md, docs/cli.md,
docs/environment.md, docs/control-dir.md, docs/python-api.md) are the code's: a page that drifts
fails here, with the command that writes it anew."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen-reference.py")
assert _spec and _spec.loader
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


@pytest.mark.parametrize("page", sorted(generator.PAGES))
def test_each_reference_page_is_what_the_code_generates(page):
    assert (ROOT / page).read_text() == generator.PAGES[page](), "run: python3 scripts/gen-reference.py"


def test_the_pages_hold_every_key_with_its_default_and_every_command():
    from slurmtools.common.schema import field_docs
    from slurmtools.health.config import NodeSettings
    from slurmtools.spec import field_docs as job_field_docs
    spec_page = (ROOT / "docs" / "job-spec.md").read_text()
    assert all(f"| `{key}` | `{default}` |" in spec_page for key, default, _ in job_field_docs())
    assert "| `network.preset` | `'auto'` |" in spec_page
    health_page = (ROOT / "docs" / "health-config.md").read_text()
    assert all(f"| `{key}` |" in health_page for key, _, _ in field_docs(NodeSettings))
    cli_page = (ROOT / "docs" / "cli.md").read_text()
    for heading in ("## slurmtools run", "## slurmtools health run", "## slurmtools minicluster up", "## slurmtools plan"):
        assert heading + "\n" in cli_page
    assert "/work/" not in cli_page and str(ROOT) not in cli_page


def test_every_variable_and_exit_code_is_on_its_page_and_an_undocumented_one_stops_the_generator(tmp_path):
    from slurmtools.common import control_dir
    from slurmtools.errors import Exit
    page = (ROOT / "docs" / "environment.md").read_text()
    for name in dir(control_dir):
        value = getattr(control_dir, name)
        if name.endswith("_ENV") and isinstance(value, str):
            assert f"| `{value}` | `slurmtools/common/control_dir.py` | " in page
    assert all(f"| {code.value} | `{code.name}` | " in page for code in Exit)
    source = tmp_path / "module.py"
    source.write_text('A_ENV = "SLURMTOOLS_A"  # said beside it\n# said above it\nB_ENV = "SLURMTOOLS_B"\nC_ENV = "SLURMTOOLS_C"\n')
    assert [(name, comment) for name, _, comment in generator.string_constants(source)] == [
        ("A_ENV", "said beside it"), ("B_ENV", "said above it"), ("C_ENV", "")]


def test_the_api_page_shows_the_trainers_contract_with_its_signatures():
    page = (ROOT / "docs" / "python-api.md").read_text()
    for line in ("### `slurmtools.runtime.TrainingControl`", "- `heartbeat(step: int, *, force: bool=False, defer: bool=False)",
                 "### `slurmtools.integrations.lightning.resume_path(", "### `slurmtools.notebook.executor("):
        assert line in page
    assert "on_train_batch_end" not in page          # a framework's hook without a docstring of its own
