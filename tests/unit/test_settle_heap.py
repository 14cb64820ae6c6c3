"""A started service settles the process's heap: start-up's objects frozen, young collections rarer."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from quipu.services.kit import lifecycle
from quipu.services.kit.lifecycle import settle_heap


@pytest.fixture
def collector() -> Iterator[None]:
    """A process whose heap no service settled yet; the collector as the test found it, afterwards
    (the freeze and thresholds are process-wide)."""
    lifecycle._freeze_start_up.cache_clear()
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector")
def test_start_up_objects_are_frozen_and_the_young_generation_collected_less_often() -> None:
    gc.unfreeze()
    _, middle, oldest = gc.get_threshold()
    settle_heap(10_000)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.get_threshold() == (10_000, middle, oldest)
    later = [[index] for index in range(1_000)]  # what the services then make
    settle_heap(10_000)  # another service of the process: start-up is frozen once
    assert gc.get_freeze_count() <= frozen and later


@pytest.mark.usefixtures("collector")
def test_zero_keeps_pythons_thresholds() -> None:
    before = gc.get_threshold()
    settle_heap(0)
    assert gc.get_threshold() == before
