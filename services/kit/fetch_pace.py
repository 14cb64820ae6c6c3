"""A consumer that has seen nothing new for a while fetches less often, until something comes.

On Tansu a fetch never wakes on new data (PLATFORM_NOTES), so a consumer must fetch with a short
wait (10 ms) to keep a hop short, and then fetches 100 times a second while there is nothing to
read: idle, that was most of the CPU of every service and of the broker. `FetchPace` watches a
consumer's partitions (their high watermarks, known from its own fetches: no request) and, after
`KafkaSettings.idle_after_s` without a new record, lets it fetch with
`KafkaSettings.idle_fetch_max_wait_ms`; the first new record, or `wake()` (a caller that expects
a message soon, such as a store client that just sent a command), brings the short wait back.
The price: the first message after a quiet spell waits up to the idle wait. Only the first: a new
record for any consumer of a process wakes every consumer of that process (a conversation is under
way, and the next hops are likely its own: the planner's tool results after its run request; in
`quipu up`'s one process, every service on a run's path).

On Kafka a fetch wakes on new data, so the idle wait there is the usual one and nothing changes.

aiokafka reads the consumer's fetch wait (`Fetcher._fetch_max_wait_ms`) for every fetch request
it builds; that private attribute is what is set here (aiokafka is pinned below 0.15, and a test
checks that the wait a running consumer fetches with does change).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

from aiokafka import AIOKafkaConsumer

from quipu.services.kit.settings import KafkaSettings

TICK_S = 0.05
"""How often the partitions are looked at: how late a busy consumer goes back to the short wait."""

_WATCHING: weakref.WeakSet[FetchPace] = weakref.WeakSet()
"""Every started pace of this process: they wake together."""


class FetchPace:
    """The fetch wait of one started consumer: its own while records come, the idle one after a
    quiet `idle_after_s`."""

    def __init__(self, consumer: AIOKafkaConsumer, settings: KafkaSettings) -> None:
        self._fetcher: Any = consumer._fetcher
        self._consumer = consumer
        self.busy_ms: int = self._fetcher._fetch_max_wait_ms
        self.idle_ms: int = max(self.busy_ms, settings.idle_fetch_max_wait_ms)
        self._idle_after_s = settings.idle_after_s
        self._last_news = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def needed(self) -> bool:
        """Whether idling changes anything (not on Kafka, nor for a consumer already slow)."""
        return self.idle_ms > self.busy_ms

    @property
    def wait_ms(self) -> int:
        """The wait the consumer fetches with now."""
        wait: int = self._fetcher._fetch_max_wait_ms
        return wait

    def wake(self) -> None:
        """Fetch with the short wait again (a message is expected soon)."""
        self._last_news = time.monotonic()
        self._fetcher._fetch_max_wait_ms = self.busy_ms

    def start(self) -> None:
        """Start watching (when it changes anything)."""
        if self.needed and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="fetch-pace")
            _WATCHING.add(self)

    async def stop(self) -> None:
        """Stop watching; the consumer keeps its short wait."""
        _WATCHING.discard(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fetcher._fetch_max_wait_ms = self.busy_ms

    async def _watch(self) -> None:
        seen: dict[Any, int | None] = {}
        while True:
            await asyncio.sleep(TICK_S)
            marks = {
                partition: self._consumer.highwater(partition) for partition in self._consumer.assignment()
            }
            if marks != seen:
                seen = marks
                for pace in list(_WATCHING):
                    pace.wake()
            elif time.monotonic() - self._last_news >= self._idle_after_s:
                self._fetcher._fetch_max_wait_ms = self.idle_ms
