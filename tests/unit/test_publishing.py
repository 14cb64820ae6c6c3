"""TopicPublisher: a payload goes to the deployment's copy of its registry topic, with its registry
key, and with only the routes its caller gives."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import RecordMetadata
from pydantic import BaseModel

from quipu.contracts.commands import REPLY_PARTITION_HEADER, CreateSession, StoreReply
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.tools import ToolCallRequested
from quipu.contracts.topics import UnroutablePayloadError
from quipu.contracts.wire import utc_now_ms
from quipu.services.kit import fetch_pace
from quipu.services.kit.handover import HandedRecord
from quipu.services.kit.publishing import (
    Outgoing,
    PublishError,
    Queued,
    Send,
    TopicPublisher,
    all_taken,
    producer_publisher,
)
from quipu.services.kit.settings import KafkaSettings

SETTINGS = KafkaSettings(bootstrap="127.0.0.1:9", topic_prefix="t1-")
T = TypeVar("T")


@dataclass
class Sent:
    """What reached the producer, one tuple per record."""

    records: list[tuple[str, bytes, bytes | None, int | None, dict[str, str]]] = field(default_factory=list)

    async def __call__(
        self, topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Queued:
        self.records.append((topic, body, key, partition, dict(headers)))
        return Queued(acknowledged(None), ())


def acknowledged(metadata: T) -> asyncio.Future[T]:
    """The broker's acknowledgement, come already."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(metadata)
    return future


async def _published(
    message: BaseModel, **routes: Any
) -> tuple[str, bytes, bytes | None, int | None, dict[str, str]]:
    sent = Sent()
    await TopicPublisher(SETTINGS, sent).publish(message, **routes)
    [record] = sent.records
    return record


async def test_a_payload_goes_to_its_prefixed_topic_with_its_registry_key() -> None:
    request = RunRequested(run_id="r-1", session_id="s-1", agent_id="a", text="hi")
    assert await _published(request) == (
        "t1-runs.requested",
        request.model_dump_json().encode(),
        b"s-1",
        None,
        {},
    )
    sessionless = CancelRun(run_id="r-2")
    assert (await _published(sessionless))[::2] == ("t1-runs.control", b"r-2", {})
    call = ToolCallRequested(run_id="r-3", session_id="s-3", agent_id="a", tool_use_id="u", tool_name="clock")
    assert (await _published(call))[0::2] == ("t1-tools.calls", b"r-3", {})


async def test_routes_come_only_from_the_caller() -> None:
    reply = StoreReply(correlation_id="c-1")
    assert (await _published(reply, partition=3))[2:] == (None, 3, {})
    command = CreateSession(session_id="s-9", created_at=utc_now_ms())
    routed = await _published(command, headers={REPLY_PARTITION_HEADER: "5"})
    assert routed[0] == "t1-storage.commands" and routed[2:] == (b"s-9", None, {REPLY_PARTITION_HEADER: "5"})


async def test_a_call_goes_within_its_topics_family_with_its_registry_key_and_nowhere_else() -> None:
    call = ToolCallRequested(run_id="r-4", agent_id="a", tool_use_id="u", tool_name="render")
    assert (await _published(call, within="tools.calls.gpu"))[0::2] == ("t1-tools.calls.gpu", b"r-4", {})
    assert (await _published(call, within="tools.calls"))[0] == "t1-tools.calls"
    sent = Sent()
    for elsewhere in ("runs.requested", "tools.callsx", "tools.calls.dlq", "tools.calls.gpu.dlq"):
        with pytest.raises(UnroutablePayloadError):
            await TopicPublisher(SETTINGS, sent).publish(call, within=elsewhere)
    assert sent.records == []


async def test_a_payload_no_topic_carries_is_never_sent() -> None:
    class Stray(BaseModel):
        run_id: str = "r"

    sent = Sent()
    with pytest.raises(UnroutablePayloadError):
        await TopicPublisher(SETTINGS, sent).publish(Stray())
    assert sent.records == []


