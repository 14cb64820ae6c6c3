"""One root for every error Quipu defines, and whether to retry decided by the error's type."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    ProducerClosed,
)
from pydantic import BaseModel, Field, TypeAdapter

import quipu
from quipu.contracts.errors import (
    ErrorBody,
    ErrorCode,
    QuipuError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
    invalid,
    is_retryable,
)
from quipu.contracts.runs import CancelRun
from quipu.deploy.local.stack import StackError
from quipu.services.domain.models.port import ModelError
from quipu.services.kit.delivery import (
    DeadLetterLimits,
    Delivery,
    PermanentError,
    RetryableError,
    RetryPolicy,
)
from quipu.services.kit.keys import OpenedMessage
from quipu.services.kit.publishing import PublishError, Queued, TopicPublisher
from quipu.services.kit.settings import KafkaSettings
from quipu.tools import ToolError

RETRIED_CODES = {ErrorCode.UNAVAILABLE}
"""STORE_CONTRACT §5: the only code whose "Retry" column says yes."""


# --- the store's codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda code: code.value)
def test_every_store_code_carries_its_retry_decision_in_its_type(code: ErrorCode) -> None:
    error = StoreError(code, "why")
    retried = code in RETRIED_CODES
    assert is_retryable(error) is error.retryable is retried
    assert type(error) is (StoreUnavailableError if retried else StoreRefusedError)
    assert (error.code, error.message, str(error)) == (code, "why", f"{code.value}: why")


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda code: code.value)
def test_a_store_error_keeps_its_decision_across_the_wire(code: ErrorCode) -> None:
    body = StoreError(code, "why").to_body()
    assert body.retryable is (code in RETRIED_CODES)
    rebuilt = StoreError.from_body(ErrorBody.model_validate_json(body.model_dump_json()))
    assert type(rebuilt) is type(StoreError(code, "why"))
    assert (rebuilt.code, rebuilt.message, rebuilt.retryable) == (code, "why", body.retryable)


def test_a_store_error_class_refuses_a_code_of_the_other_decision() -> None:
    assert isinstance(StoreRefusedError(ErrorCode.RUN_CONFLICT, "x"), StoreRefusedError)
    with pytest.raises(ValueError, match="StoreRefusedError cannot carry UNAVAILABLE"):
        StoreRefusedError(ErrorCode.UNAVAILABLE, "x")
    with pytest.raises(ValueError, match="StoreUnavailableError cannot carry INVALID_ARGUMENT"):
        StoreUnavailableError(ErrorCode.INVALID_ARGUMENT, "x")


def test_only_final_refusals_are_caught_as_refusals() -> None:
    with pytest.raises(StoreUnavailableError):
        try:
            raise StoreError(ErrorCode.UNAVAILABLE, "owner away")
        except StoreRefusedError:  # pragma: no cover - the point is that it does not match
            pytest.fail("UNAVAILABLE is no refusal")
    with pytest.raises(StoreRefusedError):
        raise invalid("limit must be positive")


# --- the rest of the tree -----------------------------------------------------------------------------


@pytest.mark.parametrize("retryable", [True, False])
def test_a_model_error_is_retried_as_its_adapter_classified_it(retryable: bool) -> None:
    assert is_retryable(ModelError("overloaded", kind="overloaded", retryable=retryable)) is retryable


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (RetryableError("the store is away"), True),
        (PermanentError("names no parent tool call"), False),
        (ToolError("nothing found"), False),
        (StackError("the broker did not start"), False),
        (QuipuError("any of ours"), False),
    ],
    ids=["retryable", "permanent", "tool", "stack", "root"],
)
def test_the_class_says_it_when_every_instance_answers_alike(error: QuipuError, retryable: bool) -> None:
    assert is_retryable(error) is retryable


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (ConnectionRefusedError(), True),
        (ValueError("bad"), False),
        (KeyError("k"), False),
        (RuntimeError("bug"), False),
        (RecursionError(), False),
    ],
    ids=["timeout", "reset", "refused", "value", "key", "runtime", "recursion"],
)
def test_an_error_no_adapter_classified_is_retried_only_for_a_lost_connection_or_a_timeout(
    error: Exception, retryable: bool
) -> None:
    assert is_retryable(error) is retryable


def _defined_exceptions() -> list[type[BaseException]]:
    """Every exception class defined at the top of a module of the project (`__main__` aside:
    importing it runs a service)."""
    found: list[type[BaseException]] = []
    # The whole import root: the public modules (`quipu.tools`, ...) and the linked folders.
    for module_info in pkgutil.walk_packages(quipu.__path__, "quipu."):
        if module_info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(module_info.name)
        found += [
            value
            for value in vars(module).values()
            if inspect.isclass(value)
            and issubclass(value, BaseException)
            and value.__module__ == module_info.name
        ]
    return found


def test_every_exception_class_the_project_defines_descends_from_the_root() -> None:
    defined = _defined_exceptions()
    assert {StoreError, ModelError, ToolError, StackError, PermanentError} <= set(defined)
    outside = sorted(
        f"{kind.__module__}.{kind.__qualname__}" for kind in defined if not issubclass(kind, QuipuError)
    )
    assert outside == [], "every exception descends from QuipuError"


# --- what the delivery wrapper does with each ------------------------------------------------------


class Job(BaseModel):
    """A test payload."""

    name: str = Field(description="A name.")


JOB = TypeAdapter(Job)


@dataclass
class Position:
    topic: str = "t.jobs"
    partition: int = 0
    offset: int = 7
    key: bytes | None = b"k"


@dataclass
class Consumed:
    body: bytes = b'{"name": "n"}'
    headers: dict[str, Any] = field(default_factory=dict)
    raw_message: Position = field(default_factory=Position)
    acked: int = 0
    nacked: int = 0

    async def ack(self) -> None:
        self.acked += 1

    async def nack(self) -> None:
        self.nacked += 1


@dataclass
class Outcome:
    tries: int
    acked: int
    nacked: int
    letters: list[dict[str, str]]


async def _deliver(error: Exception) -> Outcome:
    letters: list[dict[str, str]] = []
    tries = 0

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        letters.append(headers)

    async def effect(_: Job) -> None:
        nonlocal tries
        tries += 1
        raise error

    message = Consumed()
    await Delivery(dead_letter, RetryPolicy(attempts=3, base_delay_s=0.0)).handle(message, JOB, effect)
    return Outcome(tries, message.acked, message.nacked, letters)


@pytest.mark.parametrize(
    "error",
    [
        StoreError(ErrorCode.UNAVAILABLE, "owner away"),
        ModelError("overloaded", kind="overloaded", retryable=True),
        RetryableError("the broker is away"),
        TimeoutError(),
        ConnectionResetError(),
    ],
    ids=["store unavailable", "model overloaded", "retryable", "timeout", "connection"],
)
async def test_a_retryable_failure_is_tried_again_then_delivered_again_never_dead_lettered(
    error: Exception,
) -> None:
    outcome = await _deliver(error)
    assert (outcome.tries, outcome.acked, outcome.nacked, outcome.letters) == (3, 0, 1, [])


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (StoreError(ErrorCode.RUN_CONFLICT, "start differs"), "RUN_CONFLICT: start differs"),
        (PermanentError("names no parent tool call"), "names no parent tool call"),
        (ModelError("bad request", kind="invalid_request", retryable=False), "ModelError: bad request"),
    ],
    ids=["store refusal", "permanent", "model refusal"],
)
async def test_one_of_our_errors_that_may_not_be_retried_is_dead_lettered_at_once_as_permanent(
    error: Exception, detail: str
) -> None:
    outcome = await _deliver(error)
    assert (outcome.tries, outcome.acked, outcome.nacked) == (1, 1, 0)
    [letter] = outcome.letters
    assert (letter["x-dlq-reason"], letter["x-dlq-error"], letter["x-dlq-attempts"]) == (
        "permanent_error",
        detail,
        "1",
    )


async def test_an_unclassified_error_is_a_bug_dead_lettered_at_once_as_unexpected() -> None:
    outcome = await _deliver(LookupError("no such thing"))
    assert (outcome.tries, outcome.acked, outcome.nacked) == (1, 1, 0)
    [letter] = outcome.letters
    assert (letter["x-dlq-reason"], letter["x-dlq-error"]) == (
        "unexpected_error",
        "LookupError: no such thing",
    )


# --- a library's errors, classified where the library is called --------------------------------------


class FailingSend:
    """A producer's send that fails `failures` times with `error`, then takes every record."""

    def __init__(self, error: Exception, failures: int = 1_000) -> None:
        self.error = error
        self.failures = failures
        self.taken: list[str] = []

    async def __call__(
        self, topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Queued:
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        self.taken.append(topic)
        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        taken.set_result(None)
        return Queued(taken, ())


def _publisher(send: FailingSend) -> TopicPublisher:
    return TopicPublisher(KafkaSettings(bootstrap="127.0.0.1:9", topic_prefix="p."), send)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (KafkaConnectionError(), True),
        (KafkaTimeoutError(), True),  # aiokafka's `retriable` says False: no metadata in time
        (NotLeaderForPartitionError(), True),
        (ProducerClosed(), True),  # shutting down: the message comes again after the restart
        (MessageSizeTooLargeError(), False),
        (InvalidTopicError(), False),
    ],
    ids=["connection", "metadata timeout", "leader moved", "producer closed", "too large", "invalid topic"],
)
async def test_the_broker_not_taking_a_message_is_a_publish_error_that_says_whether_to_retry(
    error: Exception, retryable: bool
) -> None:
    with pytest.raises(PublishError) as raised:
        await _publisher(FailingSend(error)).publish(CancelRun(run_id="r-1", session_id="s-1"))
    assert is_retryable(raised.value) is retryable
    assert raised.value.topic == "p.runs.control"
    assert str(raised.value) == f"publishing to p.runs.control failed: {type(error).__name__}"
    assert raised.value.__cause__ is error


