"""collector_paused: the collector is off inside the block, back as it was after it, and what the
block made is frozen out of the collector's generations, also when the block raises."""
from __future__ import annotations

import gc

import pytest

from slurmtools.common.import_pause import collector_paused


@pytest.fixture(autouse=True)
def collector_restored():
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after_with_the_blocks_objects_frozen():
    gc.enable()
    frozen_before = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)


def test_a_collector_that_was_off_stays_off_and_a_raising_block_still_restores():
    gc.disable()
    with pytest.raises(ImportError):
        with collector_paused():
            raise ImportError("no module named nowhere")
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(ImportError):
        with collector_paused():
            raise ImportError("no module named nowhere")
    assert gc.isenabled()
