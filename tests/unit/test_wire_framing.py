"""The storage wire's framing: strict command decoding, timestamps and reply routes (docs/wire.md).

One strictness for a whole command: unknown fields and repeated keys are refused at every level,
a command needs a correlation id, a timestamp is never cut short. Reply routes name a partition of
the owner's own replies topic, never a topic.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from quipu.contracts.commands import (
    REPLY_PARTITION_HEADER,
    REPLY_TO_HEADER,
    STORE_COMMAND,
    STRICT_COMMAND,
    CreateSession,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.contracts.memory_commands import ListFacts
from quipu.contracts.wire import format_timestamp
from quipu.services.kit.delivery import describe
from quipu.services.storage_owner.logic import reply_partition
from tests.conformance.builders import ms, ordinary, run_start

GOLDEN = Path(__file__).parent.parent / "contract" / "golden"


def _create(**fields: Any) -> dict[str, Any]:
    return {
        "op": "CreateSession",
        "event_id": "e-1",
        "occurred_at": "2026-01-02T03:04:05.678Z",
        "correlation_id": "c-1",
        "session_id": "s-1",
        "created_at": "2026-01-02T03:04:05.678Z",
    } | fields


def _refusal(body: bytes | str) -> str:
    with pytest.raises(ValidationError) as caught:
        STRICT_COMMAND.validate_json(body.encode() if isinstance(body, str) else body)
    return describe(caught.value)


# --- timestamps -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "created_at",
    [
        "2026-01-02T00:00:00.1234567Z",
        "2026-01-02T00:00:00.1230004Z",  # digits 4-6 zero: a datetime would keep only .123
        "2026-01-02T00:00:00.12300001Z",
        "2026-01-02T00:00:00.123000001Z",
        "2026-01-02T00:00:00.000000001+02:00",
    ],
)
def test_a_timestamp_finer_than_a_microsecond_is_refused_never_truncated(created_at: str) -> None:
    body = json.dumps(_create(created_at=created_at))
    for decode in (STORE_COMMAND.validate_json, STRICT_COMMAND.validate_json):
        with pytest.raises(ValidationError) as caught:
            decode(body)
        assert "never truncated" in describe(caught.value)
        assert created_at not in describe(caught.value), "no input value in the reason"


@pytest.mark.parametrize(
    ("created_at", "millisecond"),
    [
        ("2026-01-02T00:00:00Z", 0),
        ("2026-01-02T00:00:00.1Z", 100),
        ("2026-01-02T00:00:00.123Z", 123),
        ("2026-01-02T00:00:00.123000000Z", 123),
    ],
)
def test_trailing_zeros_beyond_the_millisecond_are_the_same_instant(
    created_at: str, millisecond: int
) -> None:
    command = STRICT_COMMAND.validate_json(json.dumps(_create(created_at=created_at)).encode())
    assert isinstance(command, CreateSession)
    assert command.created_at.microsecond == millisecond * 1000


@pytest.mark.parametrize(
    ("instant", "written"),
    [
        (datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC), "2026-01-02T03:04:05.678Z"),
        (datetime(2026, 1, 2, 0, 30, tzinfo=timezone(timedelta(hours=2))), "2026-01-01T22:30:00.000Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC), "2026-01-02T03:04:05.000007Z"),
        # RFC 3339 years have four digits; strftime wrote this one as "5-01-02".
        (datetime(5, 1, 2, tzinfo=UTC), "0005-01-02T00:00:00.000Z"),
    ],
)
def test_a_timestamp_is_written_in_rfc_3339_utc_with_milliseconds(instant: datetime, written: str) -> None:
    assert format_timestamp(instant) == written


# --- one strictness for the whole command ---------------------------------------------------------


def test_a_valid_command_decodes_strictly_as_it_did_leniently() -> None:
    body = json.dumps(_create()).encode()
    assert STRICT_COMMAND.validate_json(body) == STORE_COMMAND.validate_json(body)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.v1.json")), ids=lambda path: path.name)
def test_every_golden_command_passes_the_owners_strict_decoding(path: Path) -> None:
    value = json.loads(path.read_text())
    if path.name.startswith(("store_reply", "run_event")):
        pytest.skip("not a storage command")
    assert STRICT_COMMAND.validate_json(path.read_bytes()).op == value["op"]


@pytest.mark.parametrize(
    "body",
    [
        '{"op": "CreateSession", "correlation_id": "c-1", "session_id": "s-1", "session_id": "s-2",'
        ' "created_at": "2026-01-02T03:04:05.678Z"}',
        '{"op": "CreateSession", "op": "CreateSession", "correlation_id": "c-1", "session_id": "s-1",'
        ' "created_at": "2026-01-02T03:04:05.678Z"}',
        '{"op": "ListFacts", "correlation_id": "c-1",'
        ' "scope": {"tenant_id": "t", "principal_id": "p", "principal_id": "q"}}',
    ],
    ids=["top level", "the op itself", "nested"],
)
def test_a_repeated_key_anywhere_is_refused(body: str) -> None:
    STORE_COMMAND.validate_json(body)  # the lenient decoding accepts it: the last key wins
    reason = _refusal(body)
    assert "repeats a key" in reason
    assert "s-2" not in reason and "principal_id" not in reason, "no input in the reason"


def test_a_repeated_key_in_a_record_is_refused_like_one_at_the_top() -> None:
    record = json.loads(ordinary(run_start(session_id="s")).model_dump_json())
    text = json.dumps({"op": "AppendRunRecord", "correlation_id": "c-1", "record": record})
    repeated = text.replace('"type": ', '"type": "other", "type": ', 1)
    assert "repeats a key" in _refusal(repeated)


@pytest.mark.parametrize(
    "command",
    [
        _create(added_later=True),
        {
            "op": "ListFacts",
            "correlation_id": "c-1",
            "scope": {"tenant_id": "t", "principal_id": "p", "added_later": 1},
        },
        {
            "op": "AppendRunRecord",
            "correlation_id": "c-1",
            "record": json.loads(ordinary(run_start(session_id="s")).model_dump_json()) | {"added_later": 1},
        },
    ],
    ids=["top level", "nested memory value", "record"],
)
def test_an_unknown_field_is_refused_at_every_level(command: dict[str, Any]) -> None:
    assert "Extra inputs are not permitted" in _refusal(json.dumps(command))


@pytest.mark.parametrize("correlation", [None, ""], ids=["absent", "empty"])
def test_a_command_without_a_correlation_id_is_refused(correlation: str | None) -> None:
    command = _create()
    if correlation is None:
        del command["correlation_id"]
    else:
        command["correlation_id"] = correlation
    assert "correlation_id" in _refusal(json.dumps(command))


def test_commands_the_clients_build_pass_the_strict_decoding() -> None:
    for command in (
        CreateSession(session_id="s", created_at=ms(5), correlation_id="c"),
        ListFacts(scope=MemoryScope(tenant_id="t", principal_id="p"), correlation_id="c"),
    ):
        assert STRICT_COMMAND.validate_json(command.model_dump_json().encode()) == command


# --- reply routes ---------------------------------------------------------------------------------

REPLIES = "prefix.storage.replies"


@pytest.mark.parametrize(
    ("headers", "partition"),
    [
        ({}, None),
        ({REPLY_PARTITION_HEADER: "0"}, 0),
        ({REPLY_PARTITION_HEADER: "7"}, 7),
        ({REPLY_TO_HEADER: REPLIES}, None),
        ({REPLY_TO_HEADER: REPLIES, REPLY_PARTITION_HEADER: "3"}, 3),
        ({"unrelated": "runs.events"}, None),
    ],
)
def test_a_reply_goes_to_the_partition_the_route_names_of_the_owners_topic(
    headers: dict[str, str], partition: int | None
) -> None:
    assert reply_partition(headers, REPLIES, 8) == partition


@pytest.mark.parametrize(
    "headers",
    [
        {REPLY_TO_HEADER: "prefix.runs.events"},
        {REPLY_TO_HEADER: "runs.events", REPLY_PARTITION_HEADER: "1"},
        {REPLY_TO_HEADER: "storage.replies"},  # another deployment's (unprefixed) replies topic
        {REPLY_TO_HEADER: ""},
        {REPLY_PARTITION_HEADER: "8"},
        {REPLY_PARTITION_HEADER: "-1"},
        {REPLY_PARTITION_HEADER: "01"},
        {REPLY_PARTITION_HEADER: " 1"},
        {REPLY_PARTITION_HEADER: "1.0"},
        {REPLY_PARTITION_HEADER: "prefix.runs.events"},
        {REPLY_PARTITION_HEADER: ""},
        {REPLY_PARTITION_HEADER: "9" * 40},
    ],
)
def test_any_other_route_is_invalid_argument_without_its_value(headers: dict[str, str]) -> None:
    with pytest.raises(StoreError) as caught:
        reply_partition(headers, REPLIES, 8)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    for value in headers.values():
        if value:
            assert value not in caught.value.message.replace("0..7", ""), "no header value in the reason"
