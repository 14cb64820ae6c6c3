"""The services of a process send through one producer (kit.producers): the records they queue
together leave in one produce request, and each holder starts and stops its lease alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.conn import AIOKafkaConnection
from aiokafka.errors import KafkaConnectionError, ProducerClosed
from aiokafka.structs import RecordMetadata

from quipu.contracts.runs import CancelRun
from quipu.contracts.topics import Topic
from quipu.services.kit.broker import make_broker
from quipu.services.kit.producers import SharedProducer
from quipu.services.kit.publishing import TopicPublisher, broker_publisher
from quipu.services.kit.settings import KafkaSettings
from tests.owner_support import free_port
from tests.support.group_less import group_less
from tests.timing import scaled


def _produce_requests(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every produce request this process sends from now on."""
    sent: list[object] = []
    send = AIOKafkaConnection.send

    def counted(self: AIOKafkaConnection, request: Any, *args: Any, **kwargs: Any) -> Any:
        if type(request).__name__.startswith("ProduceRequest"):
            sent.append(request)
        return send(self, request, *args, **kwargs)

    monkeypatch.setattr(AIOKafkaConnection, "send", counted)
    return sent


@contextlib.asynccontextmanager
async def _two_services(settings: KafkaSettings) -> AsyncIterator[list[TopicPublisher]]:
    """Two services' brokers in this process, each with its publisher."""
    brokers = [make_broker(settings, client_id=name) for name in ("first", "second")]
    await asyncio.gather(*(broker.start() for broker in brokers))
    try:
        yield [broker_publisher(broker, settings) for broker in brokers]
    finally:
        await asyncio.gather(*(broker.stop() for broker in brokers))


def _cancel(number: int) -> CancelRun:
    return CancelRun(run_id=f"r-{number}", session_id="s-1")


async def _queued_together(publishers: list[TopicPublisher], monkeypatch: pytest.MonkeyPatch) -> int:
    """How many produce requests carry ten records each publisher queues in the same moment."""
    for number, publisher in enumerate(publishers):
        await publisher.publish(_cancel(number))  # the topic's metadata is known: queuing waits for nothing
    sent = _produce_requests(monkeypatch)
    acknowledgements: list[Awaitable[None]] = []
    for number in range(10):
        for publisher in publishers:
            acknowledgements.append(await publisher.queue(_cancel(number)))
    await asyncio.gather(*acknowledgements)
    return len(sent)


async def test_records_two_services_of_a_process_queue_together_share_one_produce_request(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _two_services(kafka_settings) as publishers:
        assert await _queued_together(publishers, monkeypatch) == 1


async def test_with_sharing_off_each_service_sends_its_own_requests(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = kafka_settings.model_copy(update={"share_producer": False})
    async with _two_services(own) as publishers:
        assert await _queued_together(publishers, monkeypatch) >= 2


async def _read_values(settings: KafkaSettings, topic: str, count: int) -> list[bytes]:
    consumer = group_less(settings)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        values: list[bytes] = []
        async with asyncio.timeout(scaled(20)):
            while len(values) < count:
                batches = await consumer.getmany(partition, timeout_ms=1000)
                values.extend(record.value or b"" for record in batches.get(partition, []))
        return values
    finally:
        await consumer.stop()


async def test_a_lease_stopped_has_its_records_sent_and_the_other_holder_goes_on(
    kafka_settings: KafkaSettings,
) -> None:
    topic = kafka_settings.topic_prefix + Topic.RUNS_CONTROL.value
    first, second = SharedProducer(kafka_settings), SharedProducer(kafka_settings)
    await asyncio.gather(first.start(), second.start())
    queued: Awaitable[RecordMetadata] = await first.send(topic, b"first's", partition=0)
    await first.stop()
    assert (await queued).offset >= 0  # stop flushed what was queued
    with pytest.raises(ProducerClosed):
        await first.send(topic, b"after its stop", partition=0)
    await (await second.send(topic, b"second's", partition=0))
    await second.stop()
    assert await _read_values(kafka_settings, topic, 2) == [b"first's", b"second's"]
    # The last holder closed the producer; a lease started now starts a new one.
    third = SharedProducer(kafka_settings)
    await third.start()
    try:
        await (await third.send(topic, b"third's", partition=0))
    finally:
        await third.stop()


async def test_a_producer_that_failed_to_start_is_tried_anew_by_the_next_start(
    kafka_settings: KafkaSettings,
) -> None:
    nowhere = kafka_settings.model_copy(
        update={"bootstrap": f"127.0.0.1:{free_port()}", "client_id": "nowhere"}
    )
    for _ in range(2):
        with pytest.raises(KafkaConnectionError):
            await SharedProducer(nowhere).start()
