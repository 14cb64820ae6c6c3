"""Reading the live run events of one session from `runs.events` (STORE_CONTRACT §11).

    reader = RunEventReader(settings, session_id="s-1")
    await reader.start(start_at=StartAt.NOW)        # or after=EventPosition.parse(last_event_id)
    try:
        while True:
            for streamed in await reader.read(timeout_s=1.0):
                print(streamed.position, streamed.event.type)
    finally:
        await reader.stop()

`quipu run` and the client read through this class; the gateway's SSE streams are positioned by
it and then read through one `kit.event_feed.EventFeed`, which shows what this class shows
(`ShownEvents`, `decode_event`). Choices, and why (PLATFORM_NOTES):

- No consumer group: a group join takes a second or more on Tansu, and a UI stream has no
  offsets to commit. The reader assigns the one partition the stream's key lands on — the key
  every producer of `runs.events` uses (the session id, or the run id of a sessionless run) —
  computed with the producer's own partitioner (aiokafka's `DefaultPartitioner`, murmur2 over
  the key bytes, modulo the partition count). Other sessions on that partition are filtered out.
- A position is `<partition>-<offset>` of an event's Kafka record (the SSE `id`); resuming
  after one starts at `offset + 1`, so nothing is repeated and nothing is missed.
- "Now" is the fetch high-watermark, not `ListOffsets(latest)`, which under-reports on Tansu
  after a multi-record batch: a stream that starts "now" must not show older events.
- Events are de-duplicated on `(run_id, type, event_key)` within one reader (the owner publishes
  again on an exact retry), over a bounded window. Across reconnections a client de-duplicates
  itself; resuming from a position never repeats a record anyway.
- A record that is not a `RunEvent` is skipped with a warning, never fatal to the stream.
- Paced (kit.fetch_pace): on Tansu an open stream fetched 100 times a second, nothing to show or
  not, and each cost the broker ~9 % of a core; quiet for `idle_after_s`, it fetches with the idle
  wait, or parks under its process's look-out with the other streams. Only its own records wake it,
  and they wake nothing else (`alone`). `expect_events()` (a run of the stream was just requested)
  brings the short wait back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Self

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from quipu.contracts.errors import QuipuError
from quipu.contracts.events import RunEvent
from quipu.contracts.topics import Topic
from quipu.services.kit import fetch_pace
from quipu.services.kit.delivery import MessageErasedError, PermanentError, RetryableError, describe_error
from quipu.services.kit.keys import MessageSeals, message_seals
from quipu.services.kit.settings import KafkaSettings, KeySettings

logger = structlog.get_logger(__name__)

DEDUP_WINDOW = 10_000
"""Event identities remembered per reader for de-duplication (oldest forgotten first)."""

_PARTITIONER = DefaultPartitioner()


MAX_POSITION_LENGTH = 40
"""Longest `<partition>-<offset>` read (two 64-bit numbers and a dash); anything longer is not one."""


class EventStreamError(QuipuError):
    """Raised when `runs.events` cannot be read: the topic is missing or the broker does not answer."""


class InvalidPositionError(QuipuError, ValueError):
    """Raised when a stream position is malformed or does not belong to the stream being read."""


class StartAt(StrEnum):
    """Where a stream without a resume position begins."""

    BEGINNING = "beginning"
    """The earliest record still in the partition: the session's whole retained history."""
    NOW = "now"
    """The partition's fetch high-watermark: only events published from now on."""


@dataclass(frozen=True, order=True)
class EventPosition:
    """Where an event is on `runs.events`: its record's partition and offset."""

    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.partition}-{self.offset}"

    @classmethod
    def parse(cls, text: str) -> EventPosition:
        """Read `<partition>-<offset>` (an SSE `Last-Event-ID`); raise InvalidPositionError.

        The error never repeats the text: it came from the caller and may be anything, of any length.
        """
        partition, separator, offset = text.strip().partition("-")
        if (
            len(text) > MAX_POSITION_LENGTH
            or not separator
            or not partition.isdigit()
            or not offset.isdigit()
        ):
            raise InvalidPositionError("not a position of this stream (<partition>-<offset>)")
        return cls(int(partition), int(offset))


@dataclass(frozen=True)
class StreamedEvent:
    """One run event and the position it was read at."""

    position: EventPosition
    event: RunEvent


