"""The registry of `MemoryStore` implementations the memory conformance suite runs against.

Same pattern as `implementations.py`: a factory takes the requesting test's
`pytest.FixtureRequest` and returns an async context manager yielding a fresh store.

- "memory": `InMemoryMemoryStore`.
- "mongo": `MongoMemoryStore` on a fresh database of the session's SecantusDB, dropped afterwards.
- "kafka": `KafkaMemoryStore` over the session's runtime store client, talking to the session's
  owner process (which serves a `MongoMemoryStore`); tests use unique ids, so sharing is safe.

A rule over both stores (`SessionClaims`) runs over one implementation's pair (`OwnerStores`):
in memory and on MongoDB the rule itself over the two stores, over Kafka the owner's one command.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import pytest

from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.session_claims import SessionClaimRule, SessionClaims
from quipu.services.domain.store.protocol import Store
from tests.conformance.implementations import IMPLEMENTATIONS

MemoryStoreFactory = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[MemoryStore]]
"""Builds one fresh, isolated memory store for one test."""

MEMORY_IMPLEMENTATIONS: dict[str, MemoryStoreFactory] = {}
"""Implementation name (the test id) → factory."""


def register_memory_implementation(name: str, factory: MemoryStoreFactory) -> None:
    """Add an implementation; the memory suite is then generated once more, with id `name`."""
    if name in MEMORY_IMPLEMENTATIONS and MEMORY_IMPLEMENTATIONS[name] is not factory:
        raise ValueError(f"memory store implementation {name!r} is already registered")
    MEMORY_IMPLEMENTATIONS[name] = factory


@asynccontextmanager
async def _in_memory(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore]:
    from quipu.services.domain.memory.memory_store import InMemoryMemoryStore  # noqa: PLC0415

    yield InMemoryMemoryStore()


@asynccontextmanager
async def _mongo(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore]:
    from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore  # noqa: PLC0415

    client = request.getfixturevalue("mongo_client").get()
    store = await MongoMemoryStore.open(client, f"memory_conformance_{uuid.uuid4().hex[:16]}")
    try:
        yield store
    finally:
        await store.drop_database()


@asynccontextmanager
async def _kafka(request: pytest.FixtureRequest) -> AsyncIterator[MemoryStore]:
    from quipu.services.kit.memory_client import KafkaMemoryStore  # noqa: PLC0415
    from tests.conformance.kafka_backend import _CLIENTS  # noqa: PLC0415

    yield KafkaMemoryStore(_CLIENTS[0])


register_memory_implementation("memory", _in_memory)
register_memory_implementation("mongo", _mongo)
register_memory_implementation("kafka", _kafka)


@dataclass(frozen=True)
class OwnerStores:
    """One implementation's runtime store and memory store, and the session claims over both."""

    store: Store
    memory: MemoryStore
    claims: SessionClaims


OwnerStoresFactory = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[OwnerStores]]
"""Builds both stores of one implementation, fresh and isolated, for one test."""


def _owner_stores(name: str) -> OwnerStoresFactory:
    @asynccontextmanager
    async def factory(request: pytest.FixtureRequest) -> AsyncIterator[OwnerStores]:
        async with IMPLEMENTATIONS[name](request) as store, MEMORY_IMPLEMENTATIONS[name](request) as memory:
            # Over Kafka the owner applies the rule to its own stores: one command, not the rule here.
            claims = memory.turn_claims or SessionClaimRule(store, memory)
            yield OwnerStores(store, memory, claims)

    return factory


OWNER_IMPLEMENTATIONS: dict[str, OwnerStoresFactory] = {
    name: _owner_stores(name) for name in ("memory", "mongo", "kafka")
}
"""Implementation name (the test id) → both of its stores."""
