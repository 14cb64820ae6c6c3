"""Sealed topic messages: words sealed under a principal's key, ids in clear, erased once it is gone."""

from __future__ import annotations

import asyncio
import json
import secrets
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from quipu.contracts.commands import STRICT_COMMAND, AppendRunRecord, StoreReply
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.memory import FactChanged, FactChangeKind, MemoryScope
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import Record
from quipu.services.cli.launch import local_key_channel
from quipu.services.kit.delivery import DeadLetterLimits, Delivery, MessageErasedError, RetryPolicy
from quipu.services.kit.keys import (
    KeyClient,
    KeyUnavailableError,
    MessageSeals,
    UnsealableMessageError,
)
from quipu.services.kit.sealing import current_sealing_for, sealing_for
from quipu.services.kit.settings import KeySettings
from tests.support.consumed import Message
from tests.unit.test_delivery import Broker

EVENT = TypeAdapter(RunEvent)
WORDS = "my blood type is AB negative"
ALICE = SealedFor(tenant_id="acme", principal_id="alice")
AT = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)


class Keys:
    """A key source like the owner's: one key per principal, gone once forgotten; counts fetches."""

    def __init__(self) -> None:
        self.keys: dict[SealedFor, bytes] = {}
        self.fetches = 0
        self.away = False

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        self.fetches += 1
        await asyncio.sleep(0)
        if self.away:
            raise KeyUnavailableError("owner away")
        if whose not in self.keys and create:
            self.keys[whose] = secrets.token_bytes(32)
        return self.keys.get(whose)

    def forget(self, whose: SealedFor) -> None:
        self.keys.pop(whose, None)


def event(whose: SealedFor | None = ALICE) -> RunEvent:
    return RunEvent(
        event_id="e-1",
        type=StreamEventType.ASSISTANT_TURN,
        event_key="k/0",
        run_id="run-1",
        session_id="s-1",
        timestamp=AT,
        occurred_at=AT,
        payload={"message": {"role": "assistant", "content": WORDS}},
        sealed_for=whose,
    )


async def test_a_sealed_event_keeps_ids_and_type_in_clear_and_opens_to_the_same_event() -> None:
    seals = MessageSeals(KeyClient(Keys()))
    body = await seals.encode(event())
    assert WORDS.encode() not in body
    wire = json.loads(body)
    assert {wire["event_id"], wire["type"], wire["run_id"], wire["session_id"]} == {
        "e-1",
        "assistant_turn",
        "run-1",
        "s-1",
    }
    assert wire["sealed_for"] == {"tenant_id": "acme", "principal_id": "alice"}
    assert "payload" not in wire
    assert RunEvent.model_validate_json(await seals.open(body)) == event()


async def test_a_message_for_no_one_or_without_keys_is_plain_json_as_before() -> None:
    plain = event(whose=None)
    assert await MessageSeals(KeyClient(Keys())).encode(plain) == plain.model_dump_json().encode()
    assert await MessageSeals(None).encode(event()) == event().model_dump_json().encode()
    assert await MessageSeals(KeyClient(Keys())).open(plain.model_dump_json().encode()) == (
        plain.model_dump_json().encode()
    )


async def test_a_sealed_message_decoded_without_opening_is_refused_not_read_with_defaults() -> None:
    body = await MessageSeals(KeyClient(Keys())).encode(
        FactChanged(
            kind=FactChangeKind.CREATED,
            fact_id="f",
            scope=MemoryScope(tenant_id="acme", principal_id="alice"),
            version=1,
            text=WORDS,
            sealed_for=ALICE,
        )
    )
    with pytest.raises(ValueError, match="open it"):
        FactChanged.model_validate_json(body)


async def test_after_forget_every_copy_reads_as_erased_once_no_cache_holds_the_key() -> None:
    keys = Keys()
    now = [0.0]
    here = MessageSeals(KeyClient(keys, ttl_s=30.0, clock=lambda: now[0]))
    body = await here.encode(event())
    keys.forget(ALICE)
    with pytest.raises(MessageErasedError):
        await MessageSeals(KeyClient(keys)).open(body)  # any other process: at once
    await here.open(body)  # this one's cache still holds the key, for its TTL at most
    now[0] = 31.0
    with pytest.raises(MessageErasedError):
        await here.open(body)


