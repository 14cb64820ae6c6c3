"""Services of one deployment started in the test's process, on a topic prefix and a database of
their own, over the session's embedded broker and database: what an integration test's module
fixture brings up once for the file.

    prefix = unique_prefix("tr")
    settings = stack.kafka_settings(topic_prefix=prefix)
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    executor = create_executor(settings)
    async with deployed(stack, settings, [executor], [planner], store=True, readers=[events]) as up:
        ...  # up.store, up.readers, up.publisher

The storage owner starts first, then the store clients asked for, then each wave of services
(the services of a wave all at once: the tool executors before the planner, as `quipu up` orders
them), then the topic readers; everything stops in the opposite order and the topics are deleted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from faststream import FastStream

from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app as create_owner
from tests.owner_support import RawPublisher, TopicReader
from tests.support.announced import publish_built_in_agents
from tests.timing import scaled


def unique_prefix(tag: str) -> str:
    """A topic prefix no other test uses, starting with `tag`."""
    return f"{tag}{uuid.uuid4().hex[:8]}."


@dataclass
class Deployment:
    """What `deployed` started, for the tests to talk to."""

    settings: KafkaSettings
    readers: list[TopicReader]
    """One reader for each topic named in `readers`, in that order."""
    optional_store: KafkaStore | None
    optional_memory: KafkaMemoryStore | None
    optional_publisher: RawPublisher | None

    @property
    def store(self) -> KafkaStore:
        """The store client (`store=True`)."""
        assert self.optional_store is not None, "deployed(..., store=True) starts a store client"
        return self.optional_store

    @property
    def memory(self) -> KafkaMemoryStore:
        """The memory store client (`memory=True`)."""
        assert self.optional_memory is not None, "deployed(..., memory=True) starts a memory client"
        return self.optional_memory

    @property
    def publisher(self) -> RawPublisher:
        """A raw producer (`publisher=True`)."""
        assert self.optional_publisher is not None, "deployed(..., publisher=True) starts a publisher"
        return self.optional_publisher


@asynccontextmanager
async def deployed(
    stack: EmbeddedStack,
    settings: KafkaSettings,
    *waves: Sequence[FastStream],
    agents: bool = False,
    store: bool = False,
    memory: bool = False,
    readers: Sequence[str] = (),
    publisher: bool = False,
) -> AsyncIterator[Deployment]:
    """Create the topics of `settings`' prefix, start a storage owner on the database named after
    it and the `waves` of services; with `agents`, the built-in assistant's agents are published
    first, as `quipu up` does. `readers` are topic names after the prefix (`Topic.X.value`,
    `Topic.X.dlq`)."""
    prefix = settings.topic_prefix
    await create_topics(stack.bootstrap, prefix)
    async with AsyncExitStack() as running:
        running.push_async_callback(delete_topics, stack.bootstrap, prefix)
        if agents:
            await publish_built_in_agents(settings)
        started = time.monotonic()
        owner = create_owner(settings, stack.mongo_settings(database=prefix.rstrip(".")))
        await owner.start()
        running.push_async_callback(owner.stop)
        memory_client = KafkaMemoryStore.connect(settings, reply_timeout_s=scaled(10.0)) if memory else None
        if memory_client is not None:
            await memory_client.start()
            running.push_async_callback(memory_client.stop)
        store_client = KafkaStore(settings, reply_timeout_s=scaled(10.0)) if store else None
        if store_client is not None:
            await store_client.start()
            running.push_async_callback(store_client.stop)
        for wave in waves:
            await asyncio.gather(*(service.start() for service in wave))
            for service in wave:
                running.push_async_callback(service.stop)
        print(f"services up in {time.monotonic() - started:.1f} s")
        topic_readers = [TopicReader(stack.bootstrap, prefix + name) for name in readers]
        for reader in topic_readers:
            await reader.start()
            running.push_async_callback(reader.stop)
        raw = await running.enter_async_context(RawPublisher(stack.bootstrap)) if publisher else None
        yield Deployment(settings, topic_readers, store_client, memory_client, raw)
