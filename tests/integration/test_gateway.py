"""The gateway against the real storage owner on the embedded broker and database.

REST calls go through `httpx.ASGITransport`; event streams need a real connection (the ASGI
transport buffers a whole response), so the same app also serves on a loopback port through
uvicorn. Where a planner is needed, tests/integration/test_gateway_support.py has a stand-in
that speaks the planner's side of the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition
from fastapi import FastAPI

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.memory import MemoryScope
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.topics import TOPICS, Topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.gateway.app import EmbeddedServer, create_app, open_streams
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.run_events import RunEventReader, StartAt, StreamedEvent, partition_for_key
from quipu.services.planner.adapters import SessionOwners
from tests.conformance.builders import running_root
from tests.integration.test_gateway_support import (
    QUESTION,
    ServedStack,
    SSEMessage,
    SSEStream,
    StandInPlanner,
    eventually,
    sse,
    unique_name,
)
from tests.owner_support import TopicReader
from tests.support.gateway_keys import TestKeys
from tests.timing import scaled

PARTITIONS = list(range(next(spec.partitions for spec in TOPICS if spec.topic is Topic.RUNS_EVENTS)))


@dataclass
class Gateway:
    """The app, served on a port, with an in-process client and a network client."""

    served: ServedStack
    app: FastAPI
    server: EmbeddedServer
    asgi: httpx.AsyncClient
    http: httpx.AsyncClient
    keys: TestKeys


@pytest.fixture(scope="module")
async def served(stack: EmbeddedStack) -> AsyncIterator[ServedStack]:
    async with ServedStack(stack, unique_name()) as served:
        yield served


@pytest.fixture(scope="module")
async def gateway(served: ServedStack) -> AsyncIterator[Gateway]:
    keys = TestKeys()
    app = create_app(served.kafka, settings=keys.settings(keepalive_s=0.3))
    server = EmbeddedServer(app)
    await server.start()
    operator = keys.admin()  # sessions the tests make in the store directly have no owner
    asgi = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=operator
    )
    http = httpx.AsyncClient(base_url=server.url, timeout=scaled(20.0), headers=operator)
    try:
        yield Gateway(served, app, server, asgi, http, keys)
    finally:
        await asgi.aclose()
        await http.aclose()
        await server.stop()


@pytest.fixture(scope="module")
async def planner(served: ServedStack) -> AsyncIterator[StandInPlanner]:
    async with StandInPlanner(served) as planner:
        yield planner
        assert planner.errors == []


async def new_session(gateway: Gateway) -> str:
    response = await gateway.asgi.post("/v1/sessions", json={"session_id": f"s-{uuid.uuid4().hex[:10]}"})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"code", "message"}, body
    return response.status_code, body["code"]


async def publish_events(gateway: Gateway, events: list[RunEvent]) -> None:
    """Publish run events as the owner and the planner do: keyed by session id."""
    producer = AIOKafkaProducer(bootstrap_servers=gateway.served.stack.bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for event in events:
            await producer.send_and_wait(
                gateway.served.topic(Topic.RUNS_EVENTS),
                event.model_dump_json().encode(),
                key=(event.session_id or event.run_id).encode(),
            )
    finally:
        await producer.stop()


def reply(session_id: str, run_id: str, index: int) -> RunEvent:
    return RunEvent(
        type=StreamEventType.ASSISTANT_REPLY,
        event_key=f"{run_id}/reply/{index}",
        run_id=run_id,
        session_id=session_id,
        timestamp=utc_now_ms(),
        payload={"delta": f"word{index} "},
    )


def neighbour_of(session_id: str) -> str:
    """Another session whose events land on the same partition (so filtering is really tested)."""
    wanted = partition_for_key(session_id, PARTITIONS)
    for index in range(1000):
        candidate = f"{session_id}-neighbour-{index}"
        if partition_for_key(candidate, PARTITIONS) == wanted:
            return candidate
    raise AssertionError("no neighbour found")


async def wait_until_no_open_streams(gateway: Gateway, within: float = 10.0) -> None:
    async def none_open() -> bool:
        open_streams: int = (await gateway.asgi.get("/healthz")).json()["open_streams"]
        return open_streams == 0

    await eventually(none_open, within)


def _parked(reader: RunEventReader) -> bool:
    """Whether the reader's partition is paused (its pace parked it under the look-out)."""
    consumer = reader._consumer
    assert consumer is not None
    paused: set[TopicPartition] = consumer.paused()
    assigned: set[TopicPartition] = consumer.assignment()
    return paused == assigned


