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

A consumer on call (`on_call`: the planner's tool results) gets its records when its service
expects them, and says so (`expect(consumer)`, once it sent what they answer). It fetches while
it expects them, up to `idle_after_s`, and only while they keep coming; then, read to the end, it
parks on its own, even while the rest of the process is busy, and the look-out watches its
partitions with the idle wait. Other consumers' records do not wake it (every run of a process
would, and it would fetch every 10 ms as long as the process is busy): a record for it wakes it
alone, a record for any other consumer wakes every consumer of the process but those on call.

On Kafka a fetch wakes on new data, so the idle wait there is the usual one and nothing changes.

aiokafka reads the consumer's fetch wait (`Fetcher._fetch_max_wait_ms`) for every fetch request
it builds, and how long its fetch routine sleeps between looks at its partitions
(`Fetcher._fetcher_timeout`, longer while parked); those private attributes are what is set
here, and a partition's position is read from its subscription state (aiokafka is pinned below
0.15, and tests check that the wait a running consumer fetches with does change, that a parked
one's routine sleeps longer, and that an idle service's consumers are paused).
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
PARKED_LOOK_S = 1.0
"""How often a parked consumer looks for a rebalance (the look-out wakes it for a record)."""

logger = get_logger(__name__)


class FetchPace:
    """The fetch wait of one started consumer: its own while records come, the idle one after a
    quiet `idle_after_s`, and no fetch at all while every paced consumer of the process is idle."""

    def __init__(self, consumer: AIOKafkaConsumer, settings: KafkaSettings, *, on_call: bool = False) -> None:
        self._fetcher: Any = consumer._fetcher
        self.consumer = consumer
        self.busy_ms: int = self._fetcher._fetch_max_wait_ms
        self._fetcher_timeout_s: float = self._fetcher._fetcher_timeout
        self.idle_ms: int = max(self.busy_ms, settings.idle_fetch_max_wait_ms)
        self.bootstrap = settings.bootstrap
        self._paced = settings.flavour == "tansu"
        self._idle_after_s = settings.idle_after_s
        self.on_call = on_call
        self._last_news = time.monotonic()
        self._awaited = 0
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
    def last_news(self) -> float:
        """When (`time.monotonic()`) it last saw a new record, or was woken."""
        return self._last_news

    @property
    def quiet(self) -> bool:
        """No new record for `idle_after_s`."""
        return time.monotonic() - self._last_news >= self._idle_after_s

    @property
    def done_waiting(self) -> bool:
        """On call: the records expected came and no other followed them within a look, or none
        came for `idle_after_s` while some were expected."""
        waited = time.monotonic() - self._last_news
        return waited >= (self._idle_after_s if self._awaited else self._look_s)

    @property
    def _look_s(self) -> float:
        # On call and fetching, it looks after every fetch: it parks one fetch after its records stop.
        return self.busy_ms / 1000 if self.on_call else TICK_S

    def expect(self, records: int) -> None:
        """`records` more will come soon (on call: it fetches until they did, up to `idle_after_s`)."""
        self._awaited += records
        self.wake()

    def wake(self) -> None:
        """Fetch with the short wait again (a message is expected soon)."""
        self._last_news = time.monotonic()
        self._fetcher._fetch_max_wait_ms = self.busy_ms
        if self._parked is not None:
            self._fetcher._fetcher_timeout = self._fetcher_timeout_s
            assigned = self.consumer.assignment()
            self.consumer.resume(*(partition for partition in self._parked if partition in assigned))
            self._parked = None
            if self._lookout is not None:
                self._lookout.watch()

    def _news(self, seen: dict[TopicPartition, int | None], marks: dict[TopicPartition, int | None]) -> None:
        self._last_news = time.monotonic()
        came = sum((marks[tp] or 0) - (seen.get(tp) or 0) for tp in marks if seen.get(tp) is not None)
        self._awaited = max(0, self._awaited - came)

    def start(self) -> None:
        """Start watching (when it changes anything)."""
        if self.needed and self._task is None:
            self._lookout = _lookout()
            self._lookout.paces.add(self)
            self._task = asyncio.create_task(self._watch(self._lookout), name="fetch-pace")

    async def stop(self) -> None:
        """Stop watching; the consumer keeps its short wait."""
        self.wake()
        lookout, self._lookout = self._lookout, None
        if lookout is not None:
            lookout.paces.discard(self)
            if lookout.paces:
                lookout.watch()  # the others' partitions only
            else:
                await lookout.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def read_to_the_end(self) -> dict[TopicPartition, int] | None:
        """Each assigned partition's high watermark, when the consumer has handed out every record
        up to it (else records wait in it, or are still to be fetched: it must not park)."""
        subscription = self.consumer._subscription.subscription
        if subscription is None or subscription.assignment is None:
            return None
        marks: dict[TopicPartition, int] = {}
        for partition in self.consumer.assignment():
            state = subscription.assignment.state_value(partition)
            highwater = self.consumer.highwater(partition)
            if highwater is None or not state.has_valid_position or state.position != highwater:
                return None
            marks[partition] = highwater
        return marks

    def park(self, marks: dict[TopicPartition, int]) -> None:
        """Pause its partitions (each read up to its mark) until `wake()` (the look-out's
        `watch()` follows)."""
        self._fetcher._fetch_max_wait_ms = self.idle_ms
        # aiokafka's fetch routine looks at a consumer's partitions every `consumer_timeout_ms`
        # (200) even when all are paused; a resume and a rebalance wake it anyway.
        self._fetcher._fetcher_timeout = PARKED_LOOK_S
        self._parked = marks
        self.consumer.pause(*marks)

    @property
    def marks(self) -> dict[TopicPartition, int]:
        """Where each of its parked partitions was read to (none when it is not parked)."""
        return self._parked or {}

    async def _watch(self, lookout: _Lookout) -> None:
        seen: dict[TopicPartition, int | None] = {}
        while True:
            # Parked, only a rebalance is looked for (the look-out wakes it): no hurry.
            await asyncio.sleep(self._look_s if self._parked is None else PARKED_LOOK_S)
            if self._parked is not None:
                held = self.consumer.assignment()
                if held != self._parked.keys() or self.consumer.paused() != held:
                    self.wake()  # a rebalance: a new assignment is not paused
                continue
            marks = {
                partition: self.consumer.highwater(partition) for partition in self.consumer.assignment()
            }
            if marks != seen:
                self._news(seen, marks)
                seen = marks
                if not self.on_call:
                    lookout.wake_all()
            elif self.on_call:
                if self.done_waiting:
                    lookout.park_alone(self)
            elif self.quiet:
                self._fetcher._fetch_max_wait_ms = self.idle_ms
                lookout.consider()


