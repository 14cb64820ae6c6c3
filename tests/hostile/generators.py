"""Hostile messages for every consumed topic: hand-made ones and ones drawn by hypothesis.

Every message carries `MARKER` somewhere in its content, so that a test can prove no input value
reached a log line or an `x-dlq-*` header: the marker must never appear in either.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from quipu.contracts.commands import STORE_COMMAND
from quipu.contracts.memory import FactChanged, HistoryRecorded
from quipu.contracts.runs import CancelRun, RunRequested, TurnCompleted
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic

MARKER = "hostile-" + uuid.uuid4().hex[:12]
"""A value only hostile messages hold: it must never be seen in a log or a dead-letter header."""

PAYLOADS: dict[Topic, TypeAdapter[Any]] = {
    Topic.STORAGE_COMMANDS: STORE_COMMAND,
    Topic.RUNS_REQUESTED: TypeAdapter(RunRequested),
    Topic.RUNS_CONTROL: TypeAdapter(CancelRun),
    Topic.TOOLS_RESULTS: TypeAdapter(ToolCallCompleted),
    Topic.TOOLS_CALLS: TypeAdapter(ToolCallRequested),
    Topic.HISTORY_TURNS: TypeAdapter(TurnCompleted),
    Topic.HISTORY_RECORDED: TypeAdapter(HistoryRecorded),
    Topic.MEMORY_CHANGES: TypeAdapter(FactChanged),
}
"""Every topic a service consumes in a group, and what its messages must decode as."""

FIVE_MB = 5 * 1024 * 1024
DEPTH = 500_000

_FIELDS = [
    "op",
    "type",
    "event_id",
    "run_id",
    "session_id",
    "correlation_id",
    "record",
    "scope",
    "principal_id",
    "text",
    "tool_use_id",
    "tool_name",
    "input",
    "kind",
    "version",
    "limit",
    "created_at",
    "occurred_at",
    "schema_version",
]
"""Field names the real payloads use, so that drawn objects get past the first checks."""


@dataclass(frozen=True)
class Hostile:
    """One message to publish: what it is, its bytes and headers."""

    case: str
    body: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)


def deep(depth: int = DEPTH) -> bytes:
    """A JSON array nested `depth` deep (inside an object holding the marker)."""
    return b'{"marker": "' + MARKER.encode() + b'", "v": ' + b"[" * depth + b"]" * depth + b"}"


def big(size: int = FIVE_MB) -> bytes:
    """A JSON object of about `size` bytes."""
    return json.dumps({"op": "CreateSession", "marker": MARKER, "pad": "a" * size}).encode()


def poison() -> list[Hostile]:
    """What restarts are tested with at the head of a partition: the two heaviest messages."""
    return [Hostile("5 MB", big()), Hostile("500,000 deep", deep())]


def hand_made(topic: Topic) -> list[Hostile]:
    """Hand-made hostile messages for `topic` (the storage commands get bad reply routes too)."""
    wrong_types = {
        "op": 7,
        "type": ["RunRequested"],
        "event_id": {"x": MARKER},
        "run_id": 12,
        "session_id": [MARKER],
        "correlation_id": 3.5,
        "text": {"nested": MARKER},
        "record": MARKER,
        "scope": [MARKER],
    }
    cases = [
        Hostile("empty", b""),
        Hostile("tombstone", None),
        Hostile("not json", b"\x00\xff\xfe " + MARKER.encode()),
        Hostile("truncated", json.dumps({"op": "CreateSession", "marker": MARKER}).encode()[:-9]),
        Hostile("a json string", json.dumps(MARKER).encode()),
        Hostile("wrong types", json.dumps(wrong_types).encode()),
        Hostile("unknown tag", json.dumps({"op": MARKER, "type": MARKER, "kind": MARKER}).encode()),
        Hostile(
            "absurd numbers",
            b'{"op": "ListRunRecords", "marker": "'
            + MARKER.encode()
            + b'", "limit": 1'
            + b"0" * 5000
            + b', "version": -1e999, "schema_version": NaN, "created_at": 1e308, "seconds": Infinity}',
        ),
        Hostile("huge integer", b'{"version": ' + b"9" * 100_000 + b', "m": "' + MARKER.encode() + b'"}'),
        Hostile("5 MB", big()),
        Hostile("500,000 deep", deep()),
        Hostile(
            "headers not utf-8",
            json.dumps(wrong_types).encode(),
            {"trace": b"\xff\xfe\x00", "content-type": b"application/json\xff"},
        ),
    ]
    if topic is Topic.STORAGE_COMMANDS:
        command = {"op": "LoadSessionStatus", "correlation_id": MARKER, "session_id": 5}
        for route in [b"bad topic!!", b"", b"x" * 300, b"\xff\xfe", b"../../etc", b"storage.commands"]:
            cases.append(
                Hostile(f"reply route {route[:12]!r}", json.dumps(command).encode(), {"reply-to": route})
            )
    return cases


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(MARKER),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(_FIELDS), children, max_size=4)
    ),
    max_leaves=12,
)
_OBJECTS = st.dictionaries(
    st.sampled_from(_FIELDS) | st.text(max_size=8), _VALUES, min_size=1, max_size=8
).map(lambda value: {"marker": MARKER, **value})
_BODIES = st.one_of(
    _OBJECTS.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=64).map(lambda raw: raw + MARKER.encode()),
    _OBJECTS.map(lambda value: json.dumps(value).encode()[:-3]),
)


def drawn(count: int) -> list[Hostile]:
    """`count` bodies drawn by hypothesis: objects of real field names with values of every wrong
    type, bytes that are not JSON, and truncated objects."""
    found: list[bytes] = []

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(_BODIES)
    def collect(body: bytes) -> None:
        found.append(body)

    collect()
    return [Hostile(f"drawn {number}", body) for number, body in enumerate(found)]


def never_valid(topic: Topic, message: Hostile) -> bool:
    """Whether `message` can never decode as `topic`'s payload (so it must be dead-lettered)."""
    try:
        PAYLOADS[topic].validate_json(message.body or b"")
    except Exception:
        return True
    return False
