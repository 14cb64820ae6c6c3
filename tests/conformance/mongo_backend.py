"""The "mongo" conformance implementation: a MongoStore per test on one SecantusDB per session.

Each test gets a fresh, uniquely named database, dropped afterwards (SecantusDB stays fast when it
holds little). The server is the session's embedded stack when `tests/conftest.py` provides
`stack`, else a `secantusd-py` child process of this module (`QUIPU_MONGO_URI` overrides both).
"""

from __future__ import annotations

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

import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from services.kit.store.protocol import Store
from services.storage_owner.adapters import MongoStore
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
    """A MongoDB URI for the whole test session: $QUIPU_MONGO_URI, the stack's, or our own server."""
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


@asynccontextmanager
async def mongo_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A MongoStore on a fresh database, dropped when the test ends."""
    uri = request.getfixturevalue("secantus_uri")
    store = await MongoStore.connect(uri, f"conformance_{uuid.uuid4().hex[:20]}")
    try:
        yield store
    finally:
        await store.drop_database()
        await store.close()


register_implementation("mongo", mongo_store)
