"""`EventFeed`: a process's live event streams read by one consumer, on the embedded broker.

Each stream shows exactly what a `RunEventReader` of its own would: its session's events, in
order, once, from where it was positioned; joining a partition the feed already reads, from
before where the feed stands, never loses or repeats an event.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaProducer

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.topics import TOPICS, Topic
from quipu.contracts.wire import utc_now_ms
from quipu.services.kit import event_feed
from quipu.services.kit.event_feed import EventFeed, FedStream
from quipu.services.kit.run_events import EventPosition, EventStreamError, StartAt, partition_for_key
from quipu.services.kit.settings import KafkaSettings
from tests.timing import scaled

PARTITIONS = list(range(next(spec.partitions for spec in TOPICS if spec.topic is Topic.RUNS_EVENTS)))


def session_on(partition: int, *, avoid: str = "") -> str:
    """A fresh session id whose events land on `partition`."""
    while True:
        candidate = f"s-{uuid.uuid4().hex[:10]}"
        if candidate != avoid and partition_for_key(candidate, PARTITIONS) == partition:
            return candidate


def reply(session_id: str, index: int) -> RunEvent:
    return RunEvent(
        type=StreamEventType.ASSISTANT_REPLY,
        event_key=f"{session_id}/reply/{index}",
        run_id=f"{session_id}-run",
        session_id=session_id,
        timestamp=utc_now_ms(),
        payload={"delta": f"word{index} "},
    )


@pytest.fixture
async def producer(kafka_settings: KafkaSettings) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


@pytest.fixture
async def feed(kafka_settings: KafkaSettings) -> AsyncIterator[EventFeed]:
    feed = EventFeed(kafka_settings, client_id="test-feed")
    yield feed
    assert feed.consumer is None, "a stream was left open"


@pytest.fixture
def small_backlog(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(event_feed, "MAX_BEHIND", 3)
    yield 3


async def publish(producer: AIOKafkaProducer, settings: KafkaSettings, events: list[RunEvent]) -> list[int]:
    """Publish as the owner does (keyed by session); the offsets the events got."""
    topic = settings.topic_prefix + Topic.RUNS_EVENTS.value
    offsets = []
    for event in events:
        sent = await producer.send_and_wait(
            topic, event.model_dump_json().encode(), key=event.session_id.encode()
        )
        offsets.append(sent.offset)
    return offsets


async def read_keys(stream: FedStream, count: int) -> list[str]:
    """The event keys of the stream's next `count` events (fails if they do not come in time)."""
    read: list[str] = []
    async with asyncio.timeout(scaled(15)):
        while len(read) < count:
            read += [streamed.event.event_key for streamed in await stream.read(0.2)]
    return read


async def nothing_more(stream: FedStream) -> None:
    assert await stream.read(scaled(0.3)) == []


async def test_the_streams_of_a_process_share_one_consumer_and_each_shows_its_own_session(
    feed: EventFeed, producer: AIOKafkaProducer, kafka_settings: KafkaSettings
) -> None:
    first = session_on(PARTITIONS[0])
    neighbour = session_on(PARTITIONS[0], avoid=first)
    elsewhere = session_on(PARTITIONS[-1])
    streams = [
        await feed.open(session_id=session_id, start_at=StartAt.NOW)
        for session_id in (first, neighbour, elsewhere)
    ]
    try:
        consumer = feed.consumer
        assert consumer is not None
        assert feed.partitions == sorted({PARTITIONS[0], PARTITIONS[-1]})
        events = {
            session_id: [reply(session_id, index) for index in range(3)]
            for session_id in (first, neighbour, elsewhere)
        }
        interleaved = [event for batch in zip(*events.values(), strict=True) for event in batch]
        await publish(producer, kafka_settings, interleaved)
        for stream in streams:
            assert await read_keys(stream, 3) == [event.event_key for event in events[stream.session_id]]
            await nothing_more(stream)
        assert feed.consumer is consumer
    finally:
        for stream in streams:
            await stream.stop()


async def test_a_stream_from_before_where_the_feed_stands_reads_up_to_it_alone_then_from_the_feed(
    feed: EventFeed, producer: AIOKafkaProducer, kafka_settings: KafkaSettings
) -> None:
    live = session_on(PARTITIONS[0])
    late = session_on(PARTITIONS[0], avoid=live)
    watching = await feed.open(session_id=live, start_at=StartAt.NOW)
    try:
        history = [reply(late, index) for index in range(4)]
        offsets = await publish(producer, kafka_settings, [*history[:2], reply(live, 0), *history[2:]])
        assert await read_keys(watching, 1) == [f"{live}/reply/0"]  # the feed has read past them all

        from_start = await feed.open(session_id=late, start_at=StartAt.BEGINNING)
        resumed = await feed.open(session_id=late, after=EventPosition(PARTITIONS[0], offsets[0]))
        assert from_start.catching_up and resumed.catching_up
        fresh = [reply(late, index) for index in range(4, 6)]
        await publish(producer, kafka_settings, fresh)
        try:
            every = [event.event_key for event in history + fresh]
            assert await read_keys(from_start, 6) == every
            assert await read_keys(resumed, 5) == every[1:]
            assert not from_start.catching_up and not resumed.catching_up
            await nothing_more(from_start)
            await nothing_more(resumed)
        finally:
            await from_start.stop()
            await resumed.stop()
    finally:
        await watching.stop()


async def test_a_partition_is_read_only_while_it_has_streams_and_the_consumer_stops_with_the_last(
    feed: EventFeed, producer: AIOKafkaProducer, kafka_settings: KafkaSettings
) -> None:
    one = await feed.open(session_id=session_on(PARTITIONS[0]), start_at=StartAt.NOW)
    other_session = session_on(PARTITIONS[-1])
    other = await feed.open(session_id=other_session, start_at=StartAt.NOW)
    await one.stop()
    assert feed.partitions == [PARTITIONS[-1]]
    await publish(producer, kafka_settings, [reply(other_session, 0)])
    assert await read_keys(other, 1) == [f"{other_session}/reply/0"]
    await other.stop()
    assert feed.partitions == [] and feed.consumer is None

    again = await feed.open(session_id=other_session)  # the next stream starts the feed again
    try:
        assert await read_keys(again, 1) == [f"{other_session}/reply/0"]
    finally:
        await again.stop()


async def test_a_stream_whose_client_stopped_reading_is_ended_and_the_others_go_on(
    feed: EventFeed, producer: AIOKafkaProducer, kafka_settings: KafkaSettings, small_backlog: int
) -> None:
    stalled_session = session_on(PARTITIONS[0])
    reading_session = session_on(PARTITIONS[0], avoid=stalled_session)
    stalled = await feed.open(session_id=stalled_session, start_at=StartAt.NOW)
    reading = await feed.open(session_id=reading_session, start_at=StartAt.NOW)
    try:
        await publish(
            producer, kafka_settings, [reply(stalled_session, index) for index in range(small_backlog + 1)]
        )
        await publish(producer, kafka_settings, [reply(reading_session, 0)])
        # Its events came after the stalled stream's on the same partition: the feed offered those first.
        assert await read_keys(reading, 1) == [f"{reading_session}/reply/0"]
        with pytest.raises(EventStreamError, match="has not read"):
            await stalled.read(0)
    finally:
        await stalled.stop()
        await reading.stop()
