"""Reading a topic whole, from its beginning to where it ends now, outside any consumer group.

    await read_to_end(settings, Topic.AGENTS_REGISTRY, registry_entry)   # each record's value, in order

For what a process must know before it serves (the planner's registries) or once (a reindex's
principals). The end is each partition's high-watermark as its last fetch reported it, never
ListOffsets, which under-reports on Tansu after a multi-record batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from quipu.contracts.errors import QuipuError
from quipu.services.kit.broker import topic
from quipu.services.kit.run_events import topic_partitions
from quipu.services.kit.settings import KafkaSettings


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
    )
    await consumer.start()
    try:
        await asyncio.sleep(0)  # see RunEventReader.start: let the group-less coordinator start
        numbers = await topic_partitions(consumer, physical)
        if not numbers:
            raise TopicMissingError(f"topic {physical} does not exist")
        partitions = [TopicPartition(physical, number) for number in numbers]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + within_s
        read = 0
        while not await _at_the_end(consumer, partitions):
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


async def _at_the_end(consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> bool:
    for partition in partitions:
        watermark = consumer.highwater(partition)
        if watermark is None or await consumer.position(partition) < watermark:
            return False
    return True
