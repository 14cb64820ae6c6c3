"""Delivery: every message is settled, every dead letter goes out (or is counted), no input leaks."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from quipu.services.kit.delivery import (
    DeadLetterLimits,
    Delivery,
    PermanentError,
    RetryableError,
    RetryPolicy,
    describe_error,
    first_delivery,
)
from tests.support.consumed import Message

SECRET_INPUT = "tell-no-one-7f3a"
"""A value that only ever appears inside test messages: it must never reach a header or a log."""


class Create(BaseModel):
    """A test command."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["create"] = Field(description="Tag.")
    name: str = Field(description="A name.")
    labels: dict[str, int] = Field(default_factory=dict, description="Free-form keys.")


class Drop(BaseModel):
    """Another test command."""

    op: Literal["drop"] = Field(description="Tag.")


COMMAND: TypeAdapter[Create | Drop] = TypeAdapter(Annotated[Create | Drop, Field(discriminator="op")])


@dataclass
class Broker:
    """A dead-letter publisher with a request limit, like aiokafka's producer."""

    max_bytes: int = 1_048_576
    refuse_all: bool = False
    away_for: int = 0
    sent: list[tuple[bytes, str, bytes | None, dict[str, str]]] = field(default_factory=list)
    tries: int = 0

    async def __call__(self, body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        self.tries += 1
        if self.away_for > 0:
            self.away_for -= 1
            raise KafkaConnectionError("the broker is away")
        size = len(body) + len(key or b"") + sum(len(k) + len(v) for k, v in headers.items())
        if self.refuse_all or size > self.max_bytes:
            raise MessageSizeTooLargeError(f"the message is {size} bytes")
        self.sent.append((body, topic, key, headers))


async def _nothing(_: object) -> None:
    return None


def _delivery(broker: Broker, **limits: Any) -> Delivery:
    return Delivery(broker, RetryPolicy(attempts=2, base_delay_s=0.001), DeadLetterLimits(**limits))


async def test_a_body_too_big_for_the_producer_is_dead_lettered_as_its_size_and_digest() -> None:
    body = b'{"op": "create", "name": "' + b"a" * (5 * 1024 * 1024) + b'"'  # 5 MB and truncated
    broker = Broker()
    delivery = _delivery(broker, max_bytes=broker.max_bytes)
    message = Message(body, headers={"reply-to": "t.replies"})
    await delivery.handle(message, COMMAND, _nothing)
    [(letter, topic, key, headers)] = broker.sent
    assert topic == "t.commands.dlq"
    assert key == b"session-1"
    summary = json.loads(letter)
    assert summary["size"] == len(body)
    assert summary["sha256"] == hashlib.sha256(body).hexdigest()
    assert summary["reason"] == "invalid_payload"
    assert headers["x-dlq-body"] == "omitted"
    assert headers["x-dlq-body-sha256"] == hashlib.sha256(body).hexdigest()
    assert headers["x-dlq-reason"] == "invalid_payload"
    assert (headers["x-dlq-partition"], headers["x-dlq-offset"]) == ("3", "42")
    assert headers["reply-to"] == "t.replies", "original headers are kept when they fit"
    assert message.acked == 1
    assert delivery.counters.bodies_omitted == 1


async def test_a_body_that_fits_is_dead_lettered_as_it_is() -> None:
    broker = Broker()
    message = Message(b"{not json")
    await _delivery(broker).handle(message, COMMAND, _nothing)
    [(letter, _, _, headers)] = broker.sent
    assert letter == b"{not json"
    assert "x-dlq-body" not in headers
    assert message.acked == 1


async def test_huge_original_headers_are_left_off_the_letter() -> None:
    broker = Broker(max_bytes=200_000)
    message = Message(b"[]", headers={"trace": "x" * 500_000})
    await _delivery(broker, max_bytes=200_000).handle(message, COMMAND, _nothing)
    [(letter, _, _, headers)] = broker.sent
    assert letter == b"[]"
    assert "trace" not in headers
    assert headers["x-dlq-headers"] == "omitted"


async def test_a_letter_the_broker_refuses_for_good_goes_out_in_its_smallest_form() -> None:
    # The producer's limit is lower than the one delivery was told: the whole letter is refused.
    broker = Broker(max_bytes=2_000)
    message = Message(b"[" + b"1," * 5_000 + b"1]", headers={"reply-to": "t.replies"})
    await _delivery(broker, max_bytes=1_048_576).handle(message, COMMAND, _nothing)
    [(letter, _, _, headers)] = broker.sent
    assert json.loads(letter)["size"] == len(message.body)
    assert headers["x-dlq-headers"] == "omitted"
    assert "reply-to" not in headers
    assert broker.tries == 2, "a permanent refusal is not retried: the smaller letter comes next"
    assert message.acked == 1


async def test_a_message_no_dead_letter_can_carry_is_skipped_and_counted() -> None:
    broker = Broker(refuse_all=True)
    delivery = _delivery(broker, attempts=2)
    first, second = Message(b"{"), Message(b"[")
    await delivery.handle(first, COMMAND, _nothing)
    await delivery.handle(second, COMMAND, _nothing)
    assert broker.sent == []
    assert (first.acked, second.acked) == (1, 1), (
        "a message that cannot be parked must not hold its partition"
    )
    assert delivery.counters.skipped == 2


async def test_a_broker_briefly_away_gets_bounded_tries_of_the_same_letter() -> None:
    broker = Broker(away_for=2)
    message = Message(b"{")
    await _delivery(broker, attempts=3).handle(message, COMMAND, _nothing)
    [(letter, _, _, _)] = broker.sent
    assert letter == b"{"
    assert broker.tries == 3


async def test_a_broker_away_for_good_ends_in_a_skip_not_a_loop() -> None:
    broker = Broker(away_for=10_000)
    delivery = _delivery(broker, attempts=3)
    message = Message(b"{")
    await delivery.handle(message, COMMAND, _nothing)
    assert broker.tries == 6, "three tries of the whole letter, three of the smallest"
    assert message.acked == 1
    assert delivery.counters.skipped == 1


async def test_a_failing_refusal_reply_does_not_stop_the_dead_letter() -> None:
    async def refuse(_body: bytes, _reason: str) -> None:
        raise ValueError(f"'{SECRET_INPUT}' is not a valid topic name")

    broker = Broker()
    message = Message(b'{"op": "create"}')
    await _delivery(broker).handle(message, COMMAND, _nothing, on_invalid=refuse)
    assert len(broker.sent) == 1
    assert message.acked == 1


@pytest.mark.parametrize(
    "error",
    [
        RecursionError("maximum recursion depth exceeded"),
        ValueError(f"'{SECRET_INPUT}' is not a valid topic name"),
        KeyError(SECRET_INPUT),
    ],
    ids=["recursion", "value error", "key error"],
)
async def test_an_effect_failing_with_any_error_is_dead_lettered_without_its_input(
    error: Exception,
) -> None:
    async def effect(_: object) -> None:
        raise error

    broker = Broker()
    message = Message(b'{"op": "drop"}')
    await _delivery(broker).handle(message, COMMAND, effect)
    [(_, _, _, headers)] = broker.sent
    assert headers["x-dlq-reason"] == "unexpected_error"
    assert type(error).__name__ in headers["x-dlq-error"]
    assert SECRET_INPUT not in json.dumps(headers)
    assert message.acked == 1


async def test_a_failing_ack_still_leaves_the_message_settled() -> None:
    class FailingAck(Message):
        async def ack(self) -> None:
            self.acked += 1
            if self.acked == 1:
                raise RuntimeError("commit failed")

    broker = Broker()
    message = FailingAck(b'{"op": "drop"}')
    await _delivery(broker).handle(message, COMMAND, _nothing)
    assert message.acked == 2


async def test_permanent_errors_keep_their_own_message() -> None:
    async def effect(_: object) -> None:
        raise PermanentError("run r-1 names no parent tool call")

    broker = Broker()
    await _delivery(broker).handle(Message(b'{"op": "drop"}'), COMMAND, effect)
    [(_, _, _, headers)] = broker.sent
    assert headers["x-dlq-error"] == "run r-1 names no parent tool call"


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"op": SECRET_INPUT}).encode(),  # a discriminator tag that is no member
        json.dumps({"op": "create", "name": 7, "labels": {SECRET_INPUT: "x"}}).encode(),
        json.dumps({"op": "create", "name": {"deep": SECRET_INPUT}}).encode(),
        json.dumps({"op": "create", "name": "n", SECRET_INPUT: 1}).encode(),
    ],
    ids=["unknown tag", "free-form key", "wrong type", "extra field"],
)
async def test_validation_errors_name_fields_and_kinds_never_input_values(body: bytes) -> None:
    broker = Broker()
    await _delivery(broker).handle(Message(body), COMMAND, _nothing)
    [(_, _, _, headers)] = broker.sent
    assert headers["x-dlq-error"]
    assert SECRET_INPUT not in headers["x-dlq-error"]