async def test_a_key_made_after_a_forget_is_fetched_again_over_a_stale_cache() -> None:
    keys = Keys()
    here = MessageSeals(KeyClient(keys))
    await here.open(await here.encode(event()))
    keys.forget(ALICE)
    newer = await MessageSeals(KeyClient(keys)).encode(event())  # elsewhere, under a new key
    assert RunEvent.model_validate_json(await here.open(newer)) == event()


async def test_a_sealed_part_moved_onto_another_message_or_altered_does_not_open() -> None:
    seals = MessageSeals(KeyClient(Keys()))
    wire = json.loads(await seals.encode(event()))
    moved = json.dumps({**wire, "run_id": "run-2"}).encode()
    with pytest.raises(UnsealableMessageError):
        await seals.open(moved)
    sealed = bytearray(wire["sealed"].encode())
    sealed[-3] = ord("A") if sealed[-3] != ord("A") else ord("B")
    with pytest.raises(UnsealableMessageError):
        await seals.open(json.dumps({**wire, "sealed": sealed.decode()}).encode())
    with pytest.raises(UnsealableMessageError, match="no key channel"):
        await MessageSeals(None).open(json.dumps(wire).encode())


async def test_one_fetch_per_principal_per_ttl_and_a_missing_key_is_never_cached() -> None:
    keys = Keys()
    now = [0.0]
    client = KeyClient(keys, ttl_s=30.0, clock=lambda: now[0])
    results = await asyncio.gather(*(client.key(ALICE, create=True) for _ in range(50)))
    assert len(set(results)) == 1
    assert keys.fetches == 1
    now[0] = 29.0
    await client.key(ALICE)
    assert keys.fetches == 1
    now[0] = 31.0
    await client.key(ALICE)
    assert keys.fetches == 2
    bob = SealedFor(principal_id="bob")
    assert await client.key(bob) is None
    assert await client.key(bob) is None
    assert keys.fetches == 4


async def test_a_command_is_sealed_whole_and_the_owner_decodes_it_strictly_after_opening() -> None:
    seals = MessageSeals(KeyClient(Keys()))
    record = Record(
        event_key="k",
        run_id="run-1",
        agent_id="a",
        session_id="s-1",
        type="note",
        payload=json.dumps({"text": WORDS}).encode(),
        timestamp=AT,
    )
    command = AppendRunRecord(correlation_id="c-1", record=record, occurred_at=AT, sealed_for=ALICE)
    body = await seals.encode(command)
    assert WORDS.encode() not in body and b"note" not in body
    assert json.loads(body)["op"] == "AppendRunRecord"
    assert STRICT_COMMAND.validate_json(await seals.open(body)) == command
    reply = StoreReply(correlation_id="c-1", result={"text": WORDS}, sealed_for=ALICE)
    reply_body = await seals.encode(reply)
    assert WORDS.encode() not in reply_body
    assert StoreReply.model_validate_json(await seals.open(reply_body)) == reply


def test_the_principal_of_a_block_is_seen_inside_it_only() -> None:
    assert current_sealing_for() is None
    with sealing_for("acme", "alice"):
        assert current_sealing_for() == ALICE
        with sealing_for("acme", ""):
            assert current_sealing_for() is None
    assert current_sealing_for() is None


async def _never(_: object) -> None:
    raise AssertionError("not applied")


async def test_delivery_settles_a_forgotten_principals_message_without_a_dead_letter() -> None:
    keys = Keys()
    seals = MessageSeals(KeyClient(keys))
    body = await seals.encode(event())
    keys.forget(ALICE)
    broker = Broker()
    told: list[str] = []

    async def tell(_: bytes, reason: str) -> None:
        told.append(reason)

    message = Message(body)
    consumer = MessageSeals(KeyClient(keys))
    await Delivery(broker, RetryPolicy(attempts=2), opener=consumer).handle(
        message, EVENT, _never, on_invalid=tell
    )
    assert (message.acked, message.nacked, broker.sent) == (1, 0, [])
    assert told and "forgotten" in told[0]


