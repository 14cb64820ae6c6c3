"""The registry of `Store` implementations the conformance suite runs against.

Adding an implementation is one entry: a factory that takes the requesting test's
`pytest.FixtureRequest` and returns an async context manager yielding a fresh, isolated store.
Register it from your own conftest or plugin module (anything pytest imports before collecting
`tests/conformance`), for example in `tests/conftest.py`:

    from tests.conformance.implementations import register_implementation

    @asynccontextmanager
    async def _mongo_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
        server = request.getfixturevalue("mongo_server")      # a session-scoped fixture of yours
        store = await MongoStore.connect(server.uri, database=f"conformance_{uuid4().hex}")
        try:
            yield store
        finally:
            await store.drop_and_close()

    register_implementation("mongo", _mongo_store)

Each test gets its own store (for remote stores: a unique database name). The tests also use
uuid-based identifiers, so a backend shared between tests would still work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from quipu.services.domain.store.protocol import Store

StoreFactory = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[Store]]
"""Builds one fresh, isolated store for one test."""

IMPLEMENTATIONS: dict[str, StoreFactory] = {}
"""Implementation name (the test id) → factory. Order is the order tests are generated in."""


def register_implementation(name: str, factory: StoreFactory) -> None:
    """Add an implementation; the suite is then generated once more, with id `name`."""
    if name in IMPLEMENTATIONS and IMPLEMENTATIONS[name] is not factory:
        raise ValueError(f"store implementation {name!r} is already registered")
    IMPLEMENTATIONS[name] = factory


@asynccontextmanager
async def _memory_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    # Imported lazily so that a broken or missing implementation fails its own tests only.
    from quipu.services.domain.store.memory import InMemoryStore  # noqa: PLC0415

    yield InMemoryStore()


register_implementation("memory", _memory_store)
