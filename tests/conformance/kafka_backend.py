"""The "kafka" conformance implementation: Kafka store client → storage-owner process → MongoDB.

One owner process (`python -m quipu.services.storage_owner`, serving a MongoStore) and one client serve
the whole session: starting an owner costs a consumer-group join, and every conformance test uses
unique ids, so sharing them is safe. The fixture is autouse in `tests/conformance` so it is set up
by pytest-asyncio on the session loop, not from inside a running test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.store_client import KafkaStore
from tests.conformance.implementations import register_implementation
from tests.timing import scaled

_CLIENTS: list[KafkaStore] = []


@pytest.fixture(scope="session", autouse=True)
async def kafka_store_client(stack: EmbeddedStack) -> AsyncIterator[KafkaStore]:
    """A storage-owner process on a fresh database and prefix, and one client talking to it."""
    prefix = f"conf{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix)
    owner = ServiceProcess(
        "quipu.services.storage_owner",
        {
            **stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": prefix,
            "QUIPU_MONGO_DATABASE": f"conformance_kafka_{uuid.uuid4().hex[:8]}",
        },
    ).start()
    try:
        async with KafkaStore(
            stack.kafka_settings(topic_prefix=prefix), reply_timeout_s=scaled(10.0)
        ) as client:
            _CLIENTS.append(client)
            yield client
            _CLIENTS.clear()
    finally:
        owner.stop()


@asynccontextmanager
async def _kafka_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    yield _CLIENTS[0]


register_implementation("kafka", _kafka_store)
