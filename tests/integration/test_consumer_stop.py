"""A consumer stopped just after its owner re-assigned its partitions stops (kit.consumers).

aiokafka's fetch routine passes a cancel that comes while it cancels its fetches for a new
assignment on to a fetch that swallows it; a plain `consumer.stop()` then waits for ever. Which
turn of the event loop that is depends on the loop, so the stop is tried at each of the first few
turns after the re-assignment. Real broker.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from quipu.contracts.topics import Topic
from quipu.services.kit.consumers import stop_consumer
from quipu.services.kit.settings import KafkaSettings
from tests.timing import eventually, scaled

TURNS = 6
"""How many turns of the event loop after the re-assignment the stop is tried at (the window is
the first on a quiet loop)."""


async def _stop_turns_after_a_reassignment(kafka: KafkaSettings, turns: int) -> None:
    first, second = (
        TopicPartition(kafka.topic_prefix + topic.value, 0)
        for topic in (Topic.RUNS_CONTROL, Topic.TOOLS_RESULTS)
    )
    # A long fetch wait: on Tansu a fetch of nothing is in flight for all of it.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=2000
    )
    await consumer.start()
    consumer.assign([first])
    fetcher = consumer._fetcher

    async def fetching() -> bool:
        return any(not task.done() for task in fetcher._pending_tasks)

    await eventually(fetching, within=10, what="a fetch in flight")
    consumer.assign([first, second])
    for _ in range(turns):
        await asyncio.sleep(0)
    # Waited for beside, not under a timeout: aiokafka's stop swallows that cancel too.
    stopping = asyncio.ensure_future(stop_consumer(consumer))
    done, _ = await asyncio.wait({stopping}, timeout=scaled(10))
    if not done:
        fetcher._fetch_task.cancel()  # let the consumer go, then fail
        await stopping
        raise AssertionError(f"the stop {turns} turns after the re-assignment hung")


async def test_a_consumer_stopped_while_it_takes_new_partitions_stops(kafka_settings: KafkaSettings) -> None:
    for turns in range(TURNS):
        await _stop_turns_after_a_reassignment(kafka_settings, turns)
