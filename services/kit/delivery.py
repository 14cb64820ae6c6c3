"""At-least-once delivery: decode, apply with bounded retries, dead-letter, then commit.

Every consumer goes through `Delivery.handle`. The offset is committed only after the effect is
durable (or the message was dead-lettered with its reason); a transient failure that outlives
its retries rewinds the partition so the message comes back, never skipped.

Whether a failed effect is tried again is the error's to say (`is_retryable`, see
`quipu.contracts.errors`): a retryable one is tried `RetryPolicy.attempts` times, then the message
is rewound; one of Quipu's errors that is not retryable is dead-lettered at once as
`permanent_error`; any other exception is a bug, dead-lettered as `unexpected_error`.

`handle` settles every message it is given, whatever happens: no exception of any kind escapes it
(cancellation aside, which means "shutting down: deliver it again"). Dead-lettering always
completes: a dead letter that would not fit the producer's request limit carries the original
body's size and sha256 instead of the body; one the broker still refuses is retried a bounded
number of times, then sent in its smallest form (no original headers, a summary body), and if even
that fails the message is logged with its coordinates and skipped, counted in
`DeliveryCounters.skipped`. A message that cannot be dead-lettered never holds its partition.

Nothing from a message's content reaches a log line or an `x-dlq-*` header: errors are described
by `describe_error` (a validation error's field paths and error kinds, never its input values).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog
from aiokafka.errors import InvalidTopicError, KafkaError, MessageSizeTooLargeError, RecordListTooLargeError
from pydantic import ValidationError

from quipu.contracts.errors import QuipuError, StoreError, is_retryable
from quipu.contracts.sealed import SealedFor
from quipu.contracts.topics import dead_letter_topic
from quipu.services.kit.sealing import sealing_as

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

logger = structlog.get_logger(__name__)


class PermanentError(QuipuError):
    """Raised by an effect when the message can never succeed; it goes to the dead-letter topic."""


class RetryableError(QuipuError):
    """Raised by an effect when a dependency is briefly unavailable; the effect is tried again."""

    retryable = True


class MessageErasedError(QuipuError):
    """Raised when a message is sealed under a key that is gone: its principal was forgotten."""


class Opened(Protocol):
    """A consumed message opened: its plaintext, and the tag of the key it was sealed under."""

    @property
    def body(self) -> bytes:
        """The plaintext JSON."""
        ...

    @property
    def key_tag(self) -> bytes | None:
        """The sealing key's tag (None: the message was plaintext)."""
        ...


class MessageOpener(Protocol):
    """Opens a sealed message body (quipu.services.kit.keys.MessageSeals); a plaintext one comes back as is.

    Raises MessageErasedError (settled), or another QuipuError: retried when it is retryable (the
    key channel away), else dead-lettered as `unsealable`.
    """

    async def opened(self, body: bytes, /) -> Opened:
        """The plaintext JSON of `body`, and the key it was sealed under."""
        ...


class ConsumedMessage(Protocol):
    """What delivery needs from a consumed message (FastStream's KafkaMessage satisfies it)."""

    body: bytes
    headers: dict[str, Any]
    raw_message: Any

    async def ack(self) -> None:
        """Commit the offset."""
        ...

    async def nack(self) -> None:
        """Rewind so the message is delivered again."""
        ...


_FIRST_DELIVERY: contextvars.ContextVar[bool] = contextvars.ContextVar("quipu_first_delivery", default=False)


def first_delivery() -> bool:
    """Whether the message the running effect applies cannot have been handled before: its first
    attempt, of a message its consumer marked `first_delivery` (`kit.concurrent_delivery`: consumed
    past its partition's end when the partition was assigned, and not handled again after a nack).
    False outside an effect and for every other message: an effect that does without a read because
    of it (the planner's pipelined start) is only ever skipping work no earlier attempt did."""
    return _FIRST_DELIVERY.get()


class PayloadDecoder(Protocol[T_co]):
    """Decodes a message body (a pydantic `TypeAdapter`, or a stricter decoder built on one)."""

    def validate_json(self, data: bytes, /) -> T_co:
        """The decoded payload; raises (`ValidationError` for a payload that breaks the contract)."""
        ...


