"""The system the run bench measures: owner, planner and tool executor started in this process
on the embedded stack, with the instruments in place; and the floor it is held against, raw
Kafka hops and the runs' own store operations replayed on a fresh database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pymongo import AsyncMongoClient

from bench.run_instruments import (
    DatabaseCommands,
    Span,
    TerminalWatcher,
    TimedBackend,
    TimedKafkaStore,
    TimedModel,
    process_cpu_s,
    stack_pids,
    topic_partitions,
)
from quipu.assistant import app as assistant_app
from quipu.contracts.runs import RunRequested
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.agent_publisher import publish_agents
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.producers import new_producer
from quipu.services.kit.publishing import producer_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.storage_owner.logic import backend_of
from quipu.services.storage_owner.mongo import client_options
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.tool_executor.app import create_app as create_executor

TEXT = "calculate 6*7"
ANSWER_TEXT = "hello"
"""A plain turn: ScriptedModel answers it at once (an echo), no tool called."""
RUN_TIMEOUT_S = 300.0


# --- the system ----------------------------------------------------------------------------------


@dataclass
class Run:
    """One run as the bench saw it (perf_counter seconds)."""

    run_id: str
    session_id: str
    published: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.published


@dataclass
class System:
    settings: KafkaSettings
    producer: AIOKafkaProducer
    setup_store: KafkaStore
    planner_store: TimedKafkaStore
    owner_spans: list[Span]
    model: TimedModel
    watcher: TerminalWatcher
    pids: dict[str, int]
    database_commands: DatabaseCommands
    """Every command the owner's database client sent so far."""
    session_created: dict[str, datetime] = field(default_factory=dict)

    async def new_session(self) -> str:
        session_id = "s-" + uuid.uuid4().hex[:12]
        created = utc_now_ms()
        await self.setup_store.create_session(session_id, created)
        self.session_created[session_id] = created
        return session_id

    async def run(self, session_id: str, text: str = TEXT) -> Run:
        """One run of `text` in `session_id`, from publishing its request to reading its terminal event."""
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id="assistant", text=text
        )
        end = self.watcher.expect(request.run_id)
        published = time.perf_counter()
        await producer_publisher(self.producer, self.settings).publish(request)
        ended, _ = await asyncio.wait_for(end, RUN_TIMEOUT_S)
        return Run(request.run_id, session_id, published, ended)

    def cpu(self) -> dict[str, float]:
        return {name: process_cpu_s(pid) for name, pid in self.pids.items()}


@contextlib.asynccontextmanager
async def started_system(stack: EmbeddedStack) -> AsyncIterator[System]:
    prefix = f"rb{uuid.uuid4().hex[:8]}."
    database = prefix.rstrip(".")
    await create_topics(stack.bootstrap, prefix)
    # The planner serves only registered agents: the built-in assistant's, as `quipu up` publishes them.
    await publish_agents(stack.kafka_settings(topic_prefix=prefix), assistant_app.agents)
    settings = stack.kafka_settings(topic_prefix=prefix)
    database_commands = DatabaseCommands()
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        stack.mongo_uri, **client_options(stack.mongo_uri, 5_000), event_listeners=[database_commands]
    )
    mongo = await MongoStore.open(client, database, owns_client=True)
    memory = await MongoMemoryStore.open(mongo.client, database)
    owner_spans: list[Span] = []
    owner = create_owner(
        settings,
        store=cast(Store, TimedBackend(mongo, owner_spans)),
        memory=cast(MemoryStore, TimedBackend(memory, owner_spans)),
    )
    planner_store = TimedKafkaStore(settings, reply_timeout_s=10.0)
    model = TimedModel(ScriptedModel())
    planner = create_planner(settings, deps=PlannerDeps(store=planner_store, model=model))
    executor = create_executor(settings)
    setup_store = KafkaStore(settings, reply_timeout_s=10.0)
    producer = new_producer(settings, "bench-requests")
    watcher = TerminalWatcher(settings)
    await owner.start()
    await planner_store.start()
    await setup_store.start()
    await executor.start()  # announced before the planner starts, as `quipu up` orders them
    await asyncio.gather(planner.start(), producer.start(), watcher.start())
    pids = {"bench": os.getpid(), **stack_pids(stack)}
    try:
        yield System(
            settings,
            producer,
            setup_store,
            planner_store,
            owner_spans,
            model,
            watcher,
            pids,
            database_commands,
        )
    finally:
        await watcher.stop()
        await producer.stop()
        await planner.stop()
        await executor.stop()
        await planner_store.stop()
        await setup_store.stop()
        await owner.stop()
        await mongo.drop_database()
        await memory.close()
        await mongo.close()
        await delete_topics(stack.bootstrap, prefix)


# --- raw hops and store operations -----------------------------------------------------------------


async def raw_hops(settings: KafkaSettings, count: int, idle_s: float) -> list[float]:
    """Produce -> consume round trips (seconds) on a topic of their own, the services' settings."""
    name = settings.topic_prefix + "bench.raw-hops"
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
    await admin.start()
    try:
        if name not in await admin.list_topics():
            await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()
    producer = new_producer(settings, "bench-raw-hops")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    await producer.start()
    await consumer.start()
    partition = TopicPartition(name, 0)
    await topic_partitions(consumer, name)
    consumer.assign([partition])
    await consumer.seek_to_end(partition)
    await consumer.position(partition)
    waiting: dict[bytes, asyncio.Future[float]] = {}

    async def read() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            now = time.perf_counter()
            for records in batches.values():
                for record in records:
                    future = waiting.pop(record.value or b"", None)
                    if future is not None and not future.done():
                        future.set_result(now)

    reader = asyncio.create_task(read())
    samples: list[float] = []
    try:
        for index in range(count + 5):
            if idle_s:
                await asyncio.sleep(random.uniform(0, idle_s))
            value = f"{uuid.uuid4().hex}-{index}".encode()
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            waiting[value] = future
            started = time.perf_counter()
            await producer.send_and_wait(name, value)
            received = await asyncio.wait_for(future, 30.0)
            if index >= 5:
                samples.append(received - started)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    return samples


async def replay(uri: str, paths: list[tuple[Run, list[Span]]], system: System) -> dict[str, list[float]]:
    """Each run's commands again, one at a time, on the owner's backends over a fresh database."""
    database = f"bench_replay_{uuid.uuid4().hex[:8]}"
    store = await MongoStore.connect(uri, database)
    memory = await MongoMemoryStore.open(store.client, database)
    durations: dict[str, list[float]] = defaultdict(list)
    try:
        for run, spans in paths:
            await store.create_session(run.session_id, system.session_created[run.session_id])
            for span in spans:
                assert span.command is not None
                backend = backend_of(span.command, store, memory)
                started = time.perf_counter()
                await getattr(backend, span.command.method)(**span.command.arguments())
                durations[span.op].append(time.perf_counter() - started)
    finally:
        await store.drop_database()
        await memory.close()
        await store.close()
    return durations
