"""docs/asyncapi.json, generated from the topic registry: an AsyncAPI 3.0.0 description of every
topic, its key, its headers and its payload schema, for clients written in other languages.

    python -m quipu.contracts.asyncapi            # rewrite docs/asyncapi.json
    python -m quipu.contracts.asyncapi --check    # exit 1 when docs/asyncapi.json is stale

Payload schemas are pydantic's JSON Schemas of the registry's payloads (validation mode: what a
consumer accepts), their definitions gathered under `components.schemas`. The prose lives in
docs/wire.md, generated from the same contracts; this document is the machine-readable half.
The gateway serves it at `/asyncapi.json`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaValue

from quipu.contracts.commands import REPLY_PARTITION_HEADER, StoreCommand
from quipu.contracts.tools import TOOLSET_NAME_PATTERN
from quipu.contracts.topics import (
    TOPICS,
    Topic,
    TopicSpec,
    agent_of,
    dead_letter_topic,
    principal_of,
    run_of,
    session_else_run,
    session_of,
    toolset_calls_topic,
    toolset_of,
)
from quipu.contracts.wire_doc import DEAD_LETTER_HEADERS, ROUTE_HEADERS, write_or_check

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "asyncapi.json"
"""Where the generated document lives in the repository."""

KAFKA_BINDING = "0.5.0"
"""The AsyncAPI Kafka bindings version the document uses."""

KEY_FROM: dict[Callable[..., str | None], tuple[str, ...]] = {
    session_else_run: ("session_id", "run_id"),
    run_of: ("run_id",),
    session_of: ("session_id",),
    principal_of: ("scope/principal_id",),
    toolset_of: ("toolset",),
    agent_of: ("agent_id",),
}
"""The registry's simple key functions as payload fields: the key is the first non-empty one.

Written in the document as AsyncAPI runtime expressions (`x-key-from`); a test holds each list
equal to its key function over sampled payloads. A storage command's key depends on its `op`
(see its key schema), and a reply carries none.
"""

ROLES: dict[Topic, tuple[str, str]] = {
    Topic.RUNS_REQUESTED: ("gateway, CLI, planner (children)", "planner"),
    Topic.RUNS_CONTROL: ("gateway, CLI, planner", "planner, tool_executor"),
    Topic.TOOLS_CALLS: ("planner", "tool_executor"),
    Topic.TOOLS_RESULTS: ("tool_executor, planner", "planner"),
    Topic.TOOLS_REGISTRY: (
        "tool_executor (at start-up; an MCP toolset's also when its server's tools change)",
        "planner (replayed from the beginning)",
    ),
    Topic.AGENTS_REGISTRY: (
        "`quipu agents apply|delete`, an App at start-up",
        "planner, fact_extractor (replayed from the beginning)",
    ),
    Topic.STORAGE_COMMANDS: ("every service and client", "storage_owner"),
    Topic.STORAGE_REPLIES: ("storage_owner", "the command's sender"),
    Topic.RUNS_EVENTS: ("storage_owner (after commit), planner (text deltas, refusals)", "gateway, CLI, UIs"),
    Topic.HISTORY_TURNS: ("planner", "transcript_recorder"),
    Topic.HISTORY_RECORDED: ("storage_owner", "fact_extractor"),
    Topic.MEMORY_CHANGES: ("storage_owner", "enricher"),
}
"""Who sends and who receives each topic inside Quipu (producers, consumers)."""

COMPACTED = frozenset({Topic.TOOLS_REGISTRY, Topic.AGENTS_REGISTRY})
"""Topics kept by key (cleanup.policy=compact): each key's latest message is what remains."""

TOOLSET_CALLS = toolset_calls_topic("{toolset}")
"""The address of a dedicated toolset's calls topic, `{toolset}` its name."""

_DESCRIPTION = """\
Every Kafka topic of Quipu, generated from its typed topic registry by
`python -m quipu.contracts.asyncapi` (a test fails when this file is stale). docs/wire.md says the
same in prose.

- Values are one UTF-8 JSON object per record. Keys are the UTF-8 bytes of the id each message's
  Kafka binding names (`x-key-from`: the first non-empty of those payload fields); they decide
  ordering only.
- Each channel's address is the topic's registry name; a deployment prefixes every name with its
  `QUIPU_KAFKA_TOPIC_PREFIX` (empty in production; `x-topic-prefix`).
- Every topic has a dead-letter sibling `<topic>.dlq` with the same partitions.
- Topic payloads ignore fields they do not know. Storage commands refuse unknown and repeated
  fields at every level and must carry a non-empty `correlation_id`.
- Fields a principal's words travel in are sealed when `sealed_for` is set (docs/wire.md).
"""