def test_describe_error_keeps_the_kind_and_drops_quoted_values() -> None:
    described = describe_error(ValueError(f"'{SECRET_INPUT}' is not a valid topic name"))
    assert described.startswith("ValueError: ")
    assert "is not a valid topic name" in described
    assert SECRET_INPUT not in described


async def test_a_refusal_reply_that_hangs_is_given_up_at_the_dead_letter_timeout() -> None:
    async def hang(_body: bytes, _reason: str) -> None:
        await asyncio.Event().wait()  # a publish waiting on metadata for a topic that never appears

    broker = Broker()
    message = Message(b'{"op": "create"}')
    await _delivery(broker, timeout_s=0.05).handle(message, COMMAND, _nothing, on_invalid=hang)
    assert len(broker.sent) == 1
    assert message.acked == 1


@pytest.mark.parametrize("marked", [True, False])
async def test_only_the_first_attempt_of_a_message_marked_first_is_a_first_delivery(marked: bool) -> None:
    seen: list[bool] = []

    async def effect(_: object) -> None:
        seen.append(first_delivery())
        if len(seen) == 1:
            raise RetryableError("briefly away")  # tried again in process: it may have done something

    message = Message(b'{"op": "drop"}', first_delivery=marked)
    await _delivery(Broker()).handle(message, COMMAND, effect)
    assert seen == [marked, False]
    assert message.acked == 1
    assert not first_delivery()  # outside an effect
