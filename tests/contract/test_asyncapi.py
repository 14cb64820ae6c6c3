"""docs/asyncapi.json is current, is an AsyncAPI 3 document, and says what the registry does.

Every registry topic (and its dead-letter sibling) is a channel; every reference resolves; every
payload schema accepts sampled payloads of its topic (checked with tests/support/json_schema.py,
as no JSON Schema package is installed) and refuses one without a required field; the
documented key rule gives the registry's key; and every consumer the service catalog lists is
named on the topic it reads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from quipu.contracts import asyncapi
from quipu.contracts.commands import REPLY_PARTITION_HEADER
from quipu.contracts.topics import TOPICS, Topic, TopicSpec, dead_letter_topic, toolset_calls_topic
from quipu.contracts.wire_doc import DEAD_LETTER_HEADERS
from quipu.services.catalog import SERVICES
from tests.contract.samples import models
from tests.contract.test_topics import ENTRIES, _id
from tests.support.json_schema import key_by_rule, problems, resolve

DOCUMENT: dict[str, Any] = json.loads(asyncapi.DOC_PATH.read_text(encoding="utf-8"))

FEW = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_committed_document_is_the_generated_one() -> None:
    assert asyncapi.DOC_PATH.read_text(encoding="utf-8") == asyncapi.render(), (
        "docs/asyncapi.json is stale: run python -m quipu.contracts.asyncapi"
    )
    assert asyncapi.main(["--check"]) == 0


def _references(value: Any) -> list[str]:
    if isinstance(value, dict):
        own = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return own + [ref for item in value.values() for ref in _references(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _references(item)]
    return []


def test_it_is_an_asyncapi_3_document_with_every_topic_as_a_channel() -> None:
    assert DOCUMENT["asyncapi"] == "3.0.0"
    assert DOCUMENT["info"]["title"] and DOCUMENT["info"]["version"]
    [server] = DOCUMENT["servers"].values()
    assert server["protocol"] == "kafka" and server["host"]
    channels = DOCUMENT["channels"]
    expected = {name for spec in TOPICS for name in (spec.topic.value, dead_letter_topic(spec.topic.value))}
    expected.add(toolset_calls_topic("{toolset}"))
    assert {channel["address"] for channel in channels.values()} == expected
    assert channels["tools.registry"]["bindings"]["kafka"]["topicConfiguration"] == {
        "cleanup.policy": ["compact"]
    }
    for spec in TOPICS:
        channel = channels[spec.topic.value]
        assert channel["bindings"]["kafka"]["partitions"] == spec.partitions
    for name, operation in DOCUMENT["operations"].items():
        assert operation["action"] in ("send", "receive"), name
        channel = resolve(DOCUMENT, operation["channel"]["$ref"])
        for message in operation["messages"]:
            # AsyncAPI 3: an operation's messages are its channel's.
            assert message["$ref"].startswith(operation["channel"]["$ref"] + "/messages/")
            assert resolve(DOCUMENT, message["$ref"]) in channel["messages"].values()
    for ref in _references(DOCUMENT):
        resolve(DOCUMENT, ref)  # raises when it names nothing


def _message(spec: TopicSpec[Any]) -> dict[str, Any]:
    [reference] = DOCUMENT["channels"][spec.topic.value]["messages"].values()
    message: dict[str, Any] = resolve(DOCUMENT, reference["$ref"])
    return message


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
@FEW
@given(data=st.data())
def test_every_payload_schema_accepts_its_topics_payloads_and_the_key_rule_gives_the_key(
    entry: tuple[TopicSpec[Any], type[BaseModel]], data: st.DataObject
) -> None:
    spec, model = entry
    payload = data.draw(models(model))
    body = json.loads(payload.model_dump_json())
    message = _message(spec)
    assert problems(DOCUMENT, message["payload"], body) == []
    if "x-key-from" in message["bindings"]["kafka"]:
        assert key_by_rule(message, body) == spec.key_for(payload)


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_payload_schema_refuses_a_payload_without_a_required_field(
    entry: tuple[TopicSpec[Any], type[BaseModel]], data: st.DataObject
) -> None:
    spec, model = entry
    body = json.loads(data.draw(models(model)).model_dump_json())
    required = [name for name, field in model.model_fields.items() if field.is_required()]
    for name in required:
        assert problems(DOCUMENT, _message(spec)["payload"], {k: v for k, v in body.items() if k != name})


def test_the_simple_key_rules_cover_every_topic_but_commands_and_replies() -> None:
    ruled = {spec.topic for spec in TOPICS if "x-key-from" in _message(spec)["bindings"]["kafka"]}
    assert ruled == {spec.topic for spec in TOPICS} - {Topic.STORAGE_COMMANDS, Topic.STORAGE_REPLIES}


def test_headers_are_the_reply_route_and_the_dead_letter_ones() -> None:
    headers = _message(next(spec for spec in TOPICS if spec.topic is Topic.STORAGE_COMMANDS))["headers"]
    assert REPLY_PARTITION_HEADER in headers["properties"]
    assert problems(DOCUMENT, headers, {REPLY_PARTITION_HEADER: "3"}) == []
    assert problems(DOCUMENT, headers, {REPLY_PARTITION_HEADER: "03"})  # as the owner refuses it
    letter = DOCUMENT["components"]["messages"]["DeadLetter"]
    assert set(letter["headers"]["properties"]) == {name for name, _ in DEAD_LETTER_HEADERS}


def test_a_command_is_answered_on_the_replies_channel_by_its_correlation_id() -> None:
    reply = DOCUMENT["operations"]["send.storage.commands"]["reply"]
    assert resolve(DOCUMENT, reply["channel"]["$ref"])["address"] == Topic.STORAGE_REPLIES.value
    [answer] = [
        resolve(DOCUMENT, resolve(DOCUMENT, message["$ref"])["$ref"]) for message in reply["messages"]
    ]
    command = _message(next(spec for spec in TOPICS if spec.topic is Topic.STORAGE_COMMANDS))
    for message in (command, answer):
        assert message["correlationId"]["location"] == "$message.payload#/correlation_id"
    assert "refused" in command["description"]


def test_every_catalog_consumer_is_named_on_the_topic_it_reads() -> None:
    for service in SERVICES:
        for consumer in service.consumers:
            operation = DOCUMENT["operations"][f"receive.{consumer.topic_name}"]
            assert service.name in operation["summary"], (service.name, consumer.topic)