@dataclass
class Producer:
    """Stands in for AIOKafkaProducer.send."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    async def send(self, topic: str, value: bytes, **options: Any) -> asyncio.Future[None]:
        self.calls.append({"topic": topic, **options})
        return acknowledged(None)


async def test_on_a_producer_headers_travel_as_bytes_and_none_when_there_are_none() -> None:
    producer = Producer()
    publisher = producer_publisher(cast(AIOKafkaProducer, producer), SETTINGS)
    await publisher.publish(CancelRun(run_id="r-1", session_id="s-1"))
    await publisher.publish(StoreReply(correlation_id="c"), headers={REPLY_PARTITION_HEADER: "2"})
    assert producer.calls == [
        {"topic": "t1-runs.control", "key": b"s-1", "partition": None, "headers": None},
        {
            "topic": "t1-storage.replies",
            "key": None,
            "partition": None,
            "headers": [(REPLY_PARTITION_HEADER, b"2")],
        },
    ]


async def test_every_record_sent_is_told_to_the_fetch_pace_with_where_the_broker_put_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The consumer of this process holding that partition is handed it or fetches it at once, and
    # no other wakes for it (kit.fetch_pace): the partition and offset are the broker's, not a
    # guess from the key, and the record is the one sent at the time the broker acknowledged.
    told: list[tuple[str, int, int, HandedRecord | None]] = []
    monkeypatch.setattr(
        fetch_pace,
        "published",
        lambda topic, partition, offset, record: told.append((topic, partition, offset, record)),
    )

    def sending(timestamp: int) -> Send:
        async def send(
            topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
        ) -> Queued:
            where = RecordMetadata(topic, 5, TopicPartition(topic, 5), 41, timestamp, 0, -1)
            return Queued(acknowledged(where), (("h", b"v"),))

        return send

    cancel = CancelRun(run_id="r-1", session_id="s-1")
    body = cancel.model_dump_json().encode()
    await TopicPublisher(SETTINGS, sending(1_700_000_000_000)).publish(cancel)
    await TopicPublisher(SETTINGS, sending(-1)).publish(cancel)  # no create time told: not handed
    await TopicPublisher(SETTINGS.model_copy(update={"acks": 1}), sending(5)).publish(cancel)
    assert told == [
        ("t1-runs.control", 5, 41, HandedRecord(b"s-1", body, (("h", b"v"),), 1_700_000_000_000)),
        ("t1-runs.control", 5, 41, None),
        ("t1-runs.control", 5, 41, None),  # the leader alone has it: it is not handed over
    ]


@dataclass
class Pending:
    """A producer whose acknowledgements come only when the test says: what was queued, in order."""

    queued: list[tuple[str, asyncio.Future[RecordMetadata]]] = field(default_factory=list)

    async def __call__(
        self, topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Queued:
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.queued.append((topic, future))
        return Queued(future, ())


async def _queued(pending: Pending, count: int) -> None:
    for _ in range(100):
        if len(pending.queued) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(pending.queued)} of {count} queued")


async def test_messages_published_together_are_queued_in_order_before_any_acknowledgement() -> None:
    # A command's reply and what its commit justifies: one round trip for all, not one each.
    pending = Pending()
    messages = [
        Outgoing(ToolCallRequested(run_id="r", agent_id="a", tool_use_id="u", tool_name="t")),
        Outgoing(StoreReply(correlation_id="c"), partition=2),
        Outgoing(CancelRun(run_id="r")),
    ]
    publishing = asyncio.create_task(TopicPublisher(SETTINGS, pending).publish_together(messages))
    await _queued(pending, 3)
    topics = [topic for topic, _ in pending.queued]
    assert topics == ["t1-tools.calls", "t1-storage.replies", "t1-runs.control"]
    for topic, future in reversed(pending.queued):
        assert not publishing.done()
        future.set_result(RecordMetadata(topic, 0, TopicPartition(topic, 0), 1, -1, -1, -1))
    await publishing


async def test_a_record_for_a_partition_it_names_is_told_as_it_is_queued_before_its_acknowledgement() -> None:
    # A store reply (its caller's partition) is heard by a client of this process at once; a
    # record the producer's partitioner places is not told until the broker says where it went.
    told: list[tuple[int, bytes]] = []
    unlisten = [
        fetch_pace.listen_sent(topic, lambda partition, value: told.append((partition, value)))
        for topic in ("t1-storage.replies", "t1-runs.control")
    ]
    pending = Pending()
    reply = StoreReply(correlation_id="c")
    queued = await TopicPublisher(SETTINGS, pending).queue_together(
        [Outgoing(reply, partition=2), Outgoing(CancelRun(run_id="r"))]
    )
    assert told == [(2, reply.model_dump_json().encode())]
    for topic, future in pending.queued:
        future.set_result(RecordMetadata(topic, 0, TopicPartition(topic, 0), 1, -1, -1, -1))
    await queued
    for stop in unlisten:
        stop()


async def test_a_message_among_others_the_broker_did_not_take_is_a_publish_error() -> None:
    pending = Pending()
    messages = [Outgoing(StoreReply(correlation_id="c")), Outgoing(CancelRun(run_id="r"))]
    publishing = asyncio.create_task(TopicPublisher(SETTINGS, pending).publish_together(messages))
    await _queued(pending, 2)
    (reply_topic, reply), (_, cancel) = pending.queued
    reply.set_result(RecordMetadata(reply_topic, 0, TopicPartition(reply_topic, 0), 1, -1, -1, -1))
    cancel.set_exception(KafkaConnectionError())
    with pytest.raises(PublishError, match=r"t1-runs\.control") as refused:
        await publishing
    assert refused.value.retryable


async def test_a_queued_message_is_sent_at_once_and_its_acknowledgement_awaited_apart() -> None:
    pending = Pending()
    acknowledged = await TopicPublisher(SETTINGS, pending).queue(CancelRun(run_id="r"))
    [(topic, future)] = pending.queued
    waiting = asyncio.ensure_future(acknowledged)
    await asyncio.sleep(0)
    assert topic == "t1-runs.control" and not waiting.done()
    future.set_exception(KafkaConnectionError())
    with pytest.raises(PublishError, match=r"t1-runs\.control"):
        await waiting


async def test_all_taken_waits_for_every_acknowledgement_and_raises_the_first_refusal() -> None:
    pending = Pending()
    publisher = TopicPublisher(SETTINGS, pending)
    queued = [await publisher.queue(CancelRun(run_id=run)) for run in ("r1", "r2", "r3")]
    taking = asyncio.ensure_future(all_taken(queued))
    (topic, first), (_, second), (_, third) = pending.queued
    second.set_exception(KafkaConnectionError())
    first.set_result(RecordMetadata(topic, 0, TopicPartition(topic, 0), 1, -1, -1, -1))
    await asyncio.sleep(0)
    assert not taking.done()  # the third is not settled yet
    third.set_result(RecordMetadata(topic, 0, TopicPartition(topic, 0), 2, -1, -1, -1))
    with pytest.raises(PublishError):
        await taking
