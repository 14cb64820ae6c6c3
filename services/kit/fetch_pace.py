"""A consumer that has seen nothing new for a while fetches less often, until something comes.

On Tansu a fetch never wakes on new data (PLATFORM_NOTES), so a consumer must fetch with a short
wait (10 ms) to keep a hop short, and then fetches 100 times a second while there is nothing to
read: idle, that was most of the CPU of every service and of the broker. `FetchPace` watches a
consumer's partitions (their high watermarks, known from its own fetches: no request) and, after
`KafkaSettings.idle_after_s` without a new record, lets it fetch with
`KafkaSettings.idle_fetch_max_wait_ms`; the first new record, or `wake()` (a caller that expects
a message soon), brings the short wait back. The price: the first message after a quiet spell
waits up to the idle wait. Only the first: a record from elsewhere for any consumer of a process
wakes every consumer of that process (a conversation is under way, and the next hops are likely
its own: the planner's tool results after its run request). The first record of the process's
own after a quiet spell wakes only the consumers not parked, and has the look-out fetch with the
short wait.

A consumer that is quiet (nothing from elsewhere and no wake for `idle_after_s`) and has handed
out all it fetched does not fetch at all: its partitions are paused, and one look-out (a
group-less consumer of the process's own) fetches the partitions of every parked consumer, from
where each stands, until a record comes; then it wakes the consumers holding those partitions. A
fetch costs about the same whatever its partition count (1 / 8 / 40 partitions: 0.8 / 0.8 / 1.3
ms), so one look-out's fetch for every parked consumer is the saving. The look-out fetches with
the short wait while the process is busy (a record seen within `idle_after_s`) and with the idle
wait once it is quiet, so a record for a parked consumer is seen as soon as its own fetch would
have seen it. A consumer that still holds records it has not handed out (its handlers busy) is
not paused: they would wait for the next record.

A record a service of the process publishes (kit.publishing calls `published`) wakes the
consumers of the process holding its partition, and only them: each is handed it (kit.handover:
no fetch) when it stands at it, else fetches it at once (it is on the broker already), and parks
again on its own once it has handed it out. Which records are the
process's own is known exactly (partition and offset, from the broker's acknowledgement); a
record a consumer sees that the process did not publish within `KafkaSettings.own_record_within_s`
of seeing it counts as from elsewhere. On a run's path inside one process (`quipu up`, the run
bench) every hop is then a hand-over, or one fetch of the consumer it is for, instead of every
consumer of the process fetching every 10 ms for as long as runs go on.

A consumer on call (`on_call`: the planner's tool results) gets its records when its service
expects them, and says so (`expect(consumer)`, once it sent what they answer). It fetches while
it expects them, up to `idle_after_s`, and only while they keep coming; then, read to the end, it
parks on its own, and the look-out watches its partitions. Other consumers' records do not wake
it (every run of a process would, and it would fetch every 10 ms as long as the process is busy):
a record for it wakes it alone, a record for any other consumer wakes every consumer of the
process but those on call.

A consumer `alone` (a live event stream: kit.run_events) is woken by its own records only, and its
records wake no other: a gateway's streams are many, each for one session, and a record for one
woke every stream of the process (and its look-out fetched with the short wait) for `idle_after_s`.
Once a record woke it, it fetches with the short wait as long as records keep coming, as any
consumer not on call does.

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
from collections.abc import Callable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from quipu.services.kit import handover
from quipu.services.kit.consumers import stop_consumer
from quipu.services.kit.handover import HandedRecord
from quipu.services.kit.logging import get_logger
from quipu.services.kit.settings import KafkaSettings

TICK_S = 0.05
"""How often the partitions are looked at: how late a busy consumer goes back to the short wait
(on the idle wait, twice a fetch: the fetch in flight holds the next back anyway)."""
PARKED_LOOK_S = 1.0
"""How often a parked consumer looks for a rebalance (the look-out wakes it for a record)."""

logger = get_logger(__name__)


class FetchPace:
    """The fetch wait of one started consumer: its own while records come, the idle one after a
    quiet `idle_after_s`, and no fetch at all while it is quiet and has handed out what it fetched."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        settings: KafkaSettings,
        *,
        on_call: bool = False,
        alone: bool = False,
    ) -> None:
        self._fetcher: Any = consumer._fetcher
        self.consumer = consumer
        self.busy_ms: int = self._fetcher._fetch_max_wait_ms
        self._fetcher_timeout_s: float = self._fetcher._fetcher_timeout
        self.idle_ms: int = max(self.busy_ms, settings.idle_fetch_max_wait_ms)
        self.bootstrap = settings.bootstrap
        self.consumer_timeout_ms = settings.consumer_timeout_ms
        self._paced = settings.flavour == "tansu"
        # At least the idle wait: a look-out's fetch sent with it before the wake that started this
        # spell has come back before this consumer parks again (the look-out then fetches anew).
        self.idle_after_s: float = max(settings.idle_after_s, self.idle_ms / 1000)
        self.own_record_within_s = settings.own_record_within_s
        self.on_call = on_call
        self.alone = alone
        self._last_news = time.monotonic()
        self._woken = self._last_news
        self._awaited = 0
        self._due: dict[TopicPartition, int] = {}
        self._looking: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lookout: _Lookout | None = None
        self._parked: dict[TopicPartition, int] | None = None

    @property
    def needed(self) -> bool:
        """Whether idling changes anything: on Tansu only, whose fetch does not wake on new data. A
        consumer already slow (a background one) keeps its wait when idle, and parks as the others do."""
        return self._paced

    @property
    def in_step(self) -> bool:
        """Whether it wakes with the process's other consumers, and they with it (neither on call
        nor alone)."""
        return not (self.on_call or self.alone)

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
        """Neither a record from elsewhere nor a wake for `idle_after_s` (records of its own
        process's wake it only until it has handed them out)."""
        return time.monotonic() - self._woken >= self.idle_after_s

    @property
    def done_waiting(self) -> bool:
        """On call: the records expected came and no other followed them within a look, or none
        came for `idle_after_s` while some were expected."""
        waited = time.monotonic() - self._last_news
        return waited >= (self.idle_after_s if self._awaited else self._look_s)

    @property
    def _look_s(self) -> float:
        # On call and fetching, it looks after every fetch: it parks one fetch after its records stop.
        # So does a consumer awake for its own process's records: it parks once it handed them out.
        if self.on_call or self._due:
            return self.busy_ms / 1000
        if self.wait_ms > self.busy_ms:
            # On the idle wait, the fetch in flight holds the next one back whatever a look finds:
            # looking more than twice a fetch only wakes the event loop (~0.2 ms each, 20 a second).
            return max(TICK_S, self.wait_ms / 2000)
        return TICK_S

    def expect(self, records: int) -> None:
        """`records` more will come soon (on call: it fetches until they did, up to `idle_after_s`)."""
        self._awaited += records
        self.wake()

    def wake(self) -> None:
        """Fetch with the short wait again (a message is expected soon), for `idle_after_s`."""
        self._woken = self._last_news = time.monotonic()
        self._resume()
        if self._looking is not None:
            _done(self._looking)  # look at the short pace from now, not after an idle look's wait

    def due(self, partition: TopicPartition, offset: int) -> None:
        """The record at `offset` of `partition` is on the broker (its process published it, or the
        look-out found it): fetch it now, and park again only once it has handed it out. Not from
        the watermarks of its last fetch: a look before the fetch that brings it has come back
        would find it read to their end, and park it at the marks the look-out has read past."""
        self._due[partition] = max(offset + 1, self._due.get(partition, 0))
        self._last_news = time.monotonic()
        self._resume()
        if self._looking is not None:
            _done(self._looking)  # look at its partitions at the short pace from now

    def _resume(self) -> None:
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
            self._lookout.add(self)
            self._task = asyncio.create_task(self._watch(self._lookout), name="fetch-pace")

    async def stop(self) -> None:
        """Stop watching; the consumer keeps its short wait."""
        self.wake()
        lookout, self._lookout = self._lookout, None
        if lookout is not None:
            lookout.discard(self)
            if lookout.paces:
                lookout.watch()  # the others' partitions only
            else:
                await lookout.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _position(self, partition: TopicPartition) -> int | None:
        subscription = self.consumer._subscription.subscription
        if subscription is None or subscription.assignment is None:
            return None
        state = subscription.assignment.state_value(partition)
        if state is None or not state.has_valid_position:
            return None
        position: int = state.position
        return position

    def read_to_the_end(self) -> dict[TopicPartition, int] | None:
        """Each assigned partition's high watermark, when the consumer has handed out every record
        up to it, its own process's included (else records wait in it, or are still to be fetched:
        it must not park)."""
        marks: dict[TopicPartition, int] = {}
        for partition in self.consumer.assignment():
            position = self._position(partition)
            highwater = self.consumer.highwater(partition)
            if highwater is None or position is None or position != highwater:
                return None
            marks[partition] = highwater
        # Its process's records may be on the broker past the watermarks of its last fetch.
        self._settle_due()
        return None if self._due else marks

    def _settle_due(self) -> None:
        """Forget the records of its own process's that it has handed out (or no longer holds)."""
        assigned = self.consumer.assignment()
        for partition, end in list(self._due.items()):
            position = self._position(partition) if partition in assigned else end
            if position is not None and position >= end:
                del self._due[partition]

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

    def _from_elsewhere(
        self,
        lookout: _Lookout,
        seen: dict[TopicPartition, int | None],
        marks: dict[TopicPartition, int | None],
    ) -> bool:
        """Whether any record that came between `seen` and `marks` is not one its process
        published lately (a partition not seen before counts as from elsewhere)."""
        for partition, mark in marks.items():
            before = seen.get(partition)
            if mark is None or mark == before:
                continue
            if before is None or not lookout.own(partition, range(before, mark)):
                return True
        return False

    async def _between_looks(self) -> None:
        # Parked, only a rebalance is looked for (the look-out wakes it): no hurry. A record of its
        # own process's cuts the wait short. A future and a timer, as `asyncio.sleep` is: an idle
        # process's consumers look 20 times a second, and `wait_for` costs a task each time.
        loop = asyncio.get_running_loop()
        self._looking = loop.create_future()
        timer = loop.call_later(self._look_s if self._parked is None else PARKED_LOOK_S, _done, self._looking)
        try:
            await self._looking
        finally:
            timer.cancel()
            self._looking = None

    async def _watch(self, lookout: _Lookout) -> None:
        seen: dict[TopicPartition, int | None] = {}
        while True:
            await self._between_looks()
            if self._parked is not None:
                held = self.consumer.assignment()
                if held != self._parked.keys() or self.consumer.paused() != held:
                    self.wake()  # a rebalance: a new assignment is not paused
                continue
            marks = {
                partition: self.consumer.highwater(partition) for partition in self.consumer.assignment()
            }
            self._settle_due()
            if marks != seen:
                elsewhere = self._from_elsewhere(lookout, seen, marks)
                self._news(seen, marks)
                seen = marks
                if self.on_call:
                    continue
                if self.alone:
                    if elsewhere:
                        self.wake()
                    continue
                if elsewhere:
                    lookout.wake_all()
                    continue
                lookout.news()
                # Its own process's records: it parks as soon as it has handed them out.
            if self.on_call:
                if self.done_waiting:
                    lookout.park(self)
            elif self.quiet:
                if not lookout.busy:
                    self._fetcher._fetch_max_wait_ms = self.idle_ms
                lookout.park(self)


