"""Reading a topic whole, from its beginning to where it ends now, outside any consumer group.

    await read_to_end(settings, Topic.AGENTS_REGISTRY, registry_entry)   # each record's value, in order

For what a process must know before it serves (the registries) or once (a reindex's principals).
The end is each partition's high-watermark as its last fetch reported it, never ListOffsets, which
under-reports on Tansu after a multi-record batch.

A registry (a compacted topic every copy keeps whole: tools.registry, agents.registry) is read to
its end while the service opens, before the broker starts any subscriber (`catch_up`), then
followed from its beginning outside any group (`follow_registries`); taking a record twice is
harmless, the views keep each key's latest entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream.kafka import KafkaBroker

from quipu.contracts.errors import QuipuError
from quipu.services.kit.broker import InLoopKafkaMessage, follow_from_start, topic
from quipu.services.kit.logging import get_logger
from quipu.services.kit.run_events import topic_partitions
from quipu.services.kit.settings import KafkaSettings

logger = get_logger(__name__)

RegistryReader = tuple[str, Callable[[bytes], None]]
"""A registry topic (no prefix), and what takes each of its records' values into a service's view."""


class TopicMissingError(QuipuError, LookupError):
    """Raised when the topic to read does not exist (its deployment did not create it)."""


async def read_to_end(
    settings: KafkaSettings,
    name: str,
    handle: Callable[[bytes], None],
    *,
    within_s: float = 30.0,
    client_id: str | None = None,
) -> int:
    """Give `handle` the value of every record of topic `name` (prefixed), partition by partition in
    log order, up to the end each partition has now; returns how many.

    Nothing is joined or committed. TopicMissingError when the topic does not exist, TimeoutError
    when the end is not reached within `within_s`. A record without a value (a tombstone) is skipped.
    """
    physical = topic(settings, name)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id or f"{settings.client_id}-replay",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        consumer_timeout_ms=settings.consumer_timeout_ms,
    )
    await consumer.start()
    try:
        await asyncio.sleep(0)  # see run_events.start_stream_consumer: let the coordinator start
        numbers = await topic_partitions(consumer, physical)
        if not numbers:
            raise TopicMissingError(f"topic {physical} does not exist")
        partitions = [TopicPartition(physical, number) for number in numbers]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + within_s
        read = 0
        while not await at_the_end(consumer, partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{physical}: the end was not reached within {within_s:g} s")
            batches = await consumer.getmany(*partitions, timeout_ms=200)
            for records in batches.values():
                for record in records:
                    if record.value is not None:
                        handle(record.value)
                        read += 1
        return read
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def at_the_end(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> bool:
    """Whether the consumer has read every partition up to the high watermark of its last fetch."""
    for partition in partitions:
        watermark = consumer.highwater(partition)
        if watermark is None or await consumer.position(partition) < watermark:
            return False
    return True


async def catch_up(
    settings: KafkaSettings, readers: Sequence[RegistryReader], *, within_s: float, client_id: str
) -> None:
    """Read every registry to its current end, concurrently (TimeoutError past `within_s`: a service
    must not start on a partial view). A registry topic that does not exist is empty."""

    async def read(name: str, take: Callable[[bytes], None]) -> None:
        try:
            await read_to_end(settings, name, take, within_s=within_s, client_id=client_id)
        except TopicMissingError:
            logger.warning("registry topic missing: nothing registered yet", topic=str(name))

    await asyncio.gather(*(read(name, take) for name, take in readers))


def follow_registries(
    broker: KafkaBroker, settings: KafkaSettings, readers: Sequence[RegistryReader]
) -> None:
    """Keep each view current from its registry, replayed from its beginning (no group): one
    consumer for all of them, since an idle consumer costs its fetches whatever it reads."""
    if readers:
        takes = {topic(settings, name): take for name, take in readers}
        follow_from_start(broker, settings, [name for name, _ in readers], _on_entry(takes))


def _on_entry(takes: dict[str, Callable[[bytes], None]]) -> Callable[[InLoopKafkaMessage], Awaitable[None]]:
    # Each record to the view of the registry it came from; a key's entries stay in order, since
    # each topic's partitions are read in order whatever else the consumer reads.
    async def on_entry(message: InLoopKafkaMessage) -> None:
        record: Any = message.raw_message  # one ConsumerRecord (not a batch subscriber)
        takes[record.topic](message.body)

    return on_entry
