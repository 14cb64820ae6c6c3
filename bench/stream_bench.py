"""Live event streams under load: a consumer per stream against one `EventFeed` for them all.

On the embedded stack, in this process: `STREAMS` streams open from now on as many sessions, then
`EVENTS` run events published for them (round-robin over the sessions, keyed by session as the
owner publishes them), read until every stream has had its own. Twice, on fresh topics each:

- own readers: every stream a `RunEventReader` with a consumer of its own (how `quipu run` and the
  client read one session; how the gateway read each SSE client's before `EventFeed`);
- feed: every stream through one `EventFeed` (how the gateway reads them now).

`streams_cpu_ms_per_1000_events_own_readers` / `_feed`: this process's CPU and the broker's, per
1000 events delivered (every stream reads its partition: a record is fetched and opened once per
stream on it with own readers, once with the feed); `streams_feed_vs_own_readers_cpu_ratio`
(below 1: the feed costs less); `streams_delivery_s_own_readers` / `_feed`: from the first publish
to the last event read.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aiokafka import AIOKafkaProducer

from bench.fleet import broker_pid
from bench.run_instruments import process_cpu_s
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.event_feed import EventFeed
from quipu.services.kit.publishing import Outgoing, producer_publisher
from quipu.services.kit.run_events import RunEventReader, StartAt, StreamedEvent
from quipu.services.kit.settings import KafkaSettings

STREAMS = 50
"""Streams open at once (UIs watching their conversations)."""
EVENTS = 5000
"""Events published for them, spread evenly."""
DEADLINE_S = 300.0
"""Longest one side may take to deliver every event (a collapsing side is reported, not waited on)."""

Figures = dict[str, float]


class Stream(Protocol):
    """What both ways of reading give a stream."""

    async def read(self, timeout_s: float = 1.0) -> list[StreamedEvent]: ...

    async def stop(self) -> None: ...


async def _own_readers(
    settings: KafkaSettings, sessions: Sequence[str]
) -> tuple[list[Stream], Callable[[], Awaitable[None]]]:
    readers = [
        RunEventReader(settings, session_id=session_id, client_id="bench-stream") for session_id in sessions
    ]
    await asyncio.gather(*(reader.start(start_at=StartAt.NOW) for reader in readers))

    async def done() -> None:
        await asyncio.gather(*(reader.stop() for reader in readers))

    return list(readers), done


async def _fed(
    settings: KafkaSettings, sessions: Sequence[str]
) -> tuple[list[Stream], Callable[[], Awaitable[None]]]:
    feed = EventFeed(settings, client_id="bench-feed")
    streams = [await feed.open(session_id=session_id, start_at=StartAt.NOW) for session_id in sessions]

    async def done() -> None:
        for stream in streams:
            await stream.stop()

    return list(streams), done


def _event(session_id: str, index: int) -> RunEvent:
    return RunEvent(
        type=StreamEventType.ASSISTANT_REPLY,
        event_key=f"{session_id}/reply/{index}",
        run_id=f"{session_id}-run",
        session_id=session_id,
        timestamp=utc_now_ms(),
        payload={"delta": f"word{index} "},
    )


async def _delivered(
    stack: EmbeddedStack,
    opening: Callable[
        [KafkaSettings, Sequence[str]], Awaitable[tuple[list[Stream], Callable[[], Awaitable[None]]]]
    ],
) -> tuple[float, float]:
    """(CPU seconds of this process and the broker, wall seconds) to deliver every event."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    await create_topics(stack.bootstrap, prefix)
    settings = stack.kafka_settings(topic_prefix=prefix)
    sessions = [f"s-{uuid.uuid4().hex[:10]}" for _ in range(STREAMS)]
    share = EVENTS // STREAMS
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap, linger_ms=5)
    await producer.start()
    streams, close = await opening(settings, sessions)
    broker = broker_pid(stack)
    try:

        async def read_all(stream: Stream) -> None:
            count = 0
            while count < share:
                count += len(await stream.read(timeout_s=1.0))

        cpu_before, broker_before, started = time.process_time(), process_cpu_s(broker), time.perf_counter()
        readers = [asyncio.create_task(read_all(stream)) for stream in streams]
        publisher = producer_publisher(producer, settings)  # to runs.events, keyed by session
        for index in range(share):
            await publisher.publish_together([Outgoing(_event(session_id, index)) for session_id in sessions])
        await asyncio.wait_for(asyncio.gather(*readers), DEADLINE_S)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_before + process_cpu_s(broker) - broker_before
    finally:
        await close()
        await producer.stop()
        await delete_topics(stack.bootstrap, prefix)
    return cpu, wall


async def measure_streams() -> Figures:
    """The stream figures of `bench/results/latest.json`."""
    with EmbeddedStack() as stack:
        own_cpu, own_wall = await _delivered(stack, _own_readers)
        fed_cpu, fed_wall = await _delivered(stack, _fed)
    per_thousand = 1000 / (STREAMS * (EVENTS // STREAMS))
    print(
        f"\n{STREAMS} live streams, {EVENTS} events: own readers {own_cpu:.2f} s of CPU in {own_wall:.1f} s, "
        f"one feed {fed_cpu:.2f} s in {fed_wall:.1f} s"
    )
    return {
        "streams_cpu_ms_per_1000_events_own_readers": own_cpu * 1000 * per_thousand,
        "streams_cpu_ms_per_1000_events_feed": fed_cpu * 1000 * per_thousand,
        "streams_feed_vs_own_readers_cpu_ratio": fed_cpu / own_cpu,
        "streams_delivery_s_own_readers": own_wall,
        "streams_delivery_s_feed": fed_wall,
    }


if __name__ == "__main__":
    from bench.report import print_table, save

    figures = asyncio.run(measure_streams())
    print_table(figures)
    save(figures)
