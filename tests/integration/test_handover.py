"""A record this process published is handed to the consumer of the process that reads it next
(kit.handover), and is then the very record a fetch of it returns; when handing it could change
more than the wait, it is fetched as before.

Each test reads partition 0 of one topic with a group-less consumer paced as the services' are
(so that the process's publishes reach it), and compares with what a second consumer, one no
publish reaches, fetches from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeAlias

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from quipu.contracts.runs import CancelRun
from quipu.contracts.topics import Topic
from quipu.services.kit import fetch_pace, handover
from quipu.services.kit.broker import make_broker
from quipu.services.kit.fetch_pace import FetchPace
from quipu.services.kit.handover import HandedRecord
from quipu.services.kit.publishing import TopicPublisher, broker_publisher, producer_publisher
from quipu.services.kit.settings import KafkaSettings
from tests.support.group_less import group_less
from tests.timing import scaled

Record: TypeAlias = ConsumerRecord[bytes, bytes]


@dataclass
class _Reader:
    """The paced consumer the process's records are handed to, and what `hand` answered."""

    consumer: AIOKafkaConsumer
    partition: TopicPartition
    handed: list[bool]
    producer: AIOKafkaProducer
    """A producer whose records no one is told of: as from another process."""

    async def read(self, count: int) -> list[Record]:
        """The next `count` records, read as a service's subscriber reads them."""
        records: list[Record] = []
        async with asyncio.timeout(scaled(20)):
            while len(records) < count:
                batches = await self.consumer.getmany(self.partition, timeout_ms=1000)
                records.extend(batches.get(self.partition, []))
        return records


@contextlib.asynccontextmanager
async def _reader(settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_Reader]:
    partition = TopicPartition(settings.topic_prefix + Topic.RUNS_CONTROL.value, 0)
    consumer = group_less(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, enable_idempotence=False)
    await asyncio.gather(consumer.start(), producer.start())
    await producer.send_and_wait(partition.topic, b"before", partition=0)  # the topic exists
    consumer.assign([partition])
    await consumer.seek_to_end(partition)
    await consumer.position(partition)
    handed: list[bool] = []
    hand = handover.hand

    def noted(*args: object, **kwargs: object) -> bool:
        answer = hand(*args, **kwargs)  # type: ignore[arg-type]
        handed.append(answer)
        return answer

    monkeypatch.setattr(handover, "hand", noted)
    pace = FetchPace(consumer, settings)
    pace.start()
    try:
        yield _Reader(consumer, partition, handed, producer)
    finally:
        await pace.stop()
        await asyncio.gather(consumer.stop(), producer.stop())


async def _fetched(
    settings: KafkaSettings, partition: TopicPartition, offset: int, count: int = 1
) -> list[Record]:
    """`count` records from `offset` of `partition` as a fetch returns them (nobody hands this one)."""
    consumer = group_less(settings)
    await consumer.start()
    try:
        consumer.assign([partition])
        consumer.seek(partition, offset)
        records: list[Record] = []
        async with asyncio.timeout(scaled(20)):
            while len(records) < count:
                batches = await consumer.getmany(partition, timeout_ms=1000)
                records.extend(batches.get(partition, []))
        return records[:count]
    finally:
        await consumer.stop()


def _cancel(number: int) -> CancelRun:
    return CancelRun(run_id=f"r-{number}", session_id="s-1")


@contextlib.asynccontextmanager
async def _publishers(
    settings: KafkaSettings, producer: AIOKafkaProducer
) -> AsyncIterator[list[TopicPublisher]]:
    """A publisher on a service's FastStream broker and one on a plain producer (a client's)."""
    broker = make_broker(settings)
    await broker.start()
    try:
        yield [broker_publisher(broker, settings), producer_publisher(producer, settings)]
    finally:
        await broker.stop()


