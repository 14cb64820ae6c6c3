"""One consumer for every live event stream of a process: the gateway's SSE clients.

A `RunEventReader` reads its session's partition of `runs.events` with a consumer of its own, so a
gateway with a hundred open UIs ran a hundred fetch loops, each fetching and opening every record
of its partition whatever session it was for. `EventFeed` reads the partitions that have streams
with one consumer, opens each record once, and hands it to the streams of that partition
(`FedStream`), each of which shows its own session's events as a reader does (`ShownEvents`).

A stream is positioned as a reader is (a resume position, the beginning, or now:
`RunEventReader.start`, with its checks), by a reader of its own, and then joins the feed where
that reader stands:

- a partition the feed does not read yet is added at that offset, and the reader stops;
- a partition the feed reads at or before that offset: the stream takes the feed's records from
  its offset on, and the reader stops;
- a partition the feed has read past it (a stream from the beginning, or resuming from far back):
  its reader reads on alone up to where the feed stood when it joined, while the feed keeps its
  records from there on for it. Nothing is missed and nothing shown twice.

A partition no stream reads any more is dropped, and the feed's consumer stops with its last
stream (the next stream starts it again). The consumer is paced as a reader's is
(kit.fetch_pace, `alone`): idle, it parks; `expect()` (a run of one of its sessions was just
requested) brings the short wait back.

A stream holding `MAX_BEHIND` of its events unread (its client stopped reading), or a broker
error, ends with `EventStreamError`: the client reconnects from its last position and
loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from quipu.contracts.topics import Topic
from quipu.services.kit import fetch_pace
from quipu.services.kit.consumers import stop_consumer
from quipu.services.kit.keys import MessageSeals, message_seals
from quipu.services.kit.run_events import (
    EventPosition,
    EventStreamError,
    RunEventReader,
    ShownEvents,
    StartAt,
    StreamedEvent,
    decode_event,
    start_stream_consumer,
    stream_consumer,
)
from quipu.services.kit.settings import KafkaSettings, KeySettings

MAX_BEHIND = 10_000
"""Events of its own a stream may hold unread before it is ended (its client reconnects and reads
them from its last position)."""

POLL_MS = 1000
"""Longest one read of the feed's consumer waits for records (a stop ends it at once)."""


