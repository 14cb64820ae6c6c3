"""A producer that knows only docs/asyncapi.json runs an agent, as a client in another language would.

The storage owner, the planner and the tool executor run in this process on one topic prefix (as
in `test_planner_kafka.py`), on the real embedded broker and database, with the offline
`ScriptedModel`. The request is built from the document alone: the topic from the channel that
carries the run request, the fields from its payload schema's `required` list, the key from its
Kafka binding's `x-key-from` rule, all as plain JSON (no Quipu contract is imported). A raw aiokafka
producer sends it; a raw consumer follows `runs.events`, keeping the records whose key the
documented rule gives for that run, checks each against the event schema, and waits for the run's
end. A second client first creates its session with a raw storage command (the reply-partition
header the document names, the reply found by correlation id on that partition of
`storage.replies`), then runs a turn in it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import create_app as create_executor
from tests.support.deployment import deployed, unique_prefix
from tests.support.json_schema import key_by_rule, problems, resolve
from tests.timing import scaled

pytestmark = pytest.mark.slow

DOCUMENT: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "asyncapi.json").read_text(encoding="utf-8")
)


def message_of(address: str) -> dict[str, Any]:
    """The one message the channel at `address` carries."""
    [channel] = [channel for channel in DOCUMENT["channels"].values() if channel["address"] == address]
    [reference] = channel["messages"].values()
    message: dict[str, Any] = resolve(DOCUMENT, reference["$ref"])
    return message


@pytest.fixture(scope="module")
async def prefix(stack: EmbeddedStack) -> AsyncIterator[str]:
    """The three services on a topic prefix of their own."""
    settings = stack.kafka_settings(topic_prefix=unique_prefix("aa"))
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    executor = create_executor(settings)
    # The executor is announced before the planner starts, as `quipu up` orders them.
    async with deployed(stack, settings, [executor], [planner], agents=True):
        yield settings.topic_prefix


async def follow(
    stack: EmbeddedStack,
    topic: str,
    key: bytes | None,
    schema: dict[str, Any],
    ended: Any,
    only: int | None = None,
) -> list[dict[str, Any]]:
    """Every message on `topic` keyed `key` (any key: None), from the beginning (of partition
    `only`, else of all), until `ended(messages)` holds; each checked against `schema`."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=stack.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        while not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic)
        numbers = sorted(partitions) if only is None else [only]
        assigned = [TopicPartition(topic, number) for number in numbers]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        events: list[dict[str, Any]] = []
        while not ended(events):
            batches = await consumer.getmany(timeout_ms=200)
            for record in (record for batch in batches.values() for record in batch):
                if key is None or record.key == key:
                    event = json.loads(record.value or b"")
                    assert problems(DOCUMENT, schema, event) == [], event
                    events.append(event)
        return events
    finally:
        await consumer.stop()


