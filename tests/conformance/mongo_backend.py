"""The "mongo" conformance implementation: a MongoStore per test on the session's SecantusDB.

Each test gets a fresh, uniquely named database, dropped afterwards (SecantusDB stays fast when it
holds little). The server is the embedded stack's (`stack` in tests/conftest.py, which honours
`QUIPU_MONGO_URI`); every store of the session shares one client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.store.protocol import Store
from quipu.services.storage_owner.mongo import client_options
from quipu.services.storage_owner.mongo_store import MongoStore
from tests.conformance.implementations import register_implementation


class SharedClient:
    """One AsyncMongoClient for every mongo test, made lazily on the session's event loop.

    Opening a client per test costs ~10 ms (handshake, monitor start and stop) against ~4 ms for
    a fresh database with its indexes; a session-scoped async fixture cannot be requested from
    the `store` fixture's factory while the loop runs, so the client is made on first use.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._client: AsyncMongoClient[dict[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> AsyncMongoClient[dict[str, Any]]:
        """The client, made on (and bound to) the running loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = AsyncMongoClient(self.uri, **client_options(self.uri, 5_000))
            self._loop = loop
        return self._client

    def close(self) -> None:
        """Close the client on its loop, when that loop still exists and is idle."""
        loop = self._loop
        if self._client is not None and loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(self._client.close())
        self._client = None


@pytest.fixture(scope="session")
def mongo_client(stack: EmbeddedStack) -> Iterator[SharedClient]:
    """The client shared by the session's mongo stores, on the embedded stack's SecantusDB."""
    shared = SharedClient(stack.mongo_uri)
    yield shared
    shared.close()


@asynccontextmanager
async def mongo_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A MongoStore on a fresh database, dropped when the test ends."""
    client = request.getfixturevalue("mongo_client").get()
    store = await MongoStore.open(client, f"conformance_{uuid.uuid4().hex[:20]}")
    try:
        yield store
    finally:
        await store.drop_database()


register_implementation("mongo", mongo_store)