class _Lookout:
    """The paces of one event loop (a process's services). A record from elsewhere for one not on
    call wakes all those not on call, and so does any record after a quiet spell; one of the
    process's own wakes only those holding its partition; each parks on its own. While any is
    parked this fetches their partitions from their marks (a group-less consumer of its own,
    started at the first parking and stopped with the last pace) until a record comes."""

    def __init__(self) -> None:
        self.paces: weakref.WeakSet[FetchPace] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._bootstrap: str | None = None
        self._marks: dict[TopicPartition, int] = {}
        self._owners: dict[TopicPartition, list[FetchPace]] = {}
        self._watching = asyncio.Event()
        self._changed = asyncio.Event()
        self._last_news = time.monotonic()
        self._idle_after_s = 0.0
        self._own_within_s = 0.0
        """The longest of its paces' settings (set as they come and go)."""
        self._own: dict[TopicPartition, dict[int, float]] = {}
        """The records the process published lately, by partition: offset -> when (monotonic)."""

    def add(self, pace: FetchPace) -> None:
        """Watch `pace` too."""
        self.paces.add(pace)
        self._settings_changed()

    def discard(self, pace: FetchPace) -> None:
        """Stop watching `pace`."""
        self.paces.discard(pace)
        self._settings_changed()

    def _settings_changed(self) -> None:
        paces = list(self.paces)
        self._idle_after_s = max((pace.idle_after_s for pace in paces), default=0.0)
        self._own_within_s = max((pace.own_record_within_s for pace in paces), default=0.0)

    @property
    def busy(self) -> bool:
        """Whether a consumer not on call saw a record, or was woken, within `idle_after_s`."""
        return time.monotonic() - self._last_news < self._idle_after_s

    @property
    def wait_ms(self) -> int:
        """The wait the look-out fetches with: the short one of the parked consumers not on call
        while the process is busy (theirs had they not parked), else the idle one."""
        parked = [pace for pace in self.paces if pace.parked]
        waits = [pace.busy_ms for pace in parked if not pace.on_call] if self.busy else []
        return min(waits or [pace.idle_ms for pace in parked] or [0])

    def news(self) -> None:
        """A record of the process's own came for a consumer not on call: the process is busy.
        After a quiet spell the consumers not parked go back to the short wait, and the look-out,
        which may be in a fetch with the idle wait, fetches the parked ones' partitions with the
        short wait at once. The parked stay parked: a record of the process's own wakes its
        holder, one from elsewhere every consumer (woken all, each fetched for `idle_after_s`
        every 10 ms: a quiet spell's first record cost ~100 fetches a second a consumer)."""
        quiet = not self.busy
        self._last_news = time.monotonic()
        if quiet:
            for pace in list(self.paces):
                if pace.in_step and not pace.parked:
                    pace.wake()
            self._changed.set()

    def wake_all(self) -> None:
        """Every pace in step back to the short wait for `idle_after_s`, none of them parked."""
        self._last_news = time.monotonic()
        for pace in list(self.paces):
            if pace.in_step:
                pace.wake()

    def published(self, partition: TopicPartition, offset: int, record: HandedRecord | None) -> None:
        """The process published the record at `offset` of `partition`: the paces holding that
        partition are handed it (`record`) or fetch it, and no other wakes for it."""
        holders = [pace for pace in list(self.paces) if partition in pace.consumer.assignment()]
        if not holders:
            return
        now = time.monotonic()
        offsets = self._own.setdefault(partition, {})
        offsets[offset] = now
        while offsets:  # in the order published: the oldest first
            first = next(iter(offsets))
            if now - offsets[first] <= self._own_within_s:
                break
            del offsets[first]
        if any(pace.in_step for pace in holders):
            self.news()
        for pace in holders:
            pace.due(partition, offset)  # resumes it, parked or not: a paused partition is not handed to
            if record is not None:
                handover.hand(pace.consumer, partition, offset, record)

    def own(self, partition: TopicPartition, offsets: range) -> bool:
        """Whether the process published every record at `offsets` of `partition` within
        `own_record_within_s` of now."""
        published = self._own.get(partition, {})
        if len(offsets) > len(published):
            return False
        now = time.monotonic()
        for offset in offsets:
            at = published.get(offset)
            if at is None or now - at > self._own_within_s:
                return False
        return True

    def park(self, pace: FetchPace) -> None:
        """Park `pace` if it is read to the end (and not the only pace: one consumer alone would
        only trade its fetches for the look-out's, unless it is on call)."""
        if not pace.on_call and len(self.paces) < 2:
            return
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
        self._changed.set()
        if not parked:
            self._watching.clear()
            return
        if self._task is None and self._bootstrap is not None:
            routine_ms = max(pace.consumer_timeout_ms for pace in parked)
            self._task = asyncio.create_task(self._look(self._bootstrap, routine_ms), name="fetch-lookout")
        self._watching.set()

    def _wake_for(self, found: dict[TopicPartition, list[int]]) -> None:
        """Wake the parked paces holding a partition a record came on. For records of the
        process's own, those alone; for one from elsewhere, every pace in step too (unless only
        paces on call or alone hold its partition)."""
        elsewhere = False
        own: list[tuple[FetchPace, TopicPartition, int]] = []
        for partition, offsets in found.items():
            mark = self._marks.get(partition)
            fresh = [offset for offset in offsets if mark is not None and offset >= mark]
            owners = [pace for pace in self._owners.get(partition, []) if pace.parked]
            if not fresh or not owners:
                continue  # its owners woke meanwhile, and fetch it themselves
            if self.own(partition, range(min(fresh), max(fresh) + 1)):
                own.extend((pace, partition, max(fresh)) for pace in owners)
                continue
            elsewhere = elsewhere or any(pace.in_step for pace in owners)
            for pace in owners:
                pace.due(partition, max(fresh))
                pace.wake()
        if elsewhere:
            self.wake_all()
        elif any(pace.in_step for pace, _, _ in own):
            self.news()
        for pace, partition, offset in own:
            pace.due(partition, offset)

    async def _look(self, bootstrap: str, consumer_timeout_ms: int) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.wait_ms,
            consumer_timeout_ms=consumer_timeout_ms,
        )
        follow = _Following(consumer)
        try:
            await consumer.start()
            while True:
                await self._watching.wait()
                found = await self._news(consumer, follow)
                if found:
                    self._wake_for(found)
        except Exception as error:
            # Whatever it was, no consumer may stay paused for it: they fetch again, and park anew.
            logger.info("fetching again: the look-out failed", error=type(error).__name__)
            self._task = None
            for pace in list(self.paces):
                pace.wake()
        finally:
            await stop_consumer(consumer)  # it re-assigns as paces park: a plain stop may hang

    async def _news(self, consumer: AIOKafkaConsumer, follow: _Following) -> dict[TopicPartition, list[int]]:
        """One fetch of every parked partition from its mark: the offsets of the records that came
        by partition, none when the paces parked changed meanwhile (the next look has them)."""
        self._changed.clear()
        follow.to(self._marks)
        wait = self.wait_ms
        consumer._fetcher._fetch_max_wait_ms = wait
        getting = asyncio.ensure_future(consumer.getmany(timeout_ms=wait))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({getting, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Not awaited: a cancel of this task must not be taken for the fetch's. A getmany
            # cancelled while it waits has taken no record (they stay with the consumer).
            changed.cancel()
            if not getting.done():
                getting.cancel()
        if not getting.done() or getting.cancelled():
            return {}
        return follow.read(getting.result())

    async def stop(self) -> None:
        """Wake every pace and stop fetching."""
        for pace in list(self.paces):
            pace.wake()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Following:
    """The look-out consumer's partitions: every partition ever parked stays assigned (a topic new
    to the consumer costs a metadata request), fetched from its mark while parked, paused else."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._assigned: set[TopicPartition] = set()
        self._from: dict[TopicPartition, int] = {}
        """Where each partition was last sought to (a paused one keeps a position: no offset reset)."""
        self._applied: dict[TopicPartition, int] = {}
        """The partitions fetched now (resumed), each with where the consumer stands on it: the mark
        it was sought to, then past the records read. A mark asked for again is sought again."""

    def to(self, marks: dict[TopicPartition, int]) -> None:
        """Fetch exactly the partitions of `marks`, each from its mark (sought once: its position
        then moves on as records are read). Only the partitions that changed are touched."""
        consumer = self._consumer
        if not marks.keys() <= self._assigned:
            self._assigned |= marks.keys()
            self._from.update(marks)
            consumer.assign(list(self._assigned))
            for partition in self._assigned:
                consumer.seek(partition, self._from[partition])
            consumer.pause(*self._assigned)
            self._applied = {}
        for partition in self._applied.keys() - marks.keys():
            consumer.pause(partition)
            del self._applied[partition]
        for partition, mark in marks.items():
            if self._applied.get(partition) != mark:
                consumer.seek(partition, mark)
                consumer.resume(partition)
                self._applied[partition] = self._from[partition] = mark

    def read(
        self, batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
    ) -> dict[TopicPartition, list[int]]:
        """The offsets of the records of a fetch, by partition (those with records only)."""
        offsets = {
            partition: [record.offset for record in records]
            for partition, records in batches.items()
            if records
        }
        for partition, found in offsets.items():
            if partition in self._applied:
                self._applied[partition] = found[-1] + 1
        return offsets


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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


def published(topic: str, partition: int, offset: int, record: HandedRecord | None = None) -> None:
    """A service of this process published the record at `offset` of `topic`'s `partition` (the
    broker holds it): the consumers of the process holding that partition are handed it
    (`record`, kit.handover) or fetch it now, and it wakes no other (kit.publishing calls this for
    every record it sends)."""
    loop = asyncio.get_running_loop()
    lookout = _LOOKOUTS.get(loop)
    if lookout is not None:
        lookout.published(TopicPartition(topic, partition), offset, record)
    for heard in _listening(_LISTENERS, topic):
        heard(partition, offset, record)


def holds(topic: str, partition: int) -> bool:
    """Whether a paced consumer of this process holds `topic`'s `partition` now (on Tansu only):
    what its service publishes in answer to a record there is this process's own."""
    lookout = _LOOKOUTS.get(asyncio.get_running_loop())
    if lookout is None:
        return False
    wanted = TopicPartition(topic, partition)
    return any(wanted in pace.consumer.assignment() for pace in list(lookout.paces))


Heard = Callable[[int, int, "HandedRecord | None"], None]
"""Told of a record this process published on a topic listened to: its partition and offset, and
the record when it may be handed over (kit.handover)."""

_LISTENERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[Heard]]] = (
    weakref.WeakKeyDictionary()
)
"""Who hears of this process's own records, by topic, an event loop."""


