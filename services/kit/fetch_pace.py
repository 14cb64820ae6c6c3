"""A consumer that has seen nothing new for a while fetches less often, until something comes.

On Tansu a fetch never wakes on new data (PLATFORM_NOTES), so a consumer must fetch with a short
wait (10 ms) to keep a hop short, and then fetches 100 times a second while there is nothing to
read: idle, that was most of the CPU of every service and of the broker. `FetchPace` watches a
consumer's partitions (their high watermarks, known from its own fetches: no request) and, after
`KafkaSettings.idle_after_s` without a new record, lets it fetch with
`KafkaSettings.idle_fetch_max_wait_ms`; the first new record, or `wake()` (a caller that expects
a message soon), brings the short wait back. The price: the first message after a quiet spell
waits up to the idle wait. Only the first: a new record for any consumer of a process wakes every
consumer of that process (a conversation is under way, and the next hops are likely its own: the
planner's tool results after its run request; in `quipu up`'s one process, every service on a
run's path).

Once every paced consumer of the process is idle and has handed out all it fetched, none of them
fetches at all: their partitions are paused, and one look-out (a group-less consumer of the
process's own) fetches all of them with the idle wait, from where each consumer stands, until a
record comes; then they all fetch again, with the short wait, and the look-out stops. Idle, the
planner's four consumers sent 16 fetches a second; the look-out sends 4. A new record is seen as
soon as before (the look-out fetches with the same wait), and the hops after it sooner: no
consumer has a long fetch in flight when it wakes. A consumer that still holds records it has not
handed out (its handlers busy) is not paused: they would wait for the next record.

On Kafka a fetch wakes on new data, so the idle wait there is the usual one and nothing changes.

aiokafka reads the consumer's fetch wait (`Fetcher._fetch_max_wait_ms`) for every fetch request
it builds; that private attribute is what is set here, and a partition's position is read from
its subscription state (aiokafka is pinned below 0.15, and tests check that the wait a running
consumer fetches with does change, and that an idle service's consumers are paused).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from quipu.services.kit.logging import get_logger
from quipu.services.kit.settings import KafkaSettings

TICK_S = 0.05
"""How often the partitions are looked at: how late a busy consumer goes back to the short wait."""

logger = get_logger(__name__)


class FetchPace:
    """The fetch wait of one started consumer: its own while records come, the idle one after a
    quiet `idle_after_s`, and no fetch at all while every paced consumer of the process is idle."""

    def __init__(self, consumer: AIOKafkaConsumer, settings: KafkaSettings) -> None:
        self._fetcher: Any = consumer._fetcher
        self._consumer = consumer
        self.busy_ms: int = self._fetcher._fetch_max_wait_ms
        self.idle_ms: int = max(self.busy_ms, settings.idle_fetch_max_wait_ms)
        self.bootstrap = settings.bootstrap
        self._paced = settings.flavour == "tansu"
        self._idle_after_s = settings.idle_after_s
        self._last_news = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._lookout: _Lookout | None = None
        self._parked: dict[TopicPartition, int] | None = None

    @property
    def needed(self) -> bool:
        """Whether idling changes anything: on Tansu only, whose fetch does not wake on new data. A
        consumer already slow (a background one) keeps its wait when idle, and parks with the others."""
        return self._paced

    @property
    def wait_ms(self) -> int:
        """The wait the consumer fetches with now."""
        wait: int = self._fetcher._fetch_max_wait_ms
        return wait

    @property
    def parked(self) -> bool:
        """Whether its partitions are paused while the look-out fetches for it."""
        return self._parked is not None

    @property
    def quiet(self) -> bool:
        """No new record for `idle_after_s`."""
        return time.monotonic() - self._last_news >= self._idle_after_s

    def wake(self) -> None:
        """Fetch with the short wait again (a message is expected soon)."""
        self._last_news = time.monotonic()
        self._fetcher._fetch_max_wait_ms = self.busy_ms
        if self._parked is not None:
            assigned = self._consumer.assignment()
            self._consumer.resume(*(partition for partition in self._parked if partition in assigned))
            self._parked = None

    def start(self) -> None:
        """Start watching (when it changes anything)."""
        if self.needed and self._task is None:
            self._lookout = _lookout()
            self._lookout.paces.add(self)
            self._task = asyncio.create_task(self._watch(self._lookout), name="fetch-pace")

    async def stop(self) -> None:
        """Stop watching; the consumer keeps its short wait."""
        lookout, self._lookout = self._lookout, None
        if lookout is not None:
            lookout.paces.discard(self)
            if lookout.paces:
                lookout.wake_all()  # the others park again without it
            else:
                await lookout.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.wake()

    def read_to_the_end(self) -> dict[TopicPartition, int] | None:
        """Each assigned partition's high watermark, when the consumer has handed out every record
        up to it (else records wait in it, or are still to be fetched: it must not park)."""
        subscription = self._consumer._subscription.subscription
        if subscription is None or subscription.assignment is None:
            return None
        marks: dict[TopicPartition, int] = {}
        for partition in self._consumer.assignment():
            state = subscription.assignment.state_value(partition)
            highwater = self._consumer.highwater(partition)
            if highwater is None or not state.has_valid_position or state.position != highwater:
                return None
            marks[partition] = highwater
        return marks

    def park(self, marks: dict[TopicPartition, int]) -> None:
        """Pause its partitions (each read up to its mark) until `wake()`."""
        self._fetcher._fetch_max_wait_ms = self.idle_ms
        self._parked = marks
        self._consumer.pause(*marks)

    async def _watch(self, lookout: _Lookout) -> None:
        seen: dict[Any, int | None] = {}
        while True:
            # Parked, only a rebalance is looked for (the look-out wakes it): no hurry.
            await asyncio.sleep(TICK_S if self._parked is None else self.idle_ms / 1000)
            if self._parked is not None:
                held = self._consumer.assignment()
                if held != self._parked.keys() or self._consumer.paused() != held:
                    lookout.wake_all()  # a rebalance: a new assignment is not paused
                continue
            marks = {
                partition: self._consumer.highwater(partition) for partition in self._consumer.assignment()
            }
            if marks != seen:
                seen = marks
                lookout.wake_all()
            elif self.quiet:
                self._fetcher._fetch_max_wait_ms = self.idle_ms
                lookout.consider()


class _Lookout:
    """The paces of one event loop (a process's services): they wake together, and once all are
    quiet and read to the end (and more than one) they park, while this fetches their partitions
    from their marks (a group-less consumer of its own, started at the first parking and stopped
    with the last pace) until a record comes."""

    def __init__(self) -> None:
        self.paces: weakref.WeakSet[FetchPace] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._marks: dict[TopicPartition, int] = {}
        self._wait_ms = 0
        self._parked = asyncio.Event()

    def wake_all(self) -> None:
        """Every pace back to the short wait, none parked."""
        self._parked.clear()
        for pace in list(self.paces):
            pace.wake()

    def consider(self) -> None:
        """Park every pace when they are all quiet and read to the end."""
        paces = list(self.paces)
        # One consumer alone would only trade its fetches for the look-out's.
        if self._parked.is_set() or len(paces) < 2 or not all(pace.quiet for pace in paces):
            return
        bootstraps = {pace.bootstrap for pace in paces}
        reads = [(pace, pace.read_to_the_end()) for pace in paces]
        if len(bootstraps) != 1 or any(read is None for _, read in reads):
            return
        self._marks = {}
        for pace, read in reads:
            assert read is not None
            pace.park(read)
            for partition, mark in read.items():
                self._marks[partition] = min(mark, self._marks.get(partition, mark))
        self._wait_ms = min(pace.idle_ms for pace in paces)
        if self._task is None:
            self._task = asyncio.create_task(self._look(bootstraps.pop()), name="fetch-lookout")
        self._parked.set()

    async def _look(self, bootstrap: str) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self._wait_ms,
        )
        try:
            await consumer.start()
            while True:
                await self._parked.wait()
                if await self._news(consumer, self._marks):
                    self.wake_all()
        except Exception as error:
            # Whatever it was, no consumer may stay paused for it: they fetch again, and park anew.
            logger.info("fetching again: the look-out failed", error=type(error).__name__)
            self._task = None
            self.wake_all()
        finally:
            await consumer.stop()

    async def _news(self, consumer: AIOKafkaConsumer, marks: dict[TopicPartition, int]) -> bool:
        """Fetch every parked partition from its mark until a record comes (True) or the paces
        are woken otherwise (False), or parked again with other marks."""
        if marks:
            consumer.assign(list(marks))
            for partition, mark in marks.items():
                consumer.seek(partition, mark)
        try:
            while self._parked.is_set() and self._marks is marks:
                if not marks:
                    await asyncio.sleep(self._wait_ms / 1000)
                elif any((await consumer.getmany(timeout_ms=self._wait_ms)).values()):
                    return True
            return False
        finally:
            consumer.pause(*consumer.assignment())

    async def stop(self) -> None:
        """Wake every pace and stop fetching."""
        self.wake_all()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_LOOKOUTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lookout] = weakref.WeakKeyDictionary()
"""One look-out an event loop: a process's services run in one (tests start one a test)."""


def _lookout() -> _Lookout:
    loop = asyncio.get_running_loop()
    lookout = _LOOKOUTS.get(loop)
    if lookout is None:
        lookout = _LOOKOUTS[loop] = _Lookout()
    return lookout
