"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from tests.owner_support import CommandLog, client_on, owner_copy


@pytest.fixture
async def database(stack: EmbeddedStack, unique: str) -> AsyncIterator[str]:
    """A database name of this test's own, dropped afterwards."""
    yield unique
    client = client_on(stack.mongo_uri)
    await client.drop_database(unique)
    await client.close()


@pytest.fixture
async def stores(stack: EmbeddedStack, database: str) -> AsyncIterator[tuple[MongoStore, MongoMemoryStore]]:
    """Both stores on one client and database, as the storage owner opens them."""
    client = client_on(stack.mongo_uri)
    store = await MongoStore.open(client, database)
    memory = await MongoMemoryStore.open(client, database)
    yield store, memory
    await client.close()


@pytest.fixture
async def here(stack: EmbeddedStack, database: str) -> AsyncIterator[MongoStore]:
    """The owner copy under test."""
    async with owner_copy(stack.mongo_uri, database) as opened:
        yield opened


@pytest.fixture
async def elsewhere(stack: EmbeddedStack, database: str) -> AsyncIterator[MongoStore]:
    """Another owner copy on the test's database (its document hints are its own)."""
    async with owner_copy(stack.mongo_uri, database) as opened:
        yield opened


@pytest.fixture
async def logged(stack: EmbeddedStack, database: str) -> AsyncIterator[tuple[MongoStore, CommandLog]]:
    """A store on the test's database whose client logs every command it sends."""
    log = CommandLog()
    client = client_on(stack.mongo_uri, event_listeners=[log])
    store = await MongoStore.open(client, database)
    yield store, log
    await client.close()
