"""The `store`, `memory_store` and `owner_stores` fixtures: every conformance test runs once per
registered implementation (`implementations.py`, `memory_implementations.py`).

Implementations live in `tests.conformance.implementations.IMPLEMENTATIONS`; see that module for
how to add one. Select a subset with `-k`, e.g. `pytest tests/conformance -k memory`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store
from tests.conformance.implementations import IMPLEMENTATIONS
from tests.conformance.kafka_backend import kafka_store_client  # noqa: F401  registers "kafka"
from tests.conformance.memory_implementations import (
    MEMORY_IMPLEMENTATIONS,
    OWNER_IMPLEMENTATIONS,
    OwnerStores,
)
from tests.conformance.mongo_backend import mongo_client  # noqa: F401  registers "mongo"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `store` over the registry as it stands once every conftest/plugin is loaded."""
    if "store" in metafunc.fixturenames:
        names = list(IMPLEMENTATIONS)
        metafunc.parametrize("store", names, indirect=True, ids=names)
    if "memory_store" in metafunc.fixturenames:
        names = list(MEMORY_IMPLEMENTATIONS)
        metafunc.parametrize("memory_store", names, indirect=True, ids=names)
    if "owner_stores" in metafunc.fixturenames:
        names = list(OWNER_IMPLEMENTATIONS)
        metafunc.parametrize("owner_stores", names, indirect=True, ids=names)


@pytest.fixture
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A fresh, isolated store of the implementation named by the parameter."""
    factory = IMPLEMENTATIONS[request.param]
    async with factory(request) as instance:
        yield instance


@pytest.fixture
async def memory_store(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore]:
    """A fresh, isolated memory store of the implementation named by the parameter."""
    factory = MEMORY_IMPLEMENTATIONS[request.param]
    async with factory(request) as instance:
        yield instance


@pytest.fixture
async def owner_stores(request: pytest.FixtureRequest) -> AsyncIterator[OwnerStores]:
    """Both stores of the implementation named by the parameter, and the session claims over them."""
    factory = OWNER_IMPLEMENTATIONS[request.param]
    async with factory(request) as instance:
        yield instance