class DeadLetterPublisher(Protocol):
    """Publishes the original bytes to a dead-letter topic."""

    async def __call__(self, body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        """Publish one dead letter and wait for the broker's acknowledgement."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter."""

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class DeadLetterLimits:
    """What a dead letter may weigh and how long publishing one may take before it is given up."""

    max_bytes: int = 1_048_576
    """The producer's request limit (`KafkaSettings.max_request_bytes`); a bigger letter is refused."""
    attempts: int = 3
    """Tries per form of the letter (the whole one, then the smallest one) while the broker fails."""
    timeout_s: float = 10.0
    """Longest one publish may wait (aiokafka waits 40 s for the metadata of a topic it cannot find)."""
    max_original_headers_bytes: int = 16_384
    """Original headers beyond this are left off the letter (and said so in `x-dlq-headers`)."""


@dataclass
class DeliveryCounters:
    """What happened to the messages one `Delivery` handled (read by operators and tests)."""

    dead_lettered: int = 0
    bodies_omitted: int = 0
    skipped: int = 0
    """Messages settled without a dead letter, because not even the smallest letter was taken."""


_LETTER_OVERHEAD_BYTES = 512
"""Record batch and header framing on top of key, value and header bytes (generous)."""

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_OUR_ERRORS = (PermanentError, RetryableError, StoreError)
"""Errors whose messages Quipu writes itself, from identifiers and codes, never from content."""


def scrub(text: str, limit: int = 300) -> str:
    """Text from a library's error, without the quoted values in it (they may come from a message)."""
    return _QUOTED.sub("<value>", text)[:limit]


def describe(error: ValidationError) -> str:
    """A validation error without the offending input values, which may hold anything.

    Each problem is its field path and pydantic's message. Path parts that are not field names
    (a key of a free-form mapping) and the tag of an unknown union member are input, so they are
    replaced; so are quoted values in a validator's own message.
    """
    return "; ".join(
        f"{_path(item['loc'])}: {_message(item)}"
        for item in error.errors(include_input=False, include_url=False)
    )


def _path(location: tuple[int | str, ...]) -> str:
    parts = [
        str(part) if isinstance(part, int) or _FIELD_NAME.fullmatch(part) else "<key>" for part in location
    ]
    return ".".join(parts) or "<root>"


def _message(item: Mapping[str, Any]) -> str:
    if item["type"] == "union_tag_invalid":
        expected = item.get("ctx", {}).get("expected_tags", "")
        return f"the tag matches none of the expected tags: {expected}"
    return scrub(str(item["msg"]))


def describe_error(error: BaseException) -> str:
    """An error as a log line or a dead-letter header may carry it: its kind, never input values."""
    if isinstance(error, ValidationError):
        return f"ValidationError: {describe(error)}"[:4000]
    if isinstance(error, _OUR_ERRORS):
        return f"{type(error).__name__}: {error}"[:4000]
    return f"{type(error).__name__}: {scrub(str(error))}"


def _position(message: ConsumedMessage) -> dict[str, str]:
    raw = message.raw_message
    return {
        "topic": str(getattr(raw, "topic", "")),
        "partition": str(getattr(raw, "partition", "")),
        "offset": str(getattr(raw, "offset", "")),
    }


@dataclass(frozen=True)
class _Letter:
    body: bytes
    key: bytes | None
    headers: dict[str, str] = field(default_factory=dict)

    def size(self) -> int:
        headers = sum(len(name) + len(value.encode()) for name, value in self.headers.items())
        return len(self.body) + len(self.key or b"") + headers + _LETTER_OVERHEAD_BYTES


def _body_summary(body: bytes, reason: str) -> tuple[bytes, dict[str, str]]:
    """What stands in for a body too large to carry: its size and digest, and why it was parked."""
    digest = hashlib.sha256(body).hexdigest()
    summary = {"body_omitted": True, "size": len(body), "sha256": digest, "reason": reason}
    headers = {"x-dlq-body": "omitted", "x-dlq-body-size": str(len(body)), "x-dlq-body-sha256": digest}
    return json.dumps(summary).encode(), headers


class Delivery:
    """Applies one consumed message at least once, with a DLQ for what can never succeed."""

    def __init__(
        self,
        dead_letter: DeadLetterPublisher,
        policy: RetryPolicy | None = None,
        limits: DeadLetterLimits | None = None,
        opener: MessageOpener | None = None,
    ) -> None:
        self._dead_letter = dead_letter
        self._policy = policy or RetryPolicy()
        self._limits = limits or DeadLetterLimits()
        self._opener = opener
        self.counters = DeliveryCounters()

    async def handle(
        self,
        message: ConsumedMessage,
        payload_type: PayloadDecoder[T],
        effect: Callable[[T], Awaitable[None]],
        on_invalid: Callable[[bytes, str], Awaitable[None]] | None = None,
    ) -> None:
        """Decode `message` as `payload_type`, apply `effect`, and only then commit.

        Returns once the message is settled (acked, dead-lettered, skipped) or nacked to come again.
        """
        log = logger.bind(**_position(message))
        try:
            await self._handle(message, payload_type, effect, on_invalid, log)
        except Exception as error:
            # Not one of the outcomes above (a failing commit, a bug in a callback): settle it
            # anyway, so that no message is left holding its partition.
            log.error("message handling failed", error=describe_error(error))
            await self.dead_letter(message, "unexpected_error", describe_error(error), attempts=0)
            await message.ack()

    async def _handle(
        self,
        message: ConsumedMessage,
        payload_type: PayloadDecoder[T],
        effect: Callable[[T], Awaitable[None]],
        on_invalid: Callable[[bytes, str], Awaitable[None]] | None,
        log: Any,
    ) -> None:
        opened = await self._opened(message, on_invalid, log)
        if opened is None:
            return
        body, key_tag = opened
        try:
            payload = payload_type.validate_json(body)
        except Exception as error:
            # A validator that raises something else than ValueError escapes pydantic as itself.
            detail = describe(error) if isinstance(error, ValidationError) else describe_error(error)
            log.warning("invalid message", error_type=type(error).__name__)
            await self._tell_invalid(on_invalid, message.body, detail, log)
            await self.dead_letter(message, "invalid_payload", detail, attempts=0)
            await message.ack()
            return
        # What the effect writes about a sealed message is sealed for the same principal, and
        # under the same key.
        whose = getattr(payload, "sealed_for", None)
        first = bool(getattr(message, "first_delivery", False))
        for attempt in range(1, self._policy.attempts + 1):
            try:
                await _apply(effect, payload, whose, key_tag, first=first and attempt == 1)
            except MessageErasedError:
                # Its principal was forgotten while it was handled: keeping nothing is the effect.
                log.info("message of a forgotten principal settled")
                await message.ack()
                return
            except Exception as error:
                if not is_retryable(error):
                    await self._give_up(message, error, attempt, log)
                    return
                log.info("transient failure", attempt=attempt, error=describe_error(error))
                if attempt < self._policy.attempts:
                    await asyncio.sleep(self._policy.delay(attempt))
                continue
            await message.ack()
            return
        log.warning("retries exhausted; message will be delivered again")
        await message.nack()

    async def _give_up(self, message: ConsumedMessage, error: Exception, attempt: int, log: Any) -> None:
        """Dead-letter a message whose effect failed for good, then commit past it."""
        if isinstance(error, QuipuError):
            log.warning("permanent failure", error=describe_error(error))
            detail = str(error) if isinstance(error, _OUR_ERRORS) else describe_error(error)
            await self.dead_letter(message, "permanent_error", detail, attempts=attempt)
        else:
            # A bug does not heal by retrying; park the message where it can be replayed.
            log.error("unexpected failure", error=describe_error(error))
            await self.dead_letter(message, "unexpected_error", describe_error(error), attempts=attempt)
        await message.ack()

    async def _opened(
        self,
        message: ConsumedMessage,
        on_invalid: Callable[[bytes, str], Awaitable[None]] | None,
        log: Any,
    ) -> tuple[bytes, bytes | None] | None:
        """The message's plaintext (a sealed one opened) and its key's tag, or None once it is
        settled or nacked.

        A message sealed under a forgotten principal's key is settled without a dead letter (there
        is nothing left to replay; `on_invalid` still answers it); one that cannot ever open is
        dead-lettered; a key channel that does not answer is retried like a transient failure.
        """
        if self._opener is None:
            return message.body, None
        for attempt in range(1, self._policy.attempts + 1):
            try:
                opened = await self._opener.opened(message.body)
                return opened.body, opened.key_tag
            except MessageErasedError as error:
                log.info("message of a forgotten principal settled")
                await self._tell_invalid(on_invalid, message.body, str(error), log)
                await message.ack()
                return None
            except QuipuError as error:
                if not error.retryable:
                    log.warning("sealed message does not open", error=describe_error(error))
                    await self._tell_invalid(on_invalid, message.body, str(error), log)
                    await self.dead_letter(message, "unsealable", str(error), attempts=attempt)
                    await message.ack()
                    return None
                log.info("key channel unavailable", attempt=attempt, error=describe_error(error))
                if attempt < self._policy.attempts:
                    await asyncio.sleep(self._policy.delay(attempt))
        log.warning("retries exhausted; message will be delivered again")
        await message.nack()
        return None

    async def _tell_invalid(
        self, on_invalid: Callable[[bytes, str], Awaitable[None]] | None, body: bytes, detail: str, log: Any
    ) -> None:
        """The service's answer to an invalid message (a refusal reply) is a courtesy: when it fails
        or hangs (a publish waiting on metadata), the dead letter still goes out, in bounded time."""
        if on_invalid is None:
            return
        try:
            async with asyncio.timeout(self._limits.timeout_s):
                await on_invalid(body, detail)
        except Exception as error:
            log.warning("answering an invalid message failed", error=describe_error(error))

    async def dead_letter(self, message: ConsumedMessage, reason: str, detail: str, *, attempts: int) -> None:
        """Publish the original bytes with the error, attempts and position in headers.

        Always returns: when the broker refuses the letter, a smaller one is tried, and when that
        is refused too the message is logged with its coordinates and counted as skipped.
        """
        position = _position(message)
        topic = dead_letter_topic(position["topic"])
        own = {
            "x-dlq-reason": reason,
            "x-dlq-error": detail[:4000],
            "x-dlq-attempts": str(attempts),
            **{f"x-dlq-{key}": value for key, value in position.items()},
        }
        for letter in self._letters(message, reason, own):
            if await self._publish(letter, topic, position):
                self.counters.dead_lettered += 1
                return
        self.counters.skipped += 1
        logger.error(
            "dead letter refused; message skipped",
            **position,
            reason=reason,
            skipped_total=self.counters.skipped,
        )

    def _letters(self, message: ConsumedMessage, reason: str, own: dict[str, str]) -> list[_Letter]:
        """The letter with the original body and headers when it fits, then the smallest letter."""
        body = message.body or b""
        key = getattr(message.raw_message, "key", None)
        original = {str(name): str(value) for name, value in message.headers.items()}
        if sum(len(name) + len(value.encode()) for name, value in original.items()) > (
            self._limits.max_original_headers_bytes
        ):
            original = {"x-dlq-headers": "omitted"}
        whole = _Letter(body, key, {**original, **own})
        summary, summary_headers = _body_summary(body, reason)
        if whole.size() > self._limits.max_bytes:
            self.counters.bodies_omitted += 1
            whole = _Letter(summary, key, {**original, **own, **summary_headers})
        smallest_key = key if key is not None and len(key) <= 1024 else None
        smallest = _Letter(summary, smallest_key, {**own, **summary_headers, "x-dlq-headers": "omitted"})
        return [whole, smallest] if whole.size() <= self._limits.max_bytes else [smallest]

    async def _publish(self, letter: _Letter, topic: str, position: dict[str, str]) -> bool:
        """Publish with bounded tries; False when the broker would not take it."""
        for attempt in range(1, self._limits.attempts + 1):
            try:
                async with asyncio.timeout(self._limits.timeout_s):
                    await self._dead_letter(letter.body, topic=topic, key=letter.key, headers=letter.headers)
            except Exception as error:
                logger.warning(
                    "dead letter not published", **position, attempt=attempt, error=describe_error(error)
                )
                if not _may_heal(error):
                    return False
                if attempt < self._limits.attempts:
                    await asyncio.sleep(self._policy.delay(attempt))
                continue
            return True
        return False


_REFUSED_FOR_GOOD = (MessageSizeTooLargeError, RecordListTooLargeError, InvalidTopicError)
"""What the broker (or the producer) would refuse again for the same record."""


async def _apply(
    effect: Callable[[T], Awaitable[None]], payload: T, whose: object, key_tag: bytes | None, *, first: bool
) -> None:
    """One attempt of `effect`, sealed for `whose` under the key `key_tag` names when the message
    was sealed, knowing whether it is the message's first handling (`first_delivery`)."""
    marked = _FIRST_DELIVERY.set(first)
    try:
        with sealing_as(whose, key_tag) if isinstance(whose, SealedFor) else contextlib.nullcontext():
            await effect(payload)
    finally:
        _FIRST_DELIVERY.reset(marked)


def broker_may_take_again(error: KafkaError) -> bool:
    """Whether sending the same record again may work: yes, unless the record itself is refused.

    aiokafka's own `retriable` flag is no guide: it says False for `KafkaTimeoutError` (no
    metadata in time: the broker is away) and for `ProducerClosed` (shutting down).
    """
    return not isinstance(error, _REFUSED_FOR_GOOD)


def _may_heal(error: BaseException) -> bool:
    """Whether trying the same letter again could work (a broker away, a timeout), or not (too big).

    A dead letter goes out through the raw producer, so its errors are aiokafka's own.
    """
    if isinstance(error, KafkaError):
        return broker_may_take_again(error)
    return is_retryable(error)