Sent = Callable[[int, bytes], None]
"""Told of a record this process queued for a partition of a topic listened to, before the broker
acknowledges it: the partition and the record's value."""

_SENT_LISTENERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[Sent]]] = (
    weakref.WeakKeyDictionary()
)
"""Who hears of this process's records as they are queued, by topic, an event loop."""


def sent(topic: str, partition: int, value: bytes) -> None:
    """A service of this process queued `value` for `topic`'s `partition` (kit.publishing calls
    this for every record sent to a partition it names): those listening are told at once."""
    for heard in _listening(_SENT_LISTENERS, topic):
        heard(partition, value)


def listen_sent(topic: str, heard: Sent) -> Callable[[], None]:
    """Have `heard` told of every record this process queues for a named partition of `topic`
    from now on, before the broker holds it (a client whose answers only matter to itself: a lost
    one is asked for again); returns what stops it."""
    return _listen(_SENT_LISTENERS, topic, heard)


def listen(topic: str, heard: Heard) -> Callable[[], None]:
    """Have `heard` told of every record this process publishes on `topic` from now on (a client
    that waits for its own process's answers there instead of fetching for them); returns what
    stops it."""
    return _listen(_LISTENERS, topic, heard)


L = TypeVar("L")


def _listening(
    registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[L]]], topic: str
) -> list[L]:
    return list(registry.get(asyncio.get_running_loop(), {}).get(topic, ()))


def _listen(
    registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[L]]], topic: str, heard: L
) -> Callable[[], None]:
    topics = registry.setdefault(asyncio.get_running_loop(), {})
    topics.setdefault(topic, []).append(heard)

    def stop() -> None:
        listeners = topics.get(topic, [])
        if heard in listeners:
            listeners.remove(heard)

    return stop