def partition_for_key(key: str, partitions: list[int]) -> int:
    """The partition a producer with the default partitioner sends `key` to."""
    ordered = sorted(partitions)
    partition: int = _PARTITIONER(key.encode(), ordered, ordered)
    return partition


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str, tries: int = 50) -> list[int]:
    """The partition numbers of `topic` as a group-less consumer's metadata learns them; [] when it
    still does not exist after `tries` refreshes (a new consumer knows no topic until asked)."""
    for _ in range(tries):
        numbers = consumer.partitions_for_topic(topic)
        if numbers:
            return sorted(numbers)
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    return []


def stream_consumer(settings: KafkaSettings, client_id: str) -> AIOKafkaConsumer:
    """A consumer for live streams: no group (nothing to commit, no join to wait for), positioned
    by its owner, from the earliest record when a position is gone."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        consumer_timeout_ms=settings.consumer_timeout_ms,
    )


async def start_stream_consumer(consumer: AIOKafkaConsumer) -> None:
    """Start a `stream_consumer` so that it may be stopped at once."""
    await consumer.start()
    # aiokafka's group-less coordinator starts a task in start(); a stop() before that task first
    # ran raises CancelledError from the middle of stop() and leaks the connections.
    await asyncio.sleep(0)


class ShownEvents:
    """Which run events a stream shows: its session's (or its sessionless run's), each identity
    once within the last `DEDUP_WINDOW` (the owner publishes again on an exact retry)."""

    def __init__(self, session_id: str, run_id: str, *, deduplicate: bool = True) -> None:
        self._session_id = session_id
        self._run_id = run_id
        self._deduplicate = deduplicate
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def ours(self, event: RunEvent) -> bool:
        """Whether `event` is of the stream's session (or sessionless run)."""
        if self._session_id:
            return event.session_id == self._session_id
        return not event.session_id and event.run_id == self._run_id

    def wanted(self, event: RunEvent) -> bool:
        """Whether the stream shows `event` (remembered as shown when it does)."""
        if not self.ours(event):
            return False
        if not self._deduplicate:
            return True
        identity = event.dedup_key()
        if identity in self._seen:
            return False
        self._seen[identity] = None
        if len(self._seen) > DEDUP_WINDOW:
            self._seen.popitem(last=False)
        return True


async def decode_event(
    seals: MessageSeals, topic: str, partition: int, offset: int, value: bytes | None
) -> RunEvent | None:
    """The run event a record holds, opened; None (logged, never fatal) when it is not one or its
    principal was forgotten. EventStreamError when it cannot be opened now (the key channel)."""
    position = {"topic": topic, "partition": partition, "offset": offset}
    try:
        return RunEvent.model_validate_json(await seals.open(value or b""))
    except MessageErasedError:
        logger.info("run event of a forgotten principal skipped", **position)
        return None
    except (ValidationError, PermanentError) as error:
        logger.warning("unreadable run event skipped", **position, error=describe_error(error))
        return None
    except RetryableError as error:
        raise EventStreamError(f"{topic}: {describe_error(error)}") from error


