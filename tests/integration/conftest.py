"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from quipu.deploy.local.stack import EmbeddedStack
from tests.owner_support import client_on


@pytest.fixture
async def database(stack: EmbeddedStack, unique: str) -> AsyncIterator[str]:
    """A database name of this test's own, dropped afterwards."""
    yield unique
    client = client_on(stack.mongo_uri)
    await client.drop_database(unique)
    await client.close()
