"""`quipu status` and the CLI's hints measure consumer groups the way that works on Tansu.

Against the embedded broker: messages are produced to a topic partly as one multi-record batch
(after which Tansu's ListOffsets under-reports the end), a consumer group commits part of them,
and the lag `quipu status` computes must be exactly the messages not yet committed. The hints
say what the group shows: no member, or members and how much waits for them. A client command
whose store call gets no reply says so, and that no storage owner is in its group.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from typer.testing import CliRunner

from quipu.contracts.topics import Topic
from quipu.services.catalog import Consumer
from quipu.services.cli import app
from quipu.services.cli.status import CONSUMERS, measure, observe_consumer
from quipu.services.kit.settings import KafkaSettings
from tests.timing import eventually, scaled

OWNER = next(consumer for consumer in CONSUMERS if consumer.topic is Topic.STORAGE_COMMANDS)
PLANNER = next(consumer for consumer in CONSUMERS if consumer.topic is Topic.RUNS_REQUESTED)


async def produce(kafka: KafkaSettings, topic: Topic, singles: int, batched: int) -> None:
    """`singles` messages one by one, then `batched` in one batch, all to partition 0."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        name = kafka.topic_prefix + topic.value
        for _ in range(singles):
            await producer.send_and_wait(name, b"{}", partition=0)
        batch = producer.create_batch()
        for _ in range(batched):
            batch.append(key=None, value=b"{}", timestamp=None)
        await (await producer.send_batch(batch, name, partition=0))
    finally:
        await producer.stop()


@pytest.fixture
async def member(kafka_settings: KafkaSettings) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer in the planner's request group that commits 2 messages and handles no more."""
    consumer = AIOKafkaConsumer(
        kafka_settings.topic_prefix + Topic.RUNS_REQUESTED.value,
        bootstrap_servers=kafka_settings.bootstrap,
        group_id=kafka_settings.topic_prefix + PLANNER.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=kafka_settings.session_timeout_ms,
        heartbeat_interval_ms=kafka_settings.heartbeat_interval_ms,
        fetch_max_wait_ms=kafka_settings.fetch_max_wait_ms,
    )
    await consumer.start()
    try:

        async def assigned() -> bool:
            await consumer.getmany(timeout_ms=100)
            return bool(consumer.assignment())

        await eventually(assigned, within=30, what="the member got its partitions")
        await consumer.commit(
            {TopicPartition(kafka_settings.topic_prefix + Topic.RUNS_REQUESTED.value, 0): 2}
        )
        yield consumer
    finally:
        await consumer.stop()


async def test_lag_is_the_high_watermark_minus_the_committed_offset(
    kafka_settings: KafkaSettings, member: AIOKafkaConsumer
) -> None:
    await produce(kafka_settings, Topic.RUNS_REQUESTED, singles=3, batched=4)
    [planner, owner] = await measure(kafka_settings, [PLANNER, OWNER])
    assert (planner.members, planner.lag, planner.unmeasured) == (1, 5, "")  # 7 produced, 2 committed
    assert (owner.members, owner.lag) == (0, 0)  # a group that never ran, on an empty topic

    seen = await observe_consumer(kafka_settings, Topic.RUNS_REQUESTED, timeout_s=scaled(5))
    assert seen.startswith("planner is consuming") and "1 member(s), 5 message(s) not yet handled" in seen


async def test_a_group_without_a_member_is_said_to_have_none(kafka_settings: KafkaSettings) -> None:
    await produce(kafka_settings, Topic.STORAGE_COMMANDS, singles=1, batched=2)
    [owner] = await measure(kafka_settings, [OWNER])
    assert (owner.members, owner.lag) == (0, 3)
    seen = await observe_consumer(kafka_settings, Topic.STORAGE_COMMANDS, timeout_s=scaled(5))
    assert seen.startswith("no storage_owner is consuming") and "has no member" in seen


async def test_what_cannot_be_measured_is_said(kafka_settings: KafkaSettings) -> None:
    missing = Consumer("nobody", "nobody", Topic.RUNS_REQUESTED)
    renamed = KafkaSettings.for_embedded(
        kafka_settings.bootstrap, topic_prefix=f"absent{uuid.uuid4().hex[:6]}."
    )
    [measured] = await measure(renamed, [missing], timeout_s=scaled(2))
    assert measured.lag is None and "not measured" in measured.unmeasured


async def test_a_store_call_without_an_owner_says_no_owner_is_in_its_group(
    kafka_settings: KafkaSettings,
) -> None:
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": kafka_settings.bootstrap,
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "QUIPU_CLI_STORE_REPLY_TIMEOUT_S": "0.5",
        "QUIPU_CLI_STORE_ATTEMPTS": "2",
    }
    result = await asyncio.to_thread(CliRunner().invoke, app, ["sessions", "show", "s-1"], env=environment)
    assert result.exit_code == 1, result.output
    assert "no reply within 2 x 0.5 s" in result.output
    assert (
        "no storage_owner is consuming" in result.output
        and "is the storage owner running?" not in result.output
    )
