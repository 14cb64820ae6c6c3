"""The storage owner and malformed commands; the store client when no owner answers.

A malformed command (not JSON, not a command, a command with missing or ill-typed fields) can never
succeed. The owner must answer INVALID_ARGUMENT when it can read a correlation id, always park the
original bytes on `storage.commands.dlq` with the reason, the error and the original position in
headers, commit, and go on serving (ack after the effect is durable, never a poison pill).

Against the real embedded broker and database, with the owner as a separate process.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from quipu.contracts.commands import (
    REPLY_PARTITION_HEADER,
    REPLY_TO_HEADER,
    AppendRunRecord,
    CreateSession,
    LoadSessionStatus,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.contracts.memory_commands import ListFacts
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from tests.conformance.builders import (
    all_run_records,
    ms,
    open_session,
    ordinary,
    run_start,
    running_root,
    session_with_root,
    uid,
)
from tests.conformance.memory_builders import new
from tests.owner_support import Owner, RawPublisher, ReplyReader, Served, TopicReader, wait_until_serving
from tests.timing import scaled

pytestmark = pytest.mark.slow


@dataclass
class InvalidHarness:
    """One owner for the module, and readers of its replies and dead letters."""

    served: Served
    replies: ReplyReader
    dead_letters: TopicReader
    publisher: RawPublisher
    checked_offsets: list[tuple[int, int]] = field(default_factory=list)

    @property
    def commands_topic(self) -> str:
        return self.served.topic(Topic.STORAGE_COMMANDS.value)

    @property
    def replies_topic(self) -> str:
        return self.served.topic(Topic.STORAGE_REPLIES.value)


@pytest.fixture(scope="module")
async def harness(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InvalidHarness]:
    """A storage-owner process on its own prefix and database, with raw readers and a publisher."""
    name = f"oinv{uuid.uuid4().hex[:8]}"
    log_path = tmp_path_factory.mktemp("owner") / "owner.log"
    async with Served(stack, f"{name}.", name, log_path) as served:
        replies = ReplyReader(stack.bootstrap, served.topic(Topic.STORAGE_REPLIES.value))
        dead_letters = TopicReader(stack.bootstrap, served.topic(Topic.STORAGE_COMMANDS.dlq))
        async with replies, dead_letters, RawPublisher(stack.bootstrap) as publisher:
            yield InvalidHarness(served, replies, dead_letters, publisher)


# --- malformed commands -------------------------------------------------------------------------


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _cases() -> list[tuple[str, bytes | None, bool, dict[str, bytes]]]:
    """(case, body with CID for the correlation id, whether the owner can read it, extra headers)."""
    record = ordinary(run_start(session_id="s"))
    valid_record = json.loads(record.model_dump_json())
    return [
        ("truncated json", b'{"op": "CreateSession", "correlation_id": "CID", "session_id": ', False, {}),
        ("not utf-8", b'{"op": "CreateSession", "correlation_id": "\xff\xfe"}', False, {}),
        ("empty body", b"", False, {}),
        ("null value (tombstone)", None, False, {}),
        ("a json array", b"[1, 2, 3]", False, {}),
        ("a json string", b'"CreateSession"', False, {}),
        (
            "correlation id not a string",
            _json({"op": "LoadRun", "correlation_id": 7, "run_id": "r"}),
            False,
            {},
        ),
        ("unknown op", _json({"op": "DropEverything", "correlation_id": "CID"}), True, {}),
        (
            "no op",
            _json({"correlation_id": "CID", "session_id": "s", "created_at": "2025-03-14T09:26:53.000Z"}),
            True,
            {},
        ),
        ("missing record", _json({"op": "AppendRunRecord", "correlation_id": "CID"}), True, {}),
        (
            "missing session_id",
            _json({"op": "CreateSession", "correlation_id": "CID", "created_at": "2025-03-14T09:26:53.000Z"}),
            True,
            {},
        ),
        (
            "ill-typed fields",
            _json({"op": "CreateSession", "correlation_id": "CID", "session_id": 42, "created_at": True}),
            True,
            {},
        ),
        (
            "timestamp without offset",
            _json(
                {
                    "op": "CreateSession",
                    "correlation_id": "CID",
                    "session_id": "s",
                    "created_at": "2025-03-14T09:26:53.000",
                }
            ),
            True,
            {},
        ),
        (
            "payload not base64",
            _json(
                {
                    "op": "AppendRunRecord",
                    "correlation_id": "CID",
                    "record": {**valid_record, "payload": "not base64!"},
                }
            ),
            True,
            {},
        ),
        (
            "limit not an integer",
            _json({"op": "ListRunRecords", "correlation_id": "CID", "run_id": "r", "limit": "ten"}),
            True,
            {},
        ),
        (
            "short timestamp",
            _json({"op": "CreateSession", "correlation_id": "CID", "session_id": "s", "created_at": "now"}),
            True,
            {},
        ),
        (
            "deeply nested json",
            b'{"op": "LoadRun", "correlation_id": "CID", "run_id": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            False,
            {},
        ),
        (
            "invalid json sent as application/json",
            b'{"op": "CreateSession", "correlation_id": "CID", "session_id": ',
            False,
            {"content-type": b"application/json"},
        ),
        (
            "a header value that is not utf-8",
            _json({"op": "DropEverything", "correlation_id": "CID"}),
            True,
            {"trace": b"\xff\xfe"},
        ),
        # One strictness for the whole command (docs/wire.md): never truncated, never last-wins.
        (
            "timestamp with digits beyond the microsecond",
            _json(
                {
                    "op": "CreateSession",
                    "correlation_id": "CID",
                    "session_id": "s",
                    "created_at": "2025-03-14T09:26:53.1230004Z",
                }
            ),
            True,
            {},
        ),
        (
            "a repeated key",
            b'{"op": "LoadRun", "correlation_id": "CID", "run_id": "r", "run_id": "q"}',
            True,
            {},
        ),
        (
            "an unknown top-level field",
            _json({"op": "LoadRun", "correlation_id": "CID", "run_id": "r", "added_later": True}),
            True,
            {},
        ),
        ("no correlation id", _json({"op": "LoadRun", "run_id": "r"}), False, {}),
        ("an empty correlation id", _json({"op": "LoadRun", "correlation_id": "", "run_id": "r"}), False, {}),
    ]


CASES = _cases()


@pytest.mark.parametrize(("case", "body", "readable", "headers"), CASES, ids=[case[0] for case in CASES])
async def test_a_malformed_command_is_refused_dead_lettered_and_the_owner_goes_on(
    harness: InvalidHarness, case: str, body: bytes | None, readable: bool, headers: dict[str, bytes]
) -> None:
    correlation_id = uid("bad")
    if body is not None:
        body = body.replace(b"CID", correlation_id.encode())
    partition_key = uid("key").encode()
    position = await harness.publisher.send(
        harness.commands_topic,
        body,
        key=partition_key,
        headers={REPLY_TO_HEADER: harness.replies_topic.encode(), **headers},
    )

    def dead_lettered(records: list) -> bool:  # type: ignore[type-arg]
        return any(_position_of(record) == position for record in records)

    records = await harness.dead_letters.wait_for(dead_lettered, within=8.0)
    letter = next(record for record in records if _position_of(record) == position)
    letter_headers = {name: (value or b"").decode(errors="replace") for name, value in letter.headers}
    assert letter.value == (body or b""), "the dead letter must carry the original bytes"
    assert letter.key == partition_key
    assert letter_headers["x-dlq-reason"] == "invalid_payload"
    assert letter_headers["x-dlq-error"], "the dead letter must say what was wrong"
    assert letter_headers["x-dlq-topic"] == harness.commands_topic
    assert letter_headers["x-dlq-attempts"] == "0"
    assert letter_headers[REPLY_TO_HEADER] == harness.replies_topic, "original headers are kept"

    if readable:
        await harness.replies.wait_for_replies([correlation_id], within=10.0)
        [reply] = harness.replies.replies()[correlation_id]
        assert reply["result"] is None
        assert reply["error"]["code"] == ErrorCode.INVALID_ARGUMENT.value
        assert reply["error"]["retryable"] is False
        assert reply["error"]["message"]

    # The owner goes on: a valid command after the malformed one is applied.
    session = await harness.served.store.create_session(uid("after"), ms(0))
    assert session.status.value == "active"


def _position_of(record: object) -> tuple[int, int]:
    headers = {
        name: (value or b"").decode(errors="replace") for name, value in getattr(record, "headers", ())
    }
    try:
        return int(headers["x-dlq-partition"]), int(headers["x-dlq-offset"])
    except (KeyError, ValueError):
        return (-1, -1)


async def test_unreadable_commands_get_no_reply_and_valid_ones_are_not_dead_lettered(
    harness: InvalidHarness,
) -> None:
    """Runs after the malformed cases: no reply without a correlation id, nothing valid parked."""
    session_id = await open_session(harness.served.store)
    run = await running_root(harness.served.store, session_id)
    refused = AppendRunRecord(record=ordinary(run, "k", record_type="run_started"), correlation_id=uid("c"))
    with pytest.raises(StoreError) as caught:
        await harness.served.store.call(refused)
    # A contract error from the store is a reply, not a dead letter: the command was well formed.
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert all(reply.get("correlation_id") for reply in harness.replies.values() if isinstance(reply, dict))
    parked = [json.loads(record.value) for record in harness.dead_letters.records if _is_json(record.value)]
    assert not any(
        isinstance(value, dict) and value.get("correlation_id") == refused.correlation_id for value in parked
    )
    assert [record.event_key for record in await all_run_records(harness.served.store, run.run_id)] == [
        "started"
    ]


def _is_json(value: bytes | None) -> bool:
    try:
        json.loads(value or b"")
    except (ValueError, RecursionError):  # RecursionError: the deeply nested case
        return False
    return True


# --- reply routes: only the deployment's own replies topic --------------------------------------


async def _dead_letter_at(harness: InvalidHarness, position: tuple[int, int]) -> dict[str, str]:
    """The headers of the dead letter of the command published at `position`."""
    records = await harness.dead_letters.wait_for(
        lambda records: any(_position_of(record) == position for record in records), within=8.0
    )
    letter = next(record for record in records if _position_of(record) == position)
    return {name: (value or b"").decode(errors="replace") for name, value in letter.headers}


async def _refusal_of(harness: InvalidHarness, correlation_id: str) -> dict[str, object]:
    await harness.replies.wait_for_replies([correlation_id], within=10.0)
    [reply] = harness.replies.replies()[correlation_id]
    return reply


async def test_a_reply_route_naming_another_topic_is_refused_and_nothing_lands_there(
    harness: InvalidHarness, stack: EmbeddedStack
) -> None:
    """A ListFacts asking for its reply on the topic behind the live streams gets none there."""
    memory = KafkaMemoryStore(harness.served.store)
    who = MemoryScope(tenant_id=uid("tenant"), principal_id=uid("principal"))
    fact_text = uid("likes green tea")
    await memory.apply_fact_operations(who, [new(uid("fact"), fact_text)], uid("remembered"))
    assert [fact.text for fact in await memory.list_facts(who)] == [fact_text]

    events_topic = harness.served.topic(Topic.RUNS_EVENTS.value)
    async with TopicReader(stack.bootstrap, events_topic) as events:
        command = ListFacts(scope=who, tenant_id=who.tenant_id, correlation_id=uid("steal"))
        position = await harness.publisher.send_command(harness.commands_topic, command, events_topic)

        letter_headers = await _dead_letter_at(harness, position)
        assert letter_headers["x-dlq-reason"] == "permanent_error"
        assert REPLY_PARTITION_HEADER in letter_headers["x-dlq-error"], "the reason names the rule"
        assert events_topic not in letter_headers["x-dlq-error"], "never the header's value"
        reply = await _refusal_of(harness, command.correlation_id)
        assert reply["result"] is None
        assert reply["error"]["code"] == ErrorCode.INVALID_ARGUMENT.value  # type: ignore[index]

        leaked = await _landed_after(harness, events, [fact_text, command.correlation_id])
        assert leaked == [], "nothing of the command may land on another topic"


async def _landed_after(
    harness: InvalidHarness, reader: TopicReader, needles: list[str]
) -> list[bytes | None]:
    """What `reader`'s topic holds that carries one of `needles`, or is empty, once the owner is
    done with the commands sent so far (a marker on every partition after them has been read)."""
    markers = {uid("marker").encode(): number for number in reader.partitions}
    for marker, number in markers.items():
        await harness.publisher.send(reader.topic, marker, partition=number)
    await reader.wait_for(lambda records: set(markers) <= {record.value for record in records})
    return [
        record.value
        for record in reader.records
        if not record.value or any(needle.encode() in record.value for needle in needles)
    ]


async def test_a_faststream_reply_to_header_sends_nothing_anywhere(
    harness: InvalidHarness, stack: EmbeddedStack
) -> None:
    """FastStream publishes a handler's return value to a `reply_to` header's topic; not here."""
    events_topic = harness.served.topic(Topic.RUNS_EVENTS.value)
    async with TopicReader(stack.bootstrap, events_topic) as events:
        command = LoadSessionStatus(session_id=uid("absent"), correlation_id=uid("cid"))
        await harness.publisher.send(
            harness.commands_topic,
            command.model_dump_json().encode(),
            headers={"reply_to": events_topic.encode()},
        )
        reply = await _refusal_of(harness, command.correlation_id)
        assert reply["error"]["code"] == ErrorCode.SESSION_NOT_FOUND.value  # type: ignore[index]
        assert await _landed_after(harness, events, [command.correlation_id]) == []


ROUTES = [
    ("another topic", {REPLY_TO_HEADER: b"runs.events"}),
    ("a partition the topic lacks", {REPLY_PARTITION_HEADER: b"8"}),
    ("a negative partition", {REPLY_PARTITION_HEADER: b"-1"}),
    ("not a number", {REPLY_PARTITION_HEADER: b"storage.replies"}),
]


@pytest.mark.parametrize(("case", "headers"), ROUTES, ids=[route[0] for route in ROUTES])
async def test_a_command_with_an_invalid_route_is_refused_dead_lettered_and_not_applied(
    harness: InvalidHarness, case: str, headers: dict[str, bytes]
) -> None:
    command = CreateSession(session_id=uid("routed"), created_at=ms(0), correlation_id=uid("cid"))
    position = await harness.publisher.send(
        harness.commands_topic, command.model_dump_json().encode(), key=b"k", headers=headers
    )
    letter_headers = await _dead_letter_at(harness, position)
    assert letter_headers["x-dlq-reason"] == "permanent_error"
    reply = await _refusal_of(harness, command.correlation_id)
    assert reply["error"]["code"] == ErrorCode.INVALID_ARGUMENT.value  # type: ignore[index]
    with pytest.raises(StoreError) as caught:
        await harness.served.store.load_session_status(command.session_id)
    assert caught.value.code is ErrorCode.SESSION_NOT_FOUND, "nothing was applied"


async def test_a_reply_lands_on_the_partition_its_route_names(harness: InvalidHarness) -> None:
    partitions = {uid("cid"): number for number in (0, 5, 7)}
    for correlation_id, number in partitions.items():
        await harness.publisher.send(
            harness.commands_topic,
            LoadSessionStatus(session_id=uid("absent"), correlation_id=correlation_id)
            .model_dump_json()
            .encode(),
            headers={REPLY_PARTITION_HEADER: str(number).encode()},
        )
    # A command that does not decode is refused on its route too, when the route is valid.
    refused = uid("refused")
    await harness.publisher.send(
        harness.commands_topic,
        _json({"op": "LoadRun", "correlation_id": refused, "run_id": "r", "added_later": 1}),
        headers={REPLY_PARTITION_HEADER: b"3"},
    )
    partitions[refused] = 3
    # The store client names its own partition and reads only that one.
    client_call = LoadSessionStatus(session_id=uid("absent"), correlation_id=uid("client"))
    with pytest.raises(StoreError):
        await harness.served.store.call(client_call)
    partitions[client_call.correlation_id] = harness.served.store.reply_partition  # type: ignore[assignment]

    await harness.replies.wait_for_replies(partitions, within=10.0)
    landed = {
        json.loads(record.value)["correlation_id"]: record.partition
        for record in harness.replies.records
        if _is_json(record.value) and json.loads(record.value or b"{}").get("correlation_id") in partitions
    }
    assert landed == partitions
    [refusal] = harness.replies.replies()[refused]
    assert refusal["error"]["code"] == ErrorCode.INVALID_ARGUMENT.value


async def test_a_command_without_a_correlation_id_is_dead_lettered_and_not_applied(
    harness: InvalidHarness,
) -> None:
    session_id = uid("uncorrelated")
    body = _json({"op": "CreateSession", "session_id": session_id, "created_at": "2025-03-14T09:26:53.000Z"})
    position = await harness.publisher.send(harness.commands_topic, body, key=session_id.encode())
    letter_headers = await _dead_letter_at(harness, position)
    assert letter_headers["x-dlq-reason"] == "invalid_payload"
    assert "correlation_id" in letter_headers["x-dlq-error"]
    with pytest.raises(StoreError) as caught:
        await harness.served.store.load_session_status(session_id)
    assert caught.value.code is ErrorCode.SESSION_NOT_FOUND, "nothing was applied"


# --- no owner: UNAVAILABLE, then the resent command ---------------------------------------------


async def test_no_owner_means_unavailable_after_identical_resends(
    stack: EmbeddedStack, kafka_settings: KafkaSettings
) -> None:
    command = CreateSession(session_id=uid("session"), created_at=ms(0), correlation_id=uid("cid"))
    commands_topic = kafka_settings.topic_prefix + Topic.STORAGE_COMMANDS.value
    async with KafkaStore(kafka_settings, reply_timeout_s=0.3, attempts=3) as store:
        with pytest.raises(StoreError) as caught:
            await store.call(command)
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert caught.value.retryable is True

    async with TopicReader(stack.bootstrap, commands_topic) as sent:
        await sent.wait_for(lambda records: len(records) >= 3, within=10.0)
    copies = [
        record for record in sent.records if record.value and command.correlation_id.encode() in record.value
    ]
    assert len(copies) == 3, "one copy per attempt"
    assert {record.value for record in copies} == {command.model_dump_json().encode()}, "identical bytes"
    assert {record.key for record in copies} == {command.session_id.encode()}


async def test_a_command_resent_after_unavailable_returns_the_original_result(
    stack: EmbeddedStack, topic_prefix: str, unique: str
) -> None:
    settings = stack.kafka_settings(topic_prefix=topic_prefix)
    owner = Owner(stack, topic_prefix, unique, None).start()
    try:
        async with (
            KafkaStore(settings, reply_timeout_s=scaled(10.0)) as store,
            ReplyReader(stack.bootstrap, settings.topic_prefix + Topic.STORAGE_REPLIES.value) as replies,
        ):
            await wait_until_serving(store, owner)
            _, run = await session_with_root(store)
            await owner.stop()
            assert not owner.running

            append = AppendRunRecord(record=ordinary(run, "the-append"), correlation_id=uid("cid"))
            async with KafkaStore(settings, reply_timeout_s=0.3, attempts=2) as impatient:
                with pytest.raises(StoreError) as caught:
                    await impatient.call(append)
            assert caught.value.code is ErrorCode.UNAVAILABLE

            owner.start()  # a new owner process: the unanswered copies are still in the topic
            result = await store.call(append)  # the caller's job after UNAVAILABLE: resend it
            assert result.record_id == "2"
            await replies.wait_for(
                lambda _: len(replies.replies().get(append.correlation_id, [])) >= 3, within=15.0
            )
            answers = replies.replies()[append.correlation_id]
            # Two unanswered copies and the resend: one write, the same record id in every answer.
            assert len(answers) == 3
            assert [answer["result"]["record_id"] for answer in answers] == ["2", "2", "2"]
            assert sorted(answer["result"]["inserted"] for answer in answers) == [False, False, True]
            records = await all_run_records(store, run.run_id)
            assert [(record.id, record.event_key) for record in records] == [
                ("1", "started"),
                ("2", "the-append"),
            ]
    finally:
        await owner.stop()