class RunEventReader:
    """The run events of one session (or of one sessionless run), read live from `runs.events`."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        session_id: str = "",
        run_id: str = "",
        deduplicate: bool = True,
        client_id: str | None = None,
        seals: MessageSeals | None = None,
    ) -> None:
        """Read the events of `session_id`; without one, those of the sessionless run `run_id`.

        `seals` open sealed events (default: the key channel of `KeySettings()`, closed with the
        reader); an event whose principal was forgotten is skipped."""
        if not session_id and not run_id:
            raise ValueError("a run event stream needs a session id or a run id")
        self.session_id = session_id
        self.run_id = "" if session_id else run_id
        self._settings = settings
        self._owns_seals = seals is None
        self._seals = seals if seals is not None else message_seals(KeySettings())
        self._topic = settings.topic_prefix + Topic.RUNS_EVENTS.value
        self._shown = ShownEvents(session_id, self.run_id, deduplicate=deduplicate)
        self._client_id = client_id or f"{settings.client_id}-events"
        self._consumer: AIOKafkaConsumer | None = None
        self._pace: fetch_pace.FetchPace | None = None
        self._partition: TopicPartition | None = None
        self._next_offset = 0
        self._stopped = False

    @property
    def key(self) -> str:
        """The partition key of the stream's events."""
        return self.session_id or self.run_id

    @property
    def partition(self) -> int:
        """The partition read (known once started)."""
        if self._partition is None:
            raise EventStreamError("the reader is not started")
        number: int = self._partition.partition
        return number

    @property
    def next_offset(self) -> int:
        """The offset of the next record to read on the partition."""
        return self._next_offset

    async def start(
        self, *, after: EventPosition | None = None, start_at: StartAt = StartAt.BEGINNING
    ) -> None:
        """Connect and position the reader: just after `after`, else at `start_at`.

        Raises InvalidPositionError when `after` is on another partition than the stream's or
        ahead of its end (no such event was ever read: waiting for it would hold the stream open
        with nothing to show), EventStreamError when the topic cannot be found.
        """
        settings = self._settings
        self._consumer = stream_consumer(settings, self._client_id)
        try:
            await start_stream_consumer(self._consumer)
            partition = TopicPartition(self._topic, partition_for_key(self.key, await self._partitions()))
            if after is not None and after.partition != partition.partition:
                # Which partition holds the stream is the broker's business, not the caller's.
                raise InvalidPositionError("not a position of this stream")
            self._partition = partition
            self._consumer.assign([partition])
            if after is not None:
                if after.offset + 1 > await self._high_watermark():
                    raise InvalidPositionError("a position beyond the end of this stream")
                self._seek(after.offset + 1)
            elif start_at is StartAt.NOW:
                self._seek(await self._high_watermark())
            else:
                await self._consumer.seek_to_beginning(partition)
                self._next_offset = await self._consumer.position(partition)
            self._pace = fetch_pace.FetchPace(self._consumer, settings, alone=True)
            self._pace.start()
        except KafkaError as error:
            await self.stop()
            raise EventStreamError(f"{self._topic}: {error!r}") from error
        except BaseException:
            await self.stop()
            raise

    def _seek(self, offset: int) -> None:
        assert self._consumer is not None and self._partition is not None
        self._consumer.seek(self._partition, offset)
        self._next_offset = offset

    async def _partitions(self) -> list[int]:
        assert self._consumer is not None
        numbers = await topic_partitions(self._consumer, self._topic)
        if not numbers:
            raise EventStreamError(f"topic {self._topic} does not exist")
        return numbers

    async def _high_watermark(self, within_s: float = 10.0) -> int:
        """The partition's end as the last fetch reported it (never ListOffsets: PLATFORM_NOTES).

        The fetch starts from the (possibly under-reported) ListOffsets end, so it reads at most
        the tail of one batch; whatever it returns is older than the watermark and dropped.
        """
        assert self._consumer is not None and self._partition is not None
        await self._consumer.seek_to_end(self._partition)
        deadline = time.monotonic() + within_s
        while True:
            await self._consumer.getmany(self._partition, timeout_ms=100)
            watermark = self._consumer.highwater(self._partition)
            if watermark is not None:
                return int(watermark)
            if time.monotonic() > deadline:
                raise EventStreamError(f"{self._topic}: no fetch answered within {within_s} s")

    async def read(self, timeout_s: float = 1.0) -> list[StreamedEvent]:
        """The stream's next events, waiting up to `timeout_s` for some; empty when none came."""
        if self._consumer is None or self._partition is None:
            raise EventStreamError("the reader is not started")
        try:
            batches = await self._consumer.getmany(self._partition, timeout_ms=int(timeout_s * 1000))
        except KafkaError as error:
            raise EventStreamError(f"{self._topic}: {error!r}") from error
        streamed: list[StreamedEvent] = []
        for record in batches.get(self._partition, []):
            if record.offset < self._next_offset:
                continue  # fetched before a seek; never shown
            self._next_offset = record.offset + 1
            event = await decode_event(self._seals, self._topic, self.partition, record.offset, record.value)
            if event is not None and self._shown.wanted(event):
                streamed.append(StreamedEvent(EventPosition(self._partition.partition, record.offset), event))
        return streamed

    def expect_events(self) -> None:
        """Events of the stream will come soon (a run of it was just requested): fetch with the
        short wait from now on, parked or idle."""
        if self._consumer is not None:
            fetch_pace.expect(self._consumer)

    async def stop(self) -> None:
        """Close the consumer; safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        pace, self._pace = self._pace, None
        if pace is not None:
            await pace.stop()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaError):
                await consumer.stop()
        if self._owns_seals:
            await self._seals.close()

    @property
    def stopped(self) -> bool:
        """Whether `stop()` was called."""
        return self._stopped

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()
