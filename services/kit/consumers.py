"""Stopping an aiokafka consumer whose partitions its owner assigns while it fetches.

When a consumer's assignment changes, aiokafka's fetch routine cancels its fetches in flight and
awaits each; a fetch takes its cancel as "no longer of interest" and returns normally
(aiokafka 0.14, `Fetcher._proc_fetch_request`). A `consumer.stop()` that cancels the routine while
it awaits such a fetch has its cancel passed on to the fetch, which swallows it: the routine goes on
fetching, and `stop()` waits for it for ever (aio-libs/aiokafka#983 is the same family). A consumer
its owner re-assigns while it fetches (the look-out of kit.fetch_pace, the store client's replies)
is stopped with `stop_consumer`, which cancels the routine again until it has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer

RECANCEL_S = 0.05
"""How long a stopping consumer's fetch routine gets to end before it is cancelled again: a cancel
that was not swallowed ends it within a turn of the event loop."""


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """`consumer.stop()`, which also ends when the fetch routine swallowed the cancel it sent."""
    stopping = asyncio.ensure_future(consumer.stop())
    while not stopping.done():
        await asyncio.wait({stopping}, timeout=RECANCEL_S)
        fetcher: Any = consumer._fetcher
        routine: asyncio.Task[None] | None = getattr(fetcher, "_fetch_task", None)
        if routine is not None and fetcher._closed and not routine.done():
            routine.cancel()
    await stopping
