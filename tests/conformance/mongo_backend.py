"""The "mongo" conformance implementation: a MongoStore per test on one SecantusDB per session.

Each test gets a fresh, uniquely named database, dropped afterwards (SecantusDB stays fast when it
holds little). The server is the session's embedded stack when `tests/conftest.py` provides
`stack`, else a `secantusd-py` child process of this module (`QUIPU_MONGO_URI` overrides both).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from services.kit.store.protocol import Store
from services.storage_owner.adapters import MongoStore, client_options
from tests.conformance.implementations import register_implementation

_START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(uri: str) -> bool:
    # Synchronous on purpose: session fixtures may be set up while the test loop runs.
    client: MongoClient[dict[str, object]] = MongoClient(uri, serverSelectionTimeoutMS=200)
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def _wait_until_answering(process: subprocess.Popen[bytes], uri: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"secantusd-py exited with {process.returncode}")
        if _answers(uri):
            return
        time.sleep(0.05)
    raise RuntimeError("secantusd-py did not answer in time")


@pytest.fixture(scope="session")
def secantus_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    """A MongoDB URI for the whole test session: $QUIPU_MONGO_URI, the stack's, or our own server.

    The mongo stores of the session share one client on it (`_SHARED`), closed at the end.
    """
    for uri in _server_uri(request):
        _SHARED[uri] = _SharedClient(uri)
        try:
            yield uri
        finally:
            _SHARED.pop(uri).close()


def _server_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    if os.environ.get("QUIPU_MONGO_URI"):
        yield os.environ["QUIPU_MONGO_URI"]
        return
    try:
        stack = request.getfixturevalue("stack")
    except pytest.FixtureLookupError:
        stack = None
    if stack is not None:
        yield str(stack.mongo_uri)
        return
    binary = shutil.which("secantusd-py", path=str(Path(sys.executable).parent)) or "secantusd-py"
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--storage-path",
            ":memory:",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    uri = f"mongodb://127.0.0.1:{port}/?retryWrites=false"
    try:
        _wait_until_answering(process, uri)
        yield uri
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _SharedClient:
    """One AsyncMongoClient for every mongo test, made lazily on the session's event loop.

    Opening a client per test costs ~10 ms (handshake, monitor start and stop) against ~1 ms for
    the fresh database; a session-scoped async fixture cannot be requested from the `store`
    fixture's factory while the loop runs, so the client is made on first use instead.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client: AsyncMongoClient[dict[str, Any]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> AsyncMongoClient[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        if self.client is None or self.loop is not loop:
            self.client = AsyncMongoClient(self.uri, **client_options(self.uri, 5_000))
            self.loop = loop
        return self.client

    def close(self) -> None:
        loop = self.loop
        if self.client is not None and loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(self.client.close())


_SHARED: dict[str, _SharedClient] = {}


@asynccontextmanager
async def mongo_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A MongoStore on a fresh database, dropped when the test ends."""
    client = _SHARED[request.getfixturevalue("secantus_uri")].get()
    store = await MongoStore.open(client, f"conformance_{uuid.uuid4().hex[:20]}")
    try:
        yield store
    finally:
        await store.drop_database()


register_implementation("mongo", mongo_store)