async def test_an_effect_whose_publish_meets_a_broker_blip_is_tried_again_not_dead_lettered() -> None:
    send = FailingSend(KafkaConnectionError(), failures=1)
    publisher = _publisher(send)
    letters: list[dict[str, str]] = []

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        letters.append(headers)

    async def effect(job: Job) -> None:
        await publisher.publish(CancelRun(run_id=job.name, session_id="s-1"))

    message = Consumed()
    await Delivery(dead_letter, RetryPolicy(attempts=3, base_delay_s=0.0)).handle(message, JOB, effect)
    assert (send.taken, letters, message.acked, message.nacked) == (["p.runs.control"], [], 1, 0)


async def test_a_dead_letter_the_broker_did_not_take_in_time_is_sent_again_whole() -> None:
    letters: list[tuple[bytes, dict[str, str]]] = []
    failures = [KafkaTimeoutError()]  # aiokafka calls it not retriable; the broker was only slow

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        if failures:
            raise failures.pop()
        letters.append((body, headers))

    async def effect(_: Job) -> None:
        raise PermanentError("names no parent tool call")

    message = Consumed(headers={"trace": "t-1"})
    policy = RetryPolicy(attempts=1, base_delay_s=0.0)
    await Delivery(dead_letter, policy, DeadLetterLimits(attempts=3)).handle(message, JOB, effect)
    [(body, headers)] = letters
    assert (body, headers["trace"], message.acked) == (message.body, "t-1", 1)


