"""A producer that knows only docs/asyncapi.json runs an agent, as a client in another language would.

The storage owner, the planner and the tool executor run in this process on one topic prefix (as
in `test_planner_kafka.py`), on the real embedded broker and database, with the offline
`ScriptedModel`. The request is built from the document alone: the topic from the channel that
carries the run request, the fields from its payload schema's `required` list, the key from its
Kafka binding's `x-key-from` rule, all as plain JSON (no Quipu contract is imported). A raw aiokafka
producer sends it; a raw consumer follows `runs.events`, keeping the records whose key the
documented rule gives for that run, checks each against the event schema, and waits for the run's
end.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.tool_executor.app import create_app as create_executor
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
    prefix = f"aa{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix)
    settings = stack.kafka_settings(topic_prefix=prefix)
    owner = create_owner(settings, stack.mongo_settings(database=prefix.rstrip(".")))
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    executor = create_executor(settings)
    started = time.monotonic()
    await owner.start()
    await asyncio.gather(planner.start(), executor.start())
    print(f"system up in {time.monotonic() - started:.1f} s")
    try:
        yield prefix
    finally:
        await planner.stop()
        await executor.stop()
        await owner.stop()
        await delete_topics(stack.bootstrap, prefix)


async def follow(
    stack: EmbeddedStack, topic: str, key: bytes, schema: dict[str, Any], ended: Any
) -> list[dict[str, Any]]:
    """Every event on `topic` keyed `key`, from the beginning, until `ended(events)` holds."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=stack.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        while not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic)
        assigned = [TopicPartition(topic, number) for number in sorted(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        events: list[dict[str, Any]] = []
        while not ended(events):
            batches = await consumer.getmany(timeout_ms=200)
            for record in (record for batch in batches.values() for record in batch):
                if record.key == key:
                    event = json.loads(record.value or b"")
                    assert problems(DOCUMENT, schema, event) == [], event
                    events.append(event)
        return events
    finally:
        await consumer.stop()


async def test_a_raw_producer_following_the_document_runs_an_agent(stack: EmbeddedStack, prefix: str) -> None:
    assert DOCUMENT["asyncapi"] == "3.0.0"
    topic_prefix = DOCUMENT["x-topic-prefix"]
    assert topic_prefix["setting"] == "QUIPU_KAFKA_TOPIC_PREFIX"

    requested = message_of("runs.requested")
    schema = resolve(DOCUMENT, requested["payload"]["$ref"])
    values = {"run_id": "r-" + uuid.uuid4().hex, "agent_id": "assistant", "text": "calculate 6*7"}
    assert set(schema["required"]) <= set(values), "a new required field: the document says what to send"
    request = {name: value for name, value in values.items() if name in schema["properties"]}
    assert request == values
    assert problems(DOCUMENT, requested["payload"], request) == []

    async_producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap, acks="all", enable_idempotence=False)
    await async_producer.start()
    try:
        await async_producer.send_and_wait(
            prefix + "runs.requested", json.dumps(request).encode(), key=key_by_rule(requested, request)
        )
    finally:
        await async_producer.stop()

    events_message = message_of("runs.events")
    event_schema = events_message["payload"]
    kinds = resolve(DOCUMENT, resolve(DOCUMENT, event_schema["$ref"])["properties"]["type"]["$ref"])["enum"]
    assert "run_stream_end" in kinds

    def ended(events: list[dict[str, Any]]) -> bool:
        return any(
            event["run_id"] == request["run_id"] and event["type"] == "run_stream_end" for event in events
        )

    # The events of this sessionless run are keyed as the document says: by the run id.
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
    replies = "".join(event["payload"]["text"] for event in ours if event["type"] == "assistant_reply")
    assert "42" in replies