def keys(messages: list[SSEMessage]) -> list[str]:
    return [message.run_event().event_key for message in messages]


# --- sessions ---------------------------------------------------------------------------------------


async def test_session_lifecycle_through_the_owner(gateway: Gateway) -> None:
    client = gateway.asgi
    session_id = await new_session(gateway)
    assert (await client.get(f"/v1/sessions/{session_id}")).json()["status"] == "active"
    assert error_of(await client.delete(f"/v1/sessions/{session_id}")) == (409, "SESSION_ACTIVE")
    ended = await client.post(f"/v1/sessions/{session_id}/end")
    assert ended.status_code == 200 and ended.json()["status"] == "ended"
    assert (await client.delete(f"/v1/sessions/{session_id}")).status_code == 204
    assert error_of(await client.get(f"/v1/sessions/{session_id}")) == (410, "SESSION_PURGED")
    assert error_of(await client.get("/v1/sessions/never-made")) == (404, "SESSION_NOT_FOUND")
    assert error_of(await client.post("/v1/sessions/never-made/end")) == (404, "SESSION_NOT_FOUND")
    assert error_of(await client.post("/v1/sessions", json={"session_id": ""})) == (400, "INVALID_ARGUMENT")


# --- publishing -------------------------------------------------------------------------------------


async def test_a_session_created_here_is_its_creators_before_its_first_turn(gateway: Gateway) -> None:
    """The planner claims the history for the owner the gateway recorded, whoever's turn comes
    first: a raw turn of bob's into alice's new session is refused, alice's turns are served."""
    alice = gateway.keys.issue("alice", "t1")
    created = await gateway.asgi.post("/v1/sessions", json={}, headers=alice)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    store = gateway.served.store

    def planner_owners() -> SessionOwners:  # each a planner process of its own: nothing remembered
        return SessionOwners.over(store, KafkaMemoryStore(store))

    def scope(principal_id: str) -> MemoryScope:
        return MemoryScope(tenant_id="t1", principal_id=principal_id, agent_id="assistant")

    for _ in range(2):  # a redelivered request is refused the same way
        with pytest.raises(StoreError) as refused:
            await planner_owners().require(session_id, scope("bob"))  # `RunRequested` straight to Kafka
        assert refused.value.code is ErrorCode.SESSION_PRINCIPAL_MISMATCH
    await planner_owners().require(session_id, scope("alice"))
    turn = await gateway.asgi.post(
        "/v1/runs", json={"agent_id": "assistant", "text": QUESTION, "session_id": session_id}, headers=alice
    )
    assert turn.status_code == 202, turn.text
    await planner_owners().require(session_id, scope("alice"))