class Opener:
    """A message opener whose key channel fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.tries = 0

    async def opened(self, body: bytes, /) -> OpenedMessage:
        self.tries += 1
        raise self.error


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (StoreError(ErrorCode.UNAVAILABLE, "owner away"), True),
        (RetryableError("the key channel is away"), True),
        (StoreError(ErrorCode.INVALID_ARGUMENT, "no such key"), False),
        (PermanentError("altered"), False),
    ],
    ids=["store unavailable", "retryable", "store refusal", "permanent"],
)
async def test_a_sealed_message_that_cannot_be_opened_yet_is_retried_as_the_error_says(
    error: Exception, retried: bool
) -> None:
    letters: list[dict[str, str]] = []

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        letters.append(headers)

    opener = Opener(error)
    message = Consumed()
    delivery = Delivery(dead_letter, RetryPolicy(attempts=3, base_delay_s=0.0), opener=opener)
    await delivery.handle(message, JOB, _never_called)
    if retried:
        assert (opener.tries, message.nacked, message.acked, letters) == (3, 1, 0, [])
    else:
        [letter] = letters
        assert (opener.tries, message.acked, letter["x-dlq-reason"]) == (1, 1, "unsealable")


async def _never_called(_: Job) -> None:
    raise AssertionError("a message that did not open is never applied")