class FedStream:
    """One session's live events, read through its process's `EventFeed`."""

    def __init__(self, feed: EventFeed, reader: RunEventReader, joined_at: int) -> None:
        self.session_id = reader.session_id
        self.run_id = reader.run_id
        self.key = reader.key
        """The partition key of the stream's events."""
        self.partition = reader.partition
        self._feed = feed
        self._joined_at = joined_at
        """The feed's records from this offset on are the stream's; before it, its reader's."""
        self._reader: RunEventReader | None = reader if reader.next_offset < joined_at else None
        self._next_offset = joined_at
        self._shown = ShownEvents(reader.session_id, reader.run_id)
        self._held: list[StreamedEvent] = []
        self._arrived = asyncio.Event()
        self._error: EventStreamError | None = None
        self._stopped = False

    @property
    def next_offset(self) -> int:
        """The offset of the next record the stream reads on its partition."""
        return self._reader.next_offset if self._reader is not None else self._next_offset

    @property
    def catching_up(self) -> bool:
        """Whether its own reader still reads what came before the feed's records."""
        return self._reader is not None

    def offer(self, offset: int, streamed: StreamedEvent | None) -> None:
        """The feed read the record at `offset` of the stream's partition (None: not an event)."""
        if offset < self._next_offset or self._error is not None:
            return
        self._next_offset = offset + 1
        if streamed is None or not self._shown.ours(streamed.event):
            return
        if len(self._held) >= MAX_BEHIND:
            self.fail(EventStreamError(f"the stream holds {MAX_BEHIND} events its client has not read"))
            return
        self._held.append(streamed)
        self._arrived.set()

    def fail(self, error: EventStreamError) -> None:
        """End the stream: its next read raises `error`."""
        self._error = error
        self._arrived.set()

    async def read(self, timeout_s: float = 1.0) -> list[StreamedEvent]:
        """The stream's next events, waiting up to `timeout_s` for some; empty when none came."""
        if self._error is not None:
            raise self._error
        if self._reader is not None:
            return await self._catch_up(self._reader, timeout_s)
        if not self._held:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            if self._error is not None:
                raise self._error
        held, self._held = self._held, []
        return [streamed for streamed in held if self._shown.wanted(streamed.event)]

    async def _catch_up(self, reader: RunEventReader, timeout_s: float) -> list[StreamedEvent]:
        read = await reader.read(timeout_s)
        earlier = [streamed for streamed in read if streamed.position.offset < self._joined_at]
        if reader.next_offset >= self._joined_at:
            self._reader = None
            await reader.stop()
        return [streamed for streamed in earlier if self._shown.wanted(streamed.event)]

    def expect_events(self) -> None:
        """Events of the stream will come soon: its reader, or the feed, fetches with the short wait."""
        if self._reader is not None:
            self._reader.expect_events()
        self._feed.expect()

    async def stop(self) -> None:
        """Leave the feed; safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()
        await self._feed.leave(self)


class EventFeed:
    """The partitions of `runs.events` that have live streams in this process, read by one consumer."""

    def __init__(
        self, settings: KafkaSettings, *, client_id: str = "events", seals: MessageSeals | None = None
    ) -> None:
        """`seals` open sealed events (default: the key channel of `KeySettings()`, from the first
        stream to the last)."""
        self._settings = settings
        self._topic = settings.topic_prefix + Topic.RUNS_EVENTS.value
        self._client_id = client_id
        self._given_seals = seals
        self._seals: MessageSeals | None = seals
        self._streams: dict[int, set[FedStream]] = {}
        self._next: dict[int, int] = {}
        """The offset of the next record the feed hands out, by partition."""
        self._members = 0
        """Streams joined or joining: the consumer runs while there is any."""
        self._changing = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._pace: fetch_pace.FetchPace | None = None
        self._reading: asyncio.Task[None] | None = None

    @property
    def partitions(self) -> list[int]:
        """The partitions the feed reads now."""
        return sorted(self._streams)

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The feed's consumer while any stream is open."""
        return self._consumer

    async def open(
        self,
        *,
        session_id: str = "",
        run_id: str = "",
        after: EventPosition | None = None,
        start_at: StartAt = StartAt.BEGINNING,
    ) -> FedStream:
        """A stream of the session's (else the sessionless run's) events, positioned as
        `RunEventReader.start` positions (InvalidPositionError, EventStreamError)."""
        async with self._changing:
            self._members += 1
            try:
                seals = await self._started()
            except BaseException:
                self._members -= 1
                if self._members == 0:
                    await self._stop()
                raise
        try:
            reader = RunEventReader(
                self._settings,
                session_id=session_id,
                run_id=run_id,
                deduplicate=False,  # the stream de-duplicates what its reader and the feed hand it
                client_id=self._client_id,
                seals=seals,
            )
            await reader.start(after=after, start_at=start_at)
        except BaseException:
            await self._left()
            raise
        stream = self._join(reader)
        if not stream.catching_up:
            await reader.stop()
        return stream

    def expect(self) -> None:
        """Events will come soon: fetch with the short wait, parked or idle."""
        fetch_pace.expect(self._consumer)

    async def _started(self) -> MessageSeals:
        if self._consumer is None:
            if self._seals is None:
                self._seals = message_seals(KeySettings())
            consumer = stream_consumer(self._settings, self._client_id)
            try:
                await start_stream_consumer(consumer)
            except KafkaError as error:
                await stop_consumer(consumer)
                raise EventStreamError(f"{self._topic}: {error!r}") from error
            self._consumer = consumer
            self._pace = fetch_pace.FetchPace(consumer, self._settings, alone=True)
            self._pace.start()
            self._reading = asyncio.create_task(self._read(consumer), name="event-feed")
        assert self._seals is not None
        return self._seals

    def _join(self, reader: RunEventReader) -> FedStream:
        partition, offset = reader.partition, reader.next_offset
        streams = self._streams.get(partition)
        if streams is None:
            self._next[partition] = offset
            stream = FedStream(self, reader, joined_at=offset)
            self._streams[partition] = {stream}
            self._assign()
        else:
            stream = FedStream(self, reader, joined_at=max(offset, self._next[partition]))
            streams.add(stream)
        if self._pace is not None:
            self._pace.wake()  # at the short wait for a while, as a new reader is: it was just opened
        return stream

    def _assign(self) -> None:
        """Read exactly the partitions that have streams, each from where the feed stands on it."""
        consumer = self._consumer
        assert consumer is not None
        partitions = {number: TopicPartition(self._topic, number) for number in self._streams}
        # A new assignment forgets every position (and drops what was fetched for the old one).
        consumer.assign(list(partitions.values()))
        for number, partition in partitions.items():
            consumer.seek(partition, self._next[number])

    async def leave(self, stream: FedStream) -> None:
        """`stream` is stopped: its partition is dropped when it was the last there."""
        streams = self._streams.get(stream.partition)
        if streams is not None and stream in streams:
            streams.discard(stream)
            if not streams:
                del self._streams[stream.partition]
                del self._next[stream.partition]
                if self._consumer is not None:
                    self._assign()
        await self._left()

    async def _left(self) -> None:
        async with self._changing:
            self._members -= 1
            if self._members == 0:
                await self._stop()

    async def _stop(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        pace, self._pace = self._pace, None
        if pace is not None:
            await pace.stop()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaError):
                await stop_consumer(consumer)
        if self._given_seals is None and self._seals is not None:
            seals, self._seals = self._seals, None
            await seals.close()

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=POLL_MS)
            except KafkaError as error:
                self._drop(list(self._streams), EventStreamError(f"{self._topic}: {error!r}"))
                await asyncio.sleep(POLL_MS / 1000)  # the broker is failing: do not ask again at once
                continue
            for partition, records in batches.items():
                try:
                    await self._hand_out(partition.partition, records)
                except EventStreamError as error:
                    self._drop([partition.partition], error)

    async def _hand_out(self, partition: int, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        assert self._seals is not None
        for record in records:
            if partition not in self._streams or record.offset < self._next[partition]:
                continue  # fetched before a seek, or for streams gone meanwhile
            event = await decode_event(self._seals, self._topic, partition, record.offset, record.value)
            if partition not in self._streams:
                return
            self._next[partition] = record.offset + 1
            position = EventPosition(partition, record.offset)
            streamed = StreamedEvent(position, event) if event is not None else None
            for stream in list(self._streams[partition]):
                stream.offer(record.offset, streamed)

    def _drop(self, partitions: list[int], error: EventStreamError) -> None:
        """End every stream of `partitions` and stop reading them: a stream opened later reads
        them again from where it stands (nothing that failed here is lost to it)."""
        for partition in partitions:
            for stream in self._streams.pop(partition, set()):
                stream.fail(error)
            self._next.pop(partition, None)
        if self._consumer is not None:
            self._assign()
