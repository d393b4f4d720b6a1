#!/usr/bin/env python3
"""Print docs/job-spec.md: every key of a job spec, its default and what it does, from the code
(slurmtools.spec.field_docs). tests/unit/test_spec.py fails when the page and the code differ:

    python3 scripts/gen-job-spec-reference.py > docs/job-spec.md
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from slurmtools.spec import field_docs  # noqa: E402

HEADER = """# Job spec reference

Every key of a job spec (the YAML file `render`, `submit` and the notebook path read, or the same
keys as a Python dict), its default and what it does. Nested keys are written with a dot: in YAML,
`requeue.max_restarts: 20` is

```yaml
requeue:
  max_restarts: 20
```

This page is generated from the code (`slurmtools/spec.py`):
`python3 scripts/gen-job-spec-reference.py > docs/job-spec.md`; a unit test fails when the two differ.

| key | default | what it does |
|---|---|---|
"""


def cell(text: str) -> str:
    """One table cell: pipes escaped, line breaks folded."""
    return " ".join(text.split()).replace("|", "\\|")


def page() -> str:
    rows = [f"| `{key}` | `{cell(default)}` | {cell(doc)} |" for key, default, doc in field_docs()]
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(page())
