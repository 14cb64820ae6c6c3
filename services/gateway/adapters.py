"""The gateway's I/O: the live event streams (SSE); requests go out through the shared
`quipu.services.domain.run_publisher`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from quipu.contracts.topics import Topic
from quipu.services.gateway.access import AcceptedRuns, accepted_elsewhere
from quipu.services.kit.event_feed import EventFeed, FedStream
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.run_events import (
    EventPosition,
    EventStreamError,
    StartAt,
    StreamedEvent,
    topic_partitions,
)
from quipu.services.kit.settings import KafkaSettings

logger = structlog.get_logger(__name__)

RECONNECT_DELAY_MS = 2000
"""The `retry:` a stream announces: how long a browser waits before it reconnects."""

CATCH_UP_S = 2.0
"""Longest a lookup of a run another copy accepted reads `runs.requested` before it answers from
what it knows (a GET waits on it)."""


def sse_event(streamed: StreamedEvent) -> bytes:
    """One run event in the SSE wire format: its position as `id`, its type as `event`, JSON `data`."""
    return (
        f"id: {streamed.position}\n"
        f"event: {streamed.event.type.value}\n"
        f"data: {streamed.event.model_dump_json()}\n\n"
    ).encode()


def sse_comment(text: str) -> bytes:
    """An SSE comment line: ignored by clients, it keeps idle connections open."""
    return f": {text}\n\n".encode()


class EventStreams:
    """One stream per SSE connection, opened by the request and closed when the client goes, all
    read through one `EventFeed` (one consumer for the gateway's streams, each record opened once).

    `close()` ends every open stream (their responses finish), so a server can shut down without
    waiting for clients that never leave.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        keepalive_s: float = 15.0,
        poll_s: float = 1.0,
        seals: MessageSeals | None = None,
    ) -> None:
        """`seals` open sealed events for every stream (one key cache for all of them); without
        them each reader builds its own from `KeySettings()`."""
        self._feed = EventFeed(settings, client_id="gateway-events", seals=seals)
        self._keepalive_s = keepalive_s
        self._poll_s = min(poll_s, keepalive_s)
        self._open: set[FedStream] = set()
        self._closing = asyncio.Event()

    @property
    def feed(self) -> EventFeed:
        """What reads every open stream."""
        return self._feed

    @property
    def open_count(self) -> int:
        """Streams open right now."""
        return len(self._open)

    async def open(
        self, session_id: str, *, after: EventPosition | None = None, start_at: StartAt = StartAt.BEGINNING
    ) -> FedStream:
        """A started stream of the session's events (raises InvalidPositionError, EventStreamError)."""
        reader = await self._feed.open(session_id=session_id, after=after, start_at=start_at)
        self._open.add(reader)
        logger.info(
            "event stream opened",
            session_id=session_id,
            partition=reader.partition,
            offset=reader.next_offset,
            open_streams=len(self._open),
        )
        return reader

    def expect(self, key: str) -> None:
        """A run of the streams keyed `key` (a session id) was just requested: their readers fetch
        with the short wait at once (idle, they may be parked: the run's first events would wait
        for the look-out's fetch)."""
        for stream in self._open:
            if stream.key == key:
                stream.expect_events()

    async def release(self, reader: FedStream) -> None:
        """Stop a reader and forget it; safe to call more than once."""
        if reader in self._open:
            self._open.discard(reader)
            logger.info("event stream closed", session_id=reader.session_id, open_streams=len(self._open))
        await reader.stop()

    def close(self) -> None:
        """Make every open stream end at its next poll."""
        self._closing.set()

    async def body(self, reader: FedStream) -> AsyncIterator[bytes]:
        """The SSE body of one connection: events as they arrive, a keep-alive comment when idle.

        A client that goes away cancels this generator (Starlette watches for the disconnect);
        the reader is stopped in any case.
        """
        try:
            yield f"retry: {RECONNECT_DELAY_MS}\n".encode() + sse_comment(
                f"session {reader.session_id} partition {reader.partition} from offset {reader.next_offset}"
            )
            quiet_since = time.monotonic()
            while not self._closing.is_set():
                events = await reader.read(timeout_s=self._poll_s)
                if events:
                    yield b"".join(sse_event(streamed) for streamed in events)
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= self._keepalive_s:
                    yield sse_comment("keep-alive")
                    quiet_since = time.monotonic()
        except EventStreamError as error:
            # The client reconnects with Last-Event-ID and loses nothing.
            logger.warning("event stream interrupted", session_id=reader.session_id, error=str(error))
        finally:
            # The cancel scope of a disconnect would cancel the awaits of the clean-up too.
            with anyio.CancelScope(shield=True):
                await self.release(reader)


