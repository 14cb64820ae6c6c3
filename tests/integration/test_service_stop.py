"""A service stopped just as its group consumers' partitions change stops (kit.lifecycle).

A rebalance takes a group consumer's partitions and gives it new ones; aiokafka's fetch routine
then cancels its fetches in flight, and a `consumer.stop()` landing in that turn of the event loop
has its cancel swallowed (kit.consumers). FastStream stops its subscribers' consumers with a
plain `stop()`; a service's drain stops them first, with `stop_consumer`. The re-assignment is
made the way the group coordinator makes it, at the moment the consumer is stopped. Real broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer

from quipu.services.kit.settings import KafkaSettings
from quipu.services.tool_executor.app import create_app as create_executor
from tests.timing import eventually, scaled


def _reassigned_when_stopped(consumer: AIOKafkaConsumer) -> None:
    """Make `consumer`'s next stop land in the turn its partitions change (one taken away)."""
    stop: Callable[[], Awaitable[None]] = consumer.stop

    async def stop_as_a_rebalance_lands() -> None:
        subscription: Any = consumer._subscription
        kept = sorted(consumer.assignment())[1:]
        subscription.assign_from_subscribed(set(kept))
        await stop()

    consumer.stop = stop_as_a_rebalance_lands


async def test_a_service_stopped_as_its_consumers_partitions_change_stops(
    kafka_settings: KafkaSettings,
) -> None:
    # Its consumers keep fetching (none parks): a fetch is in flight when the change lands.
    settings = kafka_settings.model_copy(update={"idle_after_s": 3600.0})
    app = create_executor(settings)
    await app.start()
    assert app.broker is not None
    found = [getattr(subscriber, "consumer", None) for subscriber in app.broker.subscribers]
    consumers: list[AIOKafkaConsumer] = [consumer for consumer in found if consumer is not None]

    async def fetching() -> bool:
        return all(
            len(consumer.assignment()) > 1
            and any(not task.done() for task in consumer._fetcher._pending_tasks)
            for consumer in consumers
        )

    await eventually(fetching, within=30, what="every consumer assigned and fetching")
    for consumer in consumers:
        _reassigned_when_stopped(consumer)
    stopping = asyncio.ensure_future(app.stop())
    # Waited for beside, not under a timeout: aiokafka's stop swallows that cancel too.
    done, _ = await asyncio.wait({stopping}, timeout=scaled(30))
    if not done:
        for consumer in consumers:
            consumer._fetcher._fetch_task.cancel()  # let the consumers go, then fail
        await stopping
        raise AssertionError("the service's stop hung")