async def test_words_handled_across_a_forget_are_never_sealed_again_under_a_key_made_anew() -> None:
    """A service opened a message, its principal is forgotten (and comes back, with a new key)
    while the service works on it, and its cache lets go of the old key: what it would seal from
    those words is refused and the message settled, not published under the new key."""
    keys = Keys()
    now = [0.0]
    service = MessageSeals(KeyClient(keys, ttl_s=30.0, clock=lambda: now[0]))
    broker = Broker()
    sealed_again: list[bytes] = []
    message = Message(await MessageSeals(KeyClient(keys)).encode(event()))

    async def forget_then_pass_on(payload: RunEvent) -> None:
        keys.forget(ALICE)
        await MessageSeals(KeyClient(keys)).encode(event())  # the person is back: a new key
        now[0] = 31.0  # the service's cache lets go of the old key
        sealed_again.append(await service.encode(payload.model_copy(update={"sealed_for": None})))

    await Delivery(broker, RetryPolicy(attempts=2), opener=service).handle(
        message, EVENT, forget_then_pass_on
    )
    assert (message.acked, message.nacked, broker.sent, sealed_again) == (1, 0, [], [])


async def test_words_handled_without_a_forget_are_sealed_under_their_own_key_as_before() -> None:
    keys = Keys()
    now = [0.0]
    service = MessageSeals(KeyClient(keys, ttl_s=30.0, clock=lambda: now[0]))
    passed_on: list[bytes] = []

    async def pass_on(payload: RunEvent) -> None:
        now[0] += 31.0  # a cache that expired meanwhile fetches the same key again
        passed_on.append(await service.encode(payload.model_copy(update={"sealed_for": None})))

    message = Message(await MessageSeals(KeyClient(keys)).encode(event()))
    await Delivery(Broker(), RetryPolicy(attempts=2), opener=service).handle(message, EVENT, pass_on)
    [body] = passed_on
    assert RunEvent.model_validate_json(await service.open(body)).payload == event().payload
    assert message.acked == 1


async def test_delivery_dead_letters_a_message_that_never_opens_and_retries_an_absent_key_channel() -> None:
    seals = MessageSeals(KeyClient(Keys()))
    wire = json.loads(await seals.encode(event()))
    broken = Message(json.dumps({**wire, "event_key": "other"}).encode())
    broker = Broker()
    delivery = Delivery(broker, RetryPolicy(attempts=2, base_delay_s=0), DeadLetterLimits(), opener=seals)
    await delivery.handle(broken, EVENT, _never)
    [(letter, topic, _, headers)] = broker.sent
    assert (broken.acked, topic, headers["x-dlq-reason"]) == (1, "t.commands.dlq", "unsealable")
    assert letter == broken.body  # the original sealed bytes: nothing readable is added
    assert "event_key" not in headers["x-dlq-error"]  # the error names no field values
    keys = Keys()
    waiting = Message(await MessageSeals(KeyClient(keys)).encode(event()))
    away = MessageSeals(KeyClient(keys))
    keys.away = True
    applied: list[RunEvent] = []

    async def apply(payload: RunEvent) -> None:
        applied.append(payload)

    await Delivery(broker, RetryPolicy(attempts=2, base_delay_s=0), opener=away).handle(waiting, EVENT, apply)
    assert (waiting.acked, waiting.nacked, applied) == (0, 1, [])
    keys.away = False
    await Delivery(broker, RetryPolicy(attempts=2, base_delay_s=0), opener=away).handle(waiting, EVENT, apply)
    assert (waiting.acked, applied) == (1, [event()])


def test_the_service_token_may_come_from_a_file_and_is_never_in_the_settings_repr(tmp_path: Path) -> None:
    token_file = tmp_path / "keys-token"
    token_file.write_text("s3cret-token\n")
    settings = KeySettings(url="http://127.0.0.1:1", token_file=token_file)
    assert settings.token_value == "s3cret-token"
    assert "s3cret-token" not in repr(settings)
    assert KeySettings(url="http://127.0.0.1:1").token_value == ""


def test_quipu_up_names_its_key_channel_and_keeps_the_token_to_its_user(tmp_path: Path) -> None:
    environment = local_key_channel(tmp_path)
    token_file = Path(environment["QUIPU_KEYS_TOKEN_FILE"])
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert environment["QUIPU_KEYS_URL"] == f"http://127.0.0.1:{environment['QUIPU_OWNER_KEYS_PORT']}"
    token = token_file.read_text()
    assert len(token) >= 32 and token not in "".join(environment.values())
    assert local_key_channel(tmp_path)["QUIPU_KEYS_TOKEN_FILE"] == str(token_file)
    assert token_file.read_text() != token  # fresh at every start