def _ref(*parts: str) -> dict[str, str]:
    return {"$ref": "#/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)}


def _name(spec: TopicSpec[Any]) -> str:
    """The message's name: its model's, or `StoreCommand` for the union of commands."""
    return "StoreCommand" if spec.payload is StoreCommand else str(spec.payload.__name__)


def _schemas() -> tuple[dict[str, JsonSchemaValue], dict[str, JsonSchemaValue]]:
    """Each topic's payload schema (a reference) and every definition, generated together so
    that one name means one schema."""
    adapters: list[tuple[str, Any, TypeAdapter[Any]]] = [
        (spec.topic.value, "validation", spec.adapter) for spec in TOPICS
    ]
    by_key, top = TypeAdapter.json_schemas(adapters, ref_template="#/components/schemas/{model}")
    payloads = {topic: schema for (topic, _), schema in by_key.items()}
    definitions: dict[str, JsonSchemaValue] = dict(sorted(top.get("$defs", {}).items()))
    for topic, schema in list(payloads.items()):
        if "$ref" not in schema:  # a union: it gets a name of its own
            name = _name(next(spec for spec in TOPICS if spec.topic.value == topic))
            definitions[name] = schema
            payloads[topic] = {"$ref": f"#/components/schemas/{name}"}
    return payloads, definitions


def _key(spec: TopicSpec[Any]) -> dict[str, Any]:
    """The Kafka message binding: the key's schema and where it comes from."""
    if spec.topic is Topic.STORAGE_REPLIES:
        return {"key": {"type": "null", "description": "No key: the command's route picks the partition."}}
    binding: dict[str, Any] = {"key": {"type": "string", "description": f"UTF-8 bytes of the {spec.key}."}}
    fields = KEY_FROM.get(spec.key_of)
    if fields is not None:
        binding["x-key-from"] = [f"$message.payload#/{field}" for field in fields]
    return binding


def _headers(spec: TopicSpec[Any]) -> dict[str, Any] | None:
    if spec.topic is not Topic.STORAGE_COMMANDS:
        return None
    properties: dict[str, Any] = {}
    for name, value, meaning in ROUTE_HEADERS:
        properties[name] = {"type": "string", "description": f"{value}: {meaning}."}
    properties[REPLY_PARTITION_HEADER]["pattern"] = "^(0|[1-9][0-9]*)$"
    return {"type": "object", "properties": properties}


def _message(spec: TopicSpec[Any], payload: JsonSchemaValue) -> dict[str, Any]:
    doc = " ".join((getattr(spec.payload, "__doc__", None) or "").split())
    message: dict[str, Any] = {
        "name": _name(spec),
        "contentType": "application/json",
        "payload": payload,
        "bindings": {"kafka": {**_key(spec), "bindingVersion": KAFKA_BINDING}},
    }
    if spec.payload is StoreCommand:
        doc = "A store or memory command, named by its `op`; answered on storage.replies."
        message["description"] = _COMMAND_FRAMING
    if spec.topic in (Topic.STORAGE_COMMANDS, Topic.STORAGE_REPLIES):
        message["correlationId"] = {
            "location": "$message.payload#/correlation_id",
            "description": "A command's (non-empty) correlation id; its reply carries the same one.",
        }
    if doc:
        message["summary"] = doc
    headers = _headers(spec)
    if headers is not None:
        message["headers"] = headers
    return message


_COMMAND_FRAMING = """\
The storage owner decodes a command strictly, at every level of the object: an unknown field or a \
key repeated in any JSON object is refused, and `correlation_id` must be a non-empty string. A \
command breaking these rules is never applied: it is answered INVALID_ARGUMENT when its \
correlation id can be read, and goes to storage.commands.dlq. Name the replies partition you \
read in the quipu-reply-partition header; when no reply comes in time, send the same bytes again \
(a resent write is answered as an exact retry). The schemas shown are the lenient models'; the \
strictness is this rule."""

_DEAD_LETTER: dict[str, Any] = {
    "name": "DeadLetter",
    "summary": "A message a consumer could never handle: the original key, bytes and headers, plus why.",
    "contentType": "application/octet-stream",
    "payload": {
        "description": (
            "The original record's bytes as consumed (perhaps not JSON), or, with `x-dlq-body: "
            "omitted`, a JSON summary `{body_omitted, size, sha256, reason}`."
        )
    },
    "headers": {
        "type": "object",
        "properties": {name: {"type": "string", "description": text} for name, text in DEAD_LETTER_HEADERS},
        "required": ["x-dlq-reason", "x-dlq-error", "x-dlq-attempts", "x-dlq-topic"],
    },
}


def _operations(channel: str, message: str, producers: str, consumers: str) -> dict[str, Any]:
    """The channel's send and receive operations (AsyncAPI 3: their messages are the channel's)."""
    messages = [_ref("channels", channel, "messages", message)]
    return {
        f"send.{channel}": {
            "action": "send",
            "channel": _ref("channels", channel),
            "messages": messages,
            "summary": f"Sent by {producers}.",
        },
        f"receive.{channel}": {
            "action": "receive",
            "channel": _ref("channels", channel),
            "messages": messages,
            "summary": f"Received by {consumers}.",
        },
    }


def _toolset_calls(default: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The channel of a dedicated toolset's calls (payload and key as `tools.calls`), its operations."""
    channel = {
        **default,
        "address": TOOLSET_CALLS,
        "title": TOOLSET_CALLS,
        "description": (
            "Calls for a dedicated toolset (the default toolset's stay on tools.calls); the "
            "address each executor announces on tools.registry as calls_topic. " + default["description"]
        ),
        "parameters": {"toolset": {"description": f"The toolset's name, matching {TOOLSET_NAME_PATTERN}."}},
        "bindings": {"kafka": {"bindingVersion": KAFKA_BINDING}},  # partitions: as the deployment makes it
    }
    [name] = channel["messages"]
    calls = _operations("tools.calls.toolset", name, "planner", "that toolset's tool_executor")
    return channel, calls


def document() -> dict[str, Any]:
    """The whole AsyncAPI document, from the registry."""
    payloads, schemas = _schemas()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {"DeadLetter": _DEAD_LETTER}
    for spec in TOPICS:
        topic, name = spec.topic.value, _name(spec)
        messages[name] = _message(spec, payloads[topic])
        kafka: dict[str, Any] = {"partitions": spec.partitions, "bindingVersion": KAFKA_BINDING}
        if spec.topic in COMPACTED:
            kafka["topicConfiguration"] = {"cleanup.policy": ["compact"]}
        producers, consumers = ROLES[spec.topic]
        channels[topic] = {
            "address": topic,
            "title": topic,
            "description": f"Key: {spec.key}. Sent by {producers}; received by {consumers}.",
            "messages": {name: _ref("components", "messages", name)},
            "bindings": {"kafka": kafka},
        }
        letters = dead_letter_topic(topic)
        channels[letters] = {
            "address": letters,
            "title": letters,
            "description": f"Dead letters of {topic}: same key, original bytes, the reason in headers.",
            "messages": {"DeadLetter": _ref("components", "messages", "DeadLetter")},
            "bindings": {"kafka": kafka},
        }
        operations |= _operations(topic, name, producers, consumers)
        operations[f"receive.{letters}"] = {
            "action": "receive",
            "channel": _ref("channels", letters),
            "messages": [_ref("channels", letters, "messages", "DeadLetter")],
            "summary": "Read by operators (quipu dlq), never by a service.",
        }
    operations["send.storage.commands"]["reply"] = {
        "channel": _ref("channels", Topic.STORAGE_REPLIES.value),
        "messages": [_ref("channels", Topic.STORAGE_REPLIES.value, "messages", "StoreReply")],
    }
    channels["tools.calls.toolset"], calls = _toolset_calls(channels[Topic.TOOLS_CALLS.value])
    operations |= calls
    return {
        "asyncapi": "3.0.0",
        "id": "urn:quipu:wire",
        "info": {"title": "Quipu on the wire", "version": "1", "description": _DESCRIPTION},
        "defaultContentType": "application/json",
        "x-topic-prefix": {
            "setting": "QUIPU_KAFKA_TOPIC_PREFIX",
            "default": "",
            "description": "Prepended to every channel address (and so to every `.dlq` sibling).",
        },
        "servers": {
            "kafka": {
                "host": "localhost:9092",
                "protocol": "kafka",
                "description": (
                    "The deployment's brokers: QUIPU_KAFKA_BOOTSTRAP, a comma-separated host:port "
                    "list (this host is a placeholder)."
                ),
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }


def render() -> str:
    """The document as the committed file's text."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Write docs/asyncapi.json, or with `--check` tell whether it is current (exit 1 when not)."""
    return write_or_check(DOC_PATH, render(), argv, "python -m quipu.contracts.asyncapi")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