class RequestedRuns:
    """Reads `runs.requested` outside any group when asked (`catch_up`), so this gateway copy knows
    the runs every copy accepted (`GET /v1/runs/{id}` answers 202 for them until the planner starts
    them).

    It is read to its end of the moment a lookup misses, not followed: an idle gateway fetched the
    topic four times a second for the rare GET of a run another copy accepted, and a copy that
    followed could still answer 404 for a run accepted a moment before. Concurrent misses share one
    read. Only ids and the owner labels a gateway stamped are read from each record
    (`accepted_elsewhere`); anything else on the topic is passed over. A broker failure or a read
    longer than `catch_up_s` is logged and the lookup answers from what is known: this is a courtesy
    to callers, never a reason to fail the request.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        accepted: AcceptedRuns,
        *,
        client_id: str = "gateway",
        catch_up_s: float = CATCH_UP_S,
    ) -> None:
        self._settings = settings
        self._accepted = accepted
        self._client_id = client_id
        self._catch_up_s = catch_up_s
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []
        self._reading = asyncio.Lock()
        self._read_through = float("-inf")
        """When the last read that reached the end began (monotonic)."""

    async def start(self) -> None:
        """Assign every partition of the topic at its end, paused."""
        name = self._settings.topic_prefix + Topic.RUNS_REQUESTED.value
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap,
            client_id=f"{self._client_id}-requested",
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=self._settings.fetch_max_wait_ms,
            consumer_timeout_ms=self._settings.consumer_timeout_ms,
        )
        await consumer.start()
        self._consumer = consumer
        await asyncio.sleep(0)  # see run_events.start_stream_consumer: let the coordinator start
        numbers = await topic_partitions(consumer, name)
        if not numbers:
            logger.warning("runs.requested not found: only this copy's accepted runs answer 202")
            return
        self._partitions = [TopicPartition(name, number) for number in numbers]
        consumer.assign(self._partitions)
        consumer.pause(*self._partitions)
        await consumer.seek_to_end(*self._partitions)
        for partition in self._partitions:
            await consumer.position(partition)  # resolved now: nothing accepted from here is missed

    async def catch_up(self) -> None:
        """Learn every run accepted on any copy until now (read to the topic's current end)."""
        asked = time.monotonic()
        async with self._reading:
            if self._consumer is None or not self._partitions or self._read_through >= asked:
                return  # a read that began after the ask has just reached the end
            began = time.monotonic()
            try:
                async with asyncio.timeout(self._catch_up_s):
                    await self._read_to_end(self._consumer)
            except (KafkaError, TimeoutError) as error:
                logger.warning("reading runs.requested", error=type(error).__name__)
                return
            self._read_through = began

    async def _read_to_end(self, consumer: AIOKafkaConsumer) -> None:
        # The end offsets are asked after the lookup missed, so a request accepted before is below
        # them. Tansu may report a multi-record batch's end as its first offset + 1: a fetch returns
        # whole batches, so reading past that offset reads the rest of the batch too.
        ends = await consumer.end_offsets(self._partitions)
        behind = await _behind(consumer, self._partitions, ends)
        try:
            while behind:
                consumer.resume(*behind)
                batches = await consumer.getmany(*behind, timeout_ms=int(self._catch_up_s * 1000))
                now = time.monotonic()
                for records in batches.values():
                    for record in records:
                        accepted = accepted_elsewhere(record.value or b"")
                        if accepted is not None:
                            run_id, owner, session_id = accepted
                            self._accepted.add(run_id, owner, session_id, now)
                behind = await _behind(consumer, behind, ends)
        finally:
            consumer.pause(*self._partitions)

    async def stop(self) -> None:
        """Close the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


async def _behind(
    consumer: AIOKafkaConsumer, partitions: list[TopicPartition], ends: dict[TopicPartition, int]
) -> list[TopicPartition]:
    """Those of `partitions` the consumer has not read up to their end in `ends`."""
    return [partition for partition in partitions if await consumer.position(partition) < ends[partition]]
