"""The gateway's I/O: the live event streams (SSE); requests go out through the shared
`quipu.services.domain.run_publisher`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import anyio
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from quipu.contracts.topics import Topic
from quipu.services.gateway.access import AcceptedRuns, accepted_elsewhere
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.run_events import (
    EventPosition,
    EventStreamError,
    RunEventReader,
    StartAt,
    StreamedEvent,
    topic_partitions,
)
from quipu.services.kit.settings import KafkaSettings

logger = structlog.get_logger(__name__)

RECONNECT_DELAY_MS = 2000
"""The `retry:` a stream announces: how long a browser waits before it reconnects."""


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
    """One `RunEventReader` per SSE connection: opened by the request, closed when the client goes.

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
        self._settings = settings
        self._seals = seals
        self._keepalive_s = keepalive_s
        self._poll_s = min(poll_s, keepalive_s)
        self._open: set[RunEventReader] = set()
        self._closing = asyncio.Event()

    @property
    def open_count(self) -> int:
        """Streams open right now."""
        return len(self._open)

    async def open(
        self, session_id: str, *, after: EventPosition | None = None, start_at: StartAt = StartAt.BEGINNING
    ) -> RunEventReader:
        """A started reader of the session's events (raises InvalidPositionError, EventStreamError)."""
        reader = RunEventReader(
            self._settings, session_id=session_id, client_id="gateway-events", seals=self._seals
        )
        await reader.start(after=after, start_at=start_at)
        self._open.add(reader)
        logger.info(
            "event stream opened",
            session_id=session_id,
            partition=reader.partition,
            offset=reader.next_offset,
            open_streams=len(self._open),
        )
        return reader

    async def release(self, reader: RunEventReader) -> None:
        """Stop a reader and forget it; safe to call more than once."""
        if reader in self._open:
            self._open.discard(reader)
            logger.info("event stream closed", session_id=reader.session_id, open_streams=len(self._open))
        await reader.stop()

    def close(self) -> None:
        """Make every open stream end at its next poll."""
        self._closing.set()

    async def body(self, reader: RunEventReader) -> AsyncIterator[bytes]:
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
    """Follows `runs.requested` from its end, outside any group, so this gateway copy learns the runs
    every copy accepts (`GET /v1/runs/{id}` answers 202 for them until the planner starts them).

    Only ids and the owner labels a gateway stamped are read from each record (`accepted_elsewhere`);
    anything else on the topic is passed over. A broker failure is logged and read past after a
    pause: this is a courtesy to callers, never a reason to stop the gateway.
    """

    def __init__(
        self, settings: KafkaSettings, accepted: AcceptedRuns, *, client_id: str = "gateway"
    ) -> None:
        self._settings = settings
        self._accepted = accepted
        self._client_id = client_id
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Assign every partition of the topic at its end and start following."""
        name = self._settings.topic_prefix + Topic.RUNS_REQUESTED.value
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap,
            client_id=f"{self._client_id}-requested",
            group_id=None,
            enable_auto_commit=False,
            # Only a copy that did not accept the run needs it, for an answer of 202 instead of 404.
            fetch_max_wait_ms=self._settings.background_fetch_max_wait_ms,
        )
        await consumer.start()
        self._consumer = consumer
        await asyncio.sleep(0)  # see RunEventReader.start: let the group-less coordinator start
        numbers = await topic_partitions(consumer, name)
        if not numbers:
            logger.warning("runs.requested not found: only this copy's accepted runs answer 202")
            return
        partitions = [TopicPartition(name, number) for number in numbers]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        self._task = asyncio.create_task(self._follow(consumer))

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=1000)
            except KafkaError as error:
                logger.warning("following runs.requested", error=type(error).__name__)
                await asyncio.sleep(1.0)
                continue
            now = time.monotonic()
            for records in batches.values():
                for record in records:
                    accepted = accepted_elsewhere(record.value or b"")
                    if accepted is not None:
                        run_id, owner, session_id = accepted
                        self._accepted.add(run_id, owner, session_id, now)

    async def stop(self) -> None:
        """Stop following and close the consumer."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
