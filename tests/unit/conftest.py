"""Unit tests keep node memory (node_beat's heartbeat directories) in their own temporary
directory, never in the machine's /dev/shm: a test that runs ranks with a local rank and a control
dir (the Lightning adapter's) would otherwise leave a directory there."""
from __future__ import annotations

import pytest

from slurmtools.train.node_beat import NODE_LOCAL_DIR_ENV


@pytest.fixture(autouse=True)
def _node_memory_in_tmp(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(NODE_LOCAL_DIR_ENV, str(tmp_path_factory.mktemp("node-memory")))
