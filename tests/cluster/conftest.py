"""Fixtures of the cluster test modules (the session's cluster itself is in tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster import training


@pytest.fixture
def workdir(cluster, user_tmp: Path) -> Iterator[Path]:
    """The job user's scratch dir on a settled cluster (no job left, every node idle); the test's
    jobs cancelled after it. A module that must also heal nodes defines its own."""
    training.settle()
    yield user_tmp
    training.cancel_all()
