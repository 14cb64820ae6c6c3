"""A call answered in this very process is not fetched for: its client is told of the reply.

On Tansu a waiting store client fetches every 10 ms. When an owner of the client's own process
holds the partition a command goes to (everything in one process), the reply is this process's
own: the client waits unfetched and fetches once it is published; should that owner lose the
partition, it fetches as for any other call. Real broker; the owner runs in the test's process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from quipu.contracts.commands import LoadSessionStatus, StoreReply
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import Session, SessionStatus
from quipu.contracts.topics import TOPICS, Topic
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.kit import fetch_pace, publishing, store_client
from quipu.services.kit.fetch_pace import FetchPace
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app as create_owner
from tests.timing import eventually, scaled

PARTITIONS = next(spec.partitions for spec in TOPICS if spec.topic is Topic.STORAGE_COMMANDS)


class GatedStore(InMemoryStore):
    """A store whose session reads wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = asyncio.Event()
        self.gate = asyncio.Event()

    async def load_session_status(self, session_id: str) -> Session:
        self.reading.set()
        await self.gate.wait()
        return await super().load_session_status(session_id)


def held_here(kafka: KafkaSettings) -> Callable[[], Awaitable[bool]]:
    """Whether a consumer of this process holds every partition of `storage.commands`."""
    topic = kafka.topic_prefix + Topic.STORAGE_COMMANDS.value

    async def check() -> bool:
        return all(fetch_pace.holds(topic, partition) for partition in range(PARTITIONS))

    return check


@contextlib.asynccontextmanager
async def answered_here(kafka: KafkaSettings, backend: InMemoryStore) -> AsyncIterator[KafkaStore]:
    """A client, and an owner of its process over `backend` (session "s-1" created) holding every
    partition of `storage.commands`."""
    await backend.create_session("s-1", utc_now_ms())
    owner = create_owner(kafka, store=backend, memory=InMemoryMemoryStore())
    async with asyncio.timeout(scaled(60)):
        await owner.start()
        try:
            await eventually(held_here(kafka), within=30, what="the owner holding its partitions")
            async with KafkaStore(kafka, reply_timeout_s=scaled(30), claim_partition=False) as store:
                yield store
        finally:
            await owner.stop()


async def test_a_call_the_owner_of_this_process_answers_is_fetched_only_once_answered(
    kafka_settings: KafkaSettings,
) -> None:
    backend = GatedStore()
    async with answered_here(kafka_settings, backend) as store:
        call = asyncio.create_task(store.call(LoadSessionStatus(session_id="s-1")))
        await asyncio.wait_for(backend.reading.wait(), scaled(20))
        assert store.fetching == set()  # the owner holds the command: nothing to fetch yet
        backend.gate.set()
        session = await call
        assert (session.session_id, session.status) == ("s-1", SessionStatus.ACTIVE)
        assert store.fetching == set()


async def test_a_reply_of_this_process_answers_its_call_before_the_broker_holds_it(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker's acknowledgements of the owner's replies are held back: the call is answered
    # all the same, by the reply as the owner queued it. Once they are let go the record is read
    # as that call's own, not passed over as another client's.
    monkeypatch.setattr(store_client, "HERE_REPLY_WAIT_S", 3600.0)  # no fetch for the call meanwhile
    replies = kafka_settings.topic_prefix + Topic.STORAGE_REPLIES.value
    acknowledged = asyncio.Event()
    held = publishing._acknowledged

    async def holding(topics: Sequence[str], *args: Any, **kwargs: Any) -> None:
        if replies in topics:
            await acknowledged.wait()
        await held(topics, *args, **kwargs)

    monkeypatch.setattr(publishing, "_acknowledged", holding)
    async with answered_here(kafka_settings, InMemoryStore()) as store:
        try:
            session = await store.load_session_status("s-1")
            assert session.session_id == "s-1"
            assert store.replies_answered_early == 1
        finally:
            acknowledged.set()  # else the owner's stop waits for them

        async def read_as_its_own() -> bool:
            return store.replies_answered_early == 0

        await eventually(read_as_its_own, within=30, what="the reply's record read")
        assert store.replies_passed_over == 0


async def test_a_call_is_fetched_for_once_no_consumer_of_this_process_holds_its_partition(
    kafka_settings: KafkaSettings,
) -> None:
    commands = kafka_settings.topic_prefix + Topic.STORAGE_COMMANDS.value
    stand_in = AIOKafkaConsumer(
        bootstrap_servers=kafka_settings.bootstrap, group_id=None, enable_auto_commit=False
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    async with asyncio.timeout(scaled(60)):
        await stand_in.start()
        await producer.start()
        stand_in.assign([TopicPartition(commands, partition) for partition in range(PARTITIONS)])
        pace = FetchPace(stand_in, kafka_settings)
        pace.start()  # an owner of this process that never answers
        try:
            await eventually(held_here(kafka_settings), within=10, what="the stand-in holding the partitions")
            async with KafkaStore(kafka_settings, reply_timeout_s=scaled(30), claim_partition=False) as store:
                command = LoadSessionStatus(session_id="s-1", correlation_id="mine")
                call = await store.sent(store.call(command))  # the broker holds the command
                assert store.fetching == set()
                # Answered from elsewhere (a rebalance moved the partition): not published here.
                error = StoreError(ErrorCode.SESSION_NOT_FOUND, "no such session")
                reply = StoreReply(correlation_id="mine", op="load_session_status", error=error.to_body())
                replies = kafka_settings.topic_prefix + Topic.STORAGE_REPLIES.value
                await producer.send_and_wait(
                    replies, reply.model_dump_json().encode(), partition=store.reply_partition
                )
                await pace.stop()  # no consumer of this process holds the partition any more
                with pytest.raises(StoreError) as refused:
                    await call
                assert refused.value.code is ErrorCode.SESSION_NOT_FOUND
        finally:
            await pace.stop()
            await producer.stop()
            await stand_in.stop()