class _Lookout:
    """The paces of one event loop (a process's services). Those not on call wake together, and
    once all are quiet and read to the end (and more than one) they park; one on call parks on its
    own. While any is parked this fetches their partitions from their marks (a group-less consumer
    of its own, started at the first parking and stopped with the last pace) until a record comes."""

    def __init__(self) -> None:
        self.paces: weakref.WeakSet[FetchPace] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._bootstrap: str | None = None
        self._marks: dict[TopicPartition, int] = {}
        self._owners: dict[TopicPartition, list[FetchPace]] = {}
        self._wait_ms = 0
        self._watching = asyncio.Event()

    def wake_all(self) -> None:
        """Every pace not on call back to the short wait, none of them parked."""
        for pace in list(self.paces):
            if not pace.on_call:
                pace.wake()

    def consider(self) -> None:
        """Park every pace not on call when they are all quiet and read to the end."""
        paces = list(self.paces)
        # One consumer alone would only trade its fetches for the look-out's.
        waking = [pace for pace in paces if not pace.on_call and not pace.parked]
        if len(paces) < 2 or not waking or not all(pace.quiet for pace in waking):
            return
        reads = [(pace, pace.read_to_the_end()) for pace in waking]
        if not self._one_broker(waking) or any(read is None for _, read in reads):
            return
        for pace, read in reads:
            assert read is not None
            pace.park(read)
        self.watch()

    def park_alone(self, pace: FetchPace) -> None:
        """Park a pace on call that is read to the end, whatever the others do."""
        read = pace.read_to_the_end()
        if read is not None and self._one_broker([pace]):
            pace.park(read)
            self.watch()

    def _one_broker(self, paces: list[FetchPace]) -> bool:
        """Whether `paces` fetch from the broker the look-out fetches from (the first to park's)."""
        bootstrap = self._bootstrap or paces[0].bootstrap
        if any(pace.bootstrap != bootstrap for pace in paces):
            return False
        self._bootstrap = bootstrap
        return True

    def watch(self) -> None:
        """Fetch the partitions of the paces parked now (one parked, or woke), from their marks."""
        parked = [pace for pace in self.paces if pace.parked]
        self._marks, self._owners = {}, {}
        for pace in parked:
            for partition, mark in pace.marks.items():
                self._marks[partition] = min(mark, self._marks.get(partition, mark))
                self._owners.setdefault(partition, []).append(pace)
        if not parked:
            self._watching.clear()
            return
        self._wait_ms = min(pace.idle_ms for pace in parked)
        if self._task is None and self._bootstrap is not None:
            self._task = asyncio.create_task(self._look(self._bootstrap), name="fetch-lookout")
        self._watching.set()

    def _wake_for(self, partitions: set[TopicPartition]) -> None:
        """A record for a pace on call wakes it; one for any other wakes every pace not on call."""
        owners = {pace for partition in partitions for pace in self._owners.get(partition, [])}
        if any(not pace.on_call for pace in owners):
            self.wake_all()
        for pace in owners:
            pace.wake()

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
                await self._watching.wait()
                self._wake_for(await self._news(consumer, self._marks))
        except Exception as error:
            # Whatever it was, no consumer may stay paused for it: they fetch again, and park anew.
            logger.info("fetching again: the look-out failed", error=type(error).__name__)
            self._task = None
            for pace in list(self.paces):
                pace.wake()
        finally:
            await consumer.stop()

    async def _news(
        self, consumer: AIOKafkaConsumer, marks: dict[TopicPartition, int]
    ) -> set[TopicPartition]:
        """Fetch every parked partition from its mark until a record comes (those partitions), or
        the paces parked change (none)."""
        consumer._fetcher._fetch_max_wait_ms = self._wait_ms
        if marks:
            consumer.assign(list(marks))
            for partition, mark in marks.items():
                consumer.seek(partition, mark)
        try:
            while self._watching.is_set() and self._marks is marks:
                if not marks:
                    await asyncio.sleep(self._wait_ms / 1000)
                    continue
                batches = await consumer.getmany(timeout_ms=self._wait_ms)
                found = {partition for partition, records in batches.items() if records}
                if found and self._marks is marks:
                    return found
            return set()
        finally:
            consumer.pause(*consumer.assignment())

    async def stop(self) -> None:
        """Wake every pace and stop fetching."""
        for pace in list(self.paces):
            pace.wake()
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


def expect(consumer: AIOKafkaConsumer | None, records: int = 1) -> None:
    """`records` for `consumer` will come soon (its service sent what they answer): its pace
    fetches with the short wait until they came, parked or not (a consumer on call is woken by
    nothing else)."""
    lookout = _LOOKOUTS.get(asyncio.get_running_loop())
    if lookout is None or consumer is None:
        return
    for pace in list(lookout.paces):
        if pace.consumer is consumer:
            pace.expect(records)