async def test_the_record_a_publisher_hands_over_is_the_one_a_fetch_returns_field_by_field(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Headers included: FastStream adds its own to a broker's records (a content type, a
    # correlation id), and the record handed must carry them as the broker does.
    told: list[tuple[TopicPartition, int, HandedRecord | None]] = []

    def published(topic: str, partition: int, offset: int, record: HandedRecord | None = None) -> None:
        told.append((TopicPartition(topic, partition), offset, record))

    monkeypatch.setattr(fetch_pace, "published", published)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        async with _publishers(kafka_settings, producer) as publishers:
            for number, publisher in enumerate(publishers):
                await publisher.publish(_cancel(number), partition=0, headers={"quipu-test": f"h-{number}"})
                [(partition, offset, record)] = told[-1:]
                assert record is not None
                [fetched] = await _fetched(kafka_settings, partition, offset)
                assert record.at(partition, offset) == fetched
                assert ("quipu-test", f"h-{number}".encode()) in fetched.headers
    finally:
        await producer.stop()


async def test_records_handed_one_after_another_come_once_each_and_in_order(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each published before the reader took the one before: handed, they wait together in the
    # reader; its own fetch may bring some first (then those are not handed), never one twice.
    async with _reader(kafka_settings, monkeypatch) as reader:
        publisher = producer_publisher(reader.producer, kafka_settings)
        cancels = [_cancel(number) for number in range(5)]
        for cancel in cancels:
            await publisher.publish(cancel, partition=0)
        records = await reader.read(5)
        assert [record.value for record in records] == [
            cancel.model_dump_json().encode() for cancel in cancels
        ]
        first = records[0].offset
        assert [record.offset for record in records] == list(range(first, first + 5))
        assert len(reader.handed) == 5
        assert await reader.consumer.position(reader.partition) == first + 5
        assert await reader.consumer.getmany(reader.partition, timeout_ms=0) == {}
        assert await _fetched(kafka_settings, reader.partition, first, 5) == records


async def test_a_record_behind_others_unread_is_fetched_after_them(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Handed, it would come before the record from elsewhere that precedes it in the log.
    async with _reader(kafka_settings, monkeypatch) as reader:
        await reader.producer.send_and_wait(reader.partition.topic, b"from elsewhere", partition=0)
        cancel = _cancel(1)
        await producer_publisher(reader.producer, kafka_settings).publish(cancel, partition=0)
        records = await reader.read(2)
        assert [record.value for record in records] == [b"from elsewhere", cancel.model_dump_json().encode()]
        assert reader.handed == [False]


async def test_a_record_is_handed_only_to_a_consumer_standing_at_it_on_a_partition_it_reads(
    kafka_settings: KafkaSettings,
) -> None:
    # The records handed here are not on the broker: what is checked is who takes them.
    partition = TopicPartition(kafka_settings.topic_prefix + Topic.RUNS_CONTROL.value, 0)
    consumer = group_less(kafka_settings)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    await asyncio.gather(consumer.start(), producer.start())
    try:
        await producer.send_and_wait(partition.topic, b"before", partition=0)  # the topic exists
        consumer.assign([partition])
        await consumer.seek_to_end(partition)
        at = await consumer.position(partition)
        record = HandedRecord(None, b"v", (), 1)
        consumer.pause(partition)
        assert not handover.hand(consumer, partition, at, record)
        consumer.resume(partition)
        assert not handover.hand(consumer, partition, at + 1, record)  # not where it stands
        assert not handover.hand(consumer, TopicPartition(partition.topic, 1), at, record)  # not its own
        assert handover.hand(consumer, partition, at, record)
        assert not handover.hand(consumer, partition, at + 2, record)  # one missing in between
        assert handover.hand(consumer, partition, at + 1, HandedRecord(None, b"w", (), 1))
        taken = (await consumer.getmany(partition, timeout_ms=0))[partition]
        assert [(each.offset, each.value) for each in taken] == [(at, b"v"), (at + 1, b"w")]
        assert await consumer.position(partition) == at + 2
        # Read to the end as far as it knows, before any fetch tells it so (a pace may park it).
        assert consumer.highwater(partition) == at + 2
    finally:
        await asyncio.gather(consumer.stop(), producer.stop())