def fill(message: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`values` as the message's payload, after checking the schema asks for nothing else."""
    payload_schema = message["payload"]
    while "$ref" in payload_schema:
        payload_schema = resolve(DOCUMENT, payload_schema["$ref"])
    assert set(payload_schema["required"]) <= set(values), "a new required field: the document says what"
    assert set(values) <= set(payload_schema["properties"])
    assert problems(DOCUMENT, message["payload"], values) == []
    return values


async def send(
    stack: EmbeddedStack,
    topic: str,
    message: dict[str, Any],
    payload: Any,
    *,
    key: bytes | None = None,
    headers: dict[str, bytes] | None = None,
) -> None:
    """One record, keyed by `key` or else as the message's Kafka binding's rule says."""
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        key = key if key is not None else key_by_rule(message, payload)
        await producer.send_and_wait(
            topic, json.dumps(payload).encode(), key=key, headers=list((headers or {}).items())
        )
    finally:
        await producer.stop()


async def run_to_its_end(stack: EmbeddedStack, prefix: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Publish `request` on the run-request channel and follow its run's events to the end."""
    await send(stack, prefix + "runs.requested", message_of("runs.requested"), request)
    events_message = message_of("runs.events")
    event_schema = events_message["payload"]
    kinds = resolve(DOCUMENT, resolve(DOCUMENT, event_schema["$ref"])["properties"]["type"]["$ref"])["enum"]
    assert "run_stream_end" in kinds

    def ended(events: list[dict[str, Any]]) -> bool:
        return any(
            event["run_id"] == request["run_id"] and event["type"] == "run_stream_end" for event in events
        )

    # The run's events are keyed as the document says (a sessionless run's by its run id).
    key = key_by_rule(events_message, request)
    try:
        events = await asyncio.wait_for(
            follow(stack, prefix + "runs.events", key, event_schema, ended), scaled(60.0)
        )
    except TimeoutError:
        raise AssertionError(f"no run_stream_end keyed {key!r} within {scaled(60.0):.0f} s") from None
    ours = [event for event in events if event["run_id"] == request["run_id"]]
    phases = [event["payload"]["phase"] for event in ours if event["type"] == "workflow"]
    assert phases[-1] == "completed", phases
    return ours


def replies(ours: list[dict[str, Any]]) -> str:
    return "".join(event["payload"]["text"] for event in ours if event["type"] == "assistant_reply")


async def test_a_raw_producer_following_the_document_runs_an_agent(stack: EmbeddedStack, prefix: str) -> None:
    assert DOCUMENT["asyncapi"] == "3.0.0"
    assert DOCUMENT["x-topic-prefix"]["setting"] == "QUIPU_KAFKA_TOPIC_PREFIX"
    values = {"run_id": "r-" + uuid.uuid4().hex, "agent_id": "assistant", "text": "calculate 6*7"}
    request = fill(message_of("runs.requested"), values)
    assert "42" in replies(await run_to_its_end(stack, prefix, request))


async def test_a_raw_client_creates_a_session_with_a_storage_command_and_runs_a_turn_in_it(
    stack: EmbeddedStack, prefix: str
) -> None:
    """The storage framing from the document: a command, its reply-partition header, its reply
    found by correlation id on that partition; then a turn in the new session."""
    command_message = message_of("storage.commands")
    union = resolve(DOCUMENT, command_message["payload"]["$ref"])
    create = {"$ref": union["discriminator"]["mapping"]["CreateSession"]}
    session_id, correlation_id = "s-" + uuid.uuid4().hex[:10], "c-" + uuid.uuid4().hex
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    command = fill(
        {**command_message, "payload": create},
        {
            "op": "CreateSession",
            "session_id": session_id,
            "created_at": now,
            "correlation_id": correlation_id,
        },
    )
    route = {header: b"0" for header in command_message["headers"]["properties"] if "partition" in header}
    assert route, "the document names the reply-partition header"
    # A command's key is in words only (it depends on `op`): "session id, else ...".
    assert command_message["bindings"]["kafka"]["key"]["description"].startswith(
        "UTF-8 bytes of the session id"
    )
    sending = send(
        stack, prefix + "storage.commands", command_message, command, key=session_id.encode(), headers=route
    )
    reply_schema = message_of("storage.replies")["payload"]

    def answered(seen: list[dict[str, Any]]) -> bool:
        return any(reply.get("correlation_id") == correlation_id for reply in seen)

    reading = asyncio.create_task(
        follow(stack, prefix + "storage.replies", None, reply_schema, answered, only=0)
    )
    await sending
    seen = await asyncio.wait_for(reading, scaled(30.0))
    [reply] = [reply for reply in seen if reply["correlation_id"] == correlation_id]
    assert reply.get("error") is None, reply

    values = {"run_id": "r-" + uuid.uuid4().hex, "session_id": session_id, "agent_id": "assistant"}
    request = fill(message_of("runs.requested"), {**values, "text": "calculate 6*7"})
    assert "42" in replies(await run_to_its_end(stack, prefix, request))