async def test_a_turn_is_published_on_runs_requested_keyed_by_its_session(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    async with TopicReader(
        gateway.served.stack.bootstrap, gateway.served.topic(Topic.RUNS_REQUESTED)
    ) as reader:
        response = await gateway.asgi.post(
            "/v1/runs", json={"agent_id": "assistant", "text": "hello", "session_id": session_id}
        )
        assert response.status_code == 202
        run_id = response.json()["run_id"]

        def published(records: list[ConsumerRecord[bytes, bytes]]) -> bool:
            return any(json.loads(record.value)["run_id"] == run_id for record in records)

        records = await reader.wait_for(published)
    [record] = [r for r in records if json.loads(r.value)["run_id"] == run_id]
    request = RunRequested.model_validate_json(record.value)
    assert request.kind is RunKind.TURN and request.session_id == session_id and request.text == "hello"
    assert request.event_id == response.json()["event_id"]
    assert record.key == session_id.encode()
    assert record.partition == partition_for_key(session_id, PARTITIONS)


async def test_a_cancel_is_published_on_runs_control_for_the_runs_session(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    run = await running_root(gateway.served.store, session_id)
    async with TopicReader(
        gateway.served.stack.bootstrap, gateway.served.topic(Topic.RUNS_CONTROL)
    ) as reader:
        response = await gateway.asgi.post(f"/v1/runs/{run.run_id}/cancel")
        assert response.status_code == 202
        records = await reader.wait_for(bool)
    cancel = CancelRun.model_validate_json(records[-1].value)
    assert (cancel.run_id, cancel.session_id) == (run.run_id, session_id)
    assert records[-1].key == session_id.encode()
    assert error_of(await gateway.asgi.post("/v1/runs/never-made/cancel")) == (404, "RUN_NOT_FOUND")


# --- the event stream -------------------------------------------------------------------------------


async def test_reconnecting_with_last_event_id_resumes_exactly_after_it(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    other = neighbour_of(session_id)
    mine = [reply(session_id, "run-1", index) for index in range(6)]
    noise = [reply(other, "run-x", index) for index in range(6)]
    await publish_events(gateway, [event for pair in zip(mine, noise, strict=True) for event in pair])

    path = f"/v1/sessions/{session_id}/events"
    async with sse(gateway.http, path) as stream:
        first = await stream.take(3)
        assert stream.retry == "2000"
    assert keys(first) == [event.event_key for event in mine[:3]]
    assert [message.event for message in first] == ["assistant_reply"] * 3
    partition = partition_for_key(session_id, PARTITIONS)
    assert all(message.id.startswith(f"{partition}-") for message in first)
    await wait_until_no_open_streams(gateway)  # the disconnect stopped the reader

    async with sse(gateway.http, path, **{"Last-Event-ID": first[-1].id}) as stream:
        rest = await stream.take(3)
        assert keys(rest) == [event.event_key for event in mine[3:]]
        live = [reply(session_id, "run-1", index) for index in range(6, 8)]
        await publish_events(gateway, [live[0], reply(other, "run-x", 99), live[1]])
        assert keys(await stream.take(2)) == [event.event_key for event in live]
        await stream.nothing_more()
        assert (await asyncio.wait_for(stream.comments.get(), scaled(5))).comment  # keep-alive while idle
    ids = [message.id for message in first + rest]
    assert len(set(ids)) == 6 and ids == sorted(ids, key=lambda id_: int(id_.split("-")[1]))
    await wait_until_no_open_streams(gateway)


async def test_from_now_shows_only_new_events(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    await publish_events(gateway, [reply(session_id, "run-old", index) for index in range(3)])
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events?from=now") as stream:
        fresh = [reply(session_id, "run-new", index) for index in range(2)]
        await publish_events(gateway, fresh)
        assert keys(await stream.take(2)) == [event.event_key for event in fresh]
        await stream.nothing_more(0.5)


async def test_duplicate_events_are_shown_once(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    events = [reply(session_id, "run-1", 0), reply(session_id, "run-1", 1)]
    await publish_events(gateway, [events[0], events[0], events[1], events[0]])
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events") as stream:
        assert keys(await stream.take(2)) == [event.event_key for event in events]
        await stream.nothing_more(0.5)


async def test_stream_refusals(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    client = gateway.http
    path = f"/v1/sessions/{session_id}/events"
    assert error_of(await client.get(path, headers={"Last-Event-ID": "garbage"})) == (400, "INVALID_ARGUMENT")
    elsewhere = (partition_for_key(session_id, PARTITIONS) + 1) % len(PARTITIONS)
    assert error_of(await client.get(path, headers={"Last-Event-ID": f"{elsewhere}-0"})) == (
        400,
        "INVALID_ARGUMENT",
    )
    assert error_of(await client.get(path, params={"from": "yesterday"})) == (400, "INVALID_ARGUMENT")
    assert error_of(await client.get("/v1/sessions/never-made/events")) == (404, "SESSION_NOT_FOUND")
    assert (await gateway.asgi.get("/healthz")).json()["open_streams"] == 0


async def test_a_refused_position_is_neither_echoed_nor_told_where_the_stream_is(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    path = f"/v1/sessions/{session_id}/events"
    home = partition_for_key(session_id, PARTITIONS)
    huge = "7" * 8000
    for position in (huge, f"{huge}-1", f"{(home + 1) % len(PARTITIONS)}-0"):
        response = await gateway.http.get(path, headers={"Last-Event-ID": position})
        assert error_of(response) == (400, "INVALID_ARGUMENT")
        message = response.json()["message"]
        assert len(message) < 200 and "7777" not in message, message
        assert f"partition {home}" not in message and str(home) not in message, message


async def test_a_position_beyond_the_end_is_refused_instead_of_waiting_forever(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    await publish_events(gateway, [reply(session_id, "run-1", 0)])
    path = f"/v1/sessions/{session_id}/events"
    async with sse(gateway.http, path) as stream:
        [first] = await stream.take(1)
    partition, offset = first.id.split("-")
    # The last event's own position resumes (and waits for what comes next): it is the stream's end.
    async with sse(gateway.http, path, **{"Last-Event-ID": first.id}) as stream:
        await stream.nothing_more(0.3)
    for ahead in (int(offset) + 1, int(offset) + 10_000):
        # Keep-alive comments would keep a stream that was let in open for ever: bound the wait.
        request = gateway.http.get(path, headers={"Last-Event-ID": f"{partition}-{ahead}"})
        response = await asyncio.wait_for(request, scaled(15))
        assert error_of(response) == (400, "INVALID_ARGUMENT"), ahead
        assert "beyond the end" in response.json()["message"]
    assert (await gateway.asgi.get("/healthz")).json()["open_streams"] == 0


async def test_the_stream_and_the_shared_reader_show_the_same_events(gateway: Gateway) -> None:
    session_id = await new_session(gateway)
    other = neighbour_of(session_id)
    events = [reply(session_id, "run-1", index) for index in range(4)]
    await publish_events(
        gateway, [events[0], reply(other, "x", 0), events[1], events[1], events[2], events[3]]
    )
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events") as stream:
        streamed = await stream.take(4)
    reader = RunEventReader(gateway.served.kafka, session_id=session_id)
    await reader.start()
    try:
        read: list[StreamedEvent] = []
        async with asyncio.timeout(scaled(10)):
            while len(read) < 4:
                read += await reader.read(0.2)
    finally:
        await reader.stop()
    assert [(m.id, m.event, m.data) for m in streamed] == [
        (str(s.position), s.event.type.value, s.event.model_dump_json()) for s in read
    ]


async def test_the_gateways_streams_are_read_by_one_consumer_each_with_its_own_events(
    gateway: Gateway,
) -> None:
    # Each SSE client had a consumer of its own: a fetch loop each, and every record of a
    # partition opened once per stream on it.
    sessions = [await new_session(gateway) for _ in range(2)]
    sessions.append(neighbour_of(sessions[0]))
    await gateway.served.store.create_session(sessions[2], utc_now_ms())
    streams = open_streams(gateway.app)
    assert streams is not None
    async with contextlib.AsyncExitStack() as clients:
        opened = [
            await clients.enter_async_context(sse(gateway.http, f"/v1/sessions/{session_id}/events?from=now"))
            for session_id in sessions
        ]
        consumer = streams.feed.consumer
        assert consumer is not None and streams.open_count == 3
        assert streams.feed.partitions == sorted({partition_for_key(each, PARTITIONS) for each in sessions})
        events = {
            session_id: [reply(session_id, "run-1", index) for index in range(2)] for session_id in sessions
        }
        await publish_events(
            gateway, [event for pair in zip(*events.values(), strict=True) for event in pair]
        )
        for session_id, stream in zip(sessions, opened, strict=True):
            assert keys(await stream.take(2)) == [event.event_key for event in events[session_id]]
            await stream.nothing_more(0.3)
        assert streams.feed.consumer is consumer

    async def feed_stopped() -> bool:
        return streams.feed.consumer is None

    await eventually(feed_stopped, within=10)  # with the last stream


async def test_idle_streams_park_and_a_run_requested_for_one_wakes_it_at_once(gateway: Gateway) -> None:
    # Open, a stream fetched 100 times a second on Tansu whether anything came or not: each idle UI
    # cost the broker ~9 % of a core. Quiet, streams park under the look-out, which wakes them.
    # The two sessions share a partition: the event for one is fetched by both readers, and each
    # parks again once its caller has read it (a reader holding records unread must not park).
    settings = gateway.served.kafka.model_copy(update={"idle_after_s": 0.3})
    first = await new_session(gateway)
    second = next(
        candidate
        for candidate in (f"{first}-{index}" for index in range(1000))
        if partition_for_key(candidate, PARTITIONS) == partition_for_key(first, PARTITIONS)
    )
    await gateway.served.store.create_session(second, utc_now_ms())
    sessions = [first, second]
    readers = [RunEventReader(settings, session_id=session_id) for session_id in sessions]
    await asyncio.gather(*(reader.start(start_at=StartAt.NOW) for reader in readers))

    read: list[StreamedEvent] = []

    async def both_read_and_parked() -> bool:
        for reader in readers:  # as their callers do
            read.extend(await reader.read(0))
        return all(_parked(reader) for reader in readers)

    try:
        await eventually(both_read_and_parked, within=10)
        await publish_events(gateway, [reply(first, "run-1", 0)])
        async with asyncio.timeout(scaled(10)):
            while not read:
                read += await readers[0].read(0.2)
        await eventually(both_read_and_parked, within=10)
        assert [streamed.event.session_id for streamed in read] == [first]
        readers[1].expect_events()
        assert not _parked(readers[1])
    finally:
        await asyncio.gather(*(reader.stop() for reader in readers))


async def test_an_event_for_one_stream_leaves_the_streams_of_other_partitions_parked(
    gateway: Gateway,
) -> None:
    # A gateway's streams are many: an event for one woke every stream of the process (and every
    # other consumer in it) to fetch every 10 ms for idle_after_s.
    settings = gateway.served.kafka.model_copy(update={"idle_after_s": 1.0})
    first = f"s-{uuid.uuid4().hex[:10]}"
    second = next(
        candidate
        for candidate in (f"{first}-{index}" for index in range(1000))
        if partition_for_key(candidate, PARTITIONS) != partition_for_key(first, PARTITIONS)
    )
    readers = [RunEventReader(settings, session_id=session_id) for session_id in (first, second)]
    await asyncio.gather(*(reader.start(start_at=StartAt.NOW) for reader in readers))

    async def both_parked() -> bool:
        return all(_parked(reader) for reader in readers)

    try:
        await eventually(both_parked, within=10)
        await publish_events(gateway, [reply(first, "run-1", 0)])
        read: list[StreamedEvent] = []
        async with asyncio.timeout(scaled(10)):
            while not read:
                read += await readers[0].read(0.2)
        assert _parked(readers[1])
    finally:
        await asyncio.gather(*(reader.stop() for reader in readers))


# --- whole turns through the planner stand-in -------------------------------------------------------


async def until_closed(stream: SSEStream, run_id: str, within: float = 20.0) -> list[RunEvent]:
    """A run's events up to its run_stream_end."""
    seen: list[RunEvent] = []
    async with asyncio.timeout(scaled(within)):
        while True:
            event = (await stream.next(within)).run_event()
            if event.run_id != run_id:
                continue
            seen.append(event)
            if event.type is StreamEventType.RUN_STREAM_END:
                return seen


async def test_a_turn_streams_its_reply_and_leaves_a_transcript(
    gateway: Gateway, planner: StandInPlanner
) -> None:
    session_id = await new_session(gateway)
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events") as stream:
        response = await gateway.asgi.post(
            "/v1/runs", json={"agent_id": "assistant", "text": "hello", "session_id": session_id}
        )
        run_id = response.json()["run_id"]
        events = await until_closed(stream, run_id)
    types = [event.type.value for event in events]
    assert types[-3:] == ["assistant_turn", "workflow", "run_stream_end"]
    assert {"phase": "planning"} in [
        event.payload for event in events if event.type is StreamEventType.WORKFLOW
    ]
    text = "".join(
        event.payload["delta"] for event in events if event.type is StreamEventType.ASSISTANT_REPLY
    )
    assert text == "Hello there, friend."
    assert events[-2].payload == {"phase": "completed", "status": "success"}

    meta = (await gateway.asgi.get(f"/v1/runs/{run_id}")).json()
    assert meta["status"] == "completed" and meta["session_id"] == session_id
    transcript = (await gateway.asgi.get(f"/v1/runs/{run_id}/transcript")).json()
    assert [(m["role"], m["parts"][0]["text"]) for m in transcript["messages"]] == [
        ("user", "hello"),
        ("assistant", "Hello there, friend."),
    ]
    page = (await gateway.asgi.get(f"/v1/runs/{run_id}/records", params={"limit": 2})).json()
    assert len(page["records"]) == 2 and page["next_cursor"]
    runs = (await gateway.asgi.get(f"/v1/sessions/{session_id}/runs")).json()
    assert [run["run_id"] for run in runs] == [run_id]


async def test_a_suspended_run_is_answered_once(gateway: Gateway, planner: StandInPlanner) -> None:
    session_id = await new_session(gateway)
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events") as stream:
        asked = await gateway.asgi.post(
            "/v1/runs", json={"agent_id": "assistant", "text": "ask me", "session_id": session_id}
        )
        run_id = asked.json()["run_id"]
        events = await until_closed(stream, run_id)
        assert [event.type.value for event in events][-3:] == [
            "await_clarification",
            "workflow",
            "run_stream_end",
        ]
        assert events[-3].payload == {"question": QUESTION}
        assert (await gateway.asgi.get(f"/v1/runs/{run_id}")).json()["status"] == "suspended"

        answered = await gateway.asgi.post(f"/v1/runs/{run_id}/answer", json={"answer": "Lima"})
        assert answered.status_code == 202
        successor = answered.json()["run_id"]
        continuation = await until_closed(stream, successor)
    assert continuation[-2].payload["phase"] == "completed"
    [resume] = [request for request in planner.requests if request.run_id == successor]
    assert resume.kind is RunKind.RESUME and resume.predecessor_run_id == run_id and resume.answer == "Lima"
    meta = (await gateway.asgi.get(f"/v1/runs/{run_id}")).json()
    assert meta["successor_run_id"] == successor
    again = await gateway.asgi.post(f"/v1/runs/{run_id}/answer", json={"answer": "Quito"})
    assert error_of(again) == (409, "RUN_CONFLICT")


async def test_a_canceled_run_ends_canceled_on_the_stream(gateway: Gateway, planner: StandInPlanner) -> None:
    session_id = await new_session(gateway)
    async with sse(gateway.http, f"/v1/sessions/{session_id}/events?from=now") as stream:
        response = await gateway.asgi.post(
            "/v1/runs", json={"agent_id": "assistant", "text": "wait for me", "session_id": session_id}
        )
        run_id = response.json()["run_id"]

        async def started() -> bool:
            return (await gateway.asgi.get(f"/v1/runs/{run_id}")).status_code == 200

        await eventually(started)
        assert (await gateway.asgi.post(f"/v1/runs/{run_id}/cancel")).status_code == 202
        events = await until_closed(stream, run_id)
    assert events[-2].payload == {
        "phase": "canceled",
        "status": "canceled",
        "cancellation": {"reason": "user_requested"},
    }
    assert error_of(await gateway.asgi.post(f"/v1/runs/{run_id}/cancel")) == (409, "RUN_NOT_ACTIVE")
