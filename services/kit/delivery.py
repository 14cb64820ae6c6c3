"""At-least-once delivery: decode, apply with bounded retries, dead-letter, then commit.

Every consumer goes through `Delivery.handle`. The offset is committed only after the effect is
durable (or the message was dead-lettered with its reason); a transient failure that outlives
its retries rewinds the partition so the message comes back, never skipped.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog
from pydantic import TypeAdapter, ValidationError

from contracts.errors import StoreError
from contracts.topics import dead_letter_topic

T = TypeVar("T")

logger = structlog.get_logger(__name__)


class PermanentError(Exception):
    """Raised by an effect when the message can never succeed; it goes to the dead-letter topic."""


class RetryableError(Exception):
    """Raised by an effect when a dependency is briefly unavailable; the effect is tried again."""


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


def is_retryable(error: BaseException) -> bool:
    """Transient failures: UNAVAILABLE from the store, RetryableError, connection and timeout errors."""
    if isinstance(error, StoreError):
        return error.retryable
    return isinstance(error, RetryableError | ConnectionError | TimeoutError)


def describe(error: ValidationError) -> str:
    """A validation error without the offending input values, which may hold anything."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or '<root>'}: {item['msg']}"
        for item in error.errors(include_input=False, include_url=False)
    )


def _position(message: ConsumedMessage) -> dict[str, str]:
    raw = message.raw_message
    return {
        "topic": str(getattr(raw, "topic", "")),
        "partition": str(getattr(raw, "partition", "")),
        "offset": str(getattr(raw, "offset", "")),
    }


class Delivery:
    """Applies one consumed message at least once, with a DLQ for what can never succeed."""

    def __init__(self, dead_letter: DeadLetterPublisher, policy: RetryPolicy | None = None) -> None:
        self._dead_letter = dead_letter
        self._policy = policy or RetryPolicy()

    async def handle(
        self,
        message: ConsumedMessage,
        payload_type: TypeAdapter[T],
        effect: Callable[[T], Awaitable[None]],
        on_invalid: Callable[[bytes, str], Awaitable[None]] | None = None,
    ) -> None:
        """Decode `message` as `payload_type`, apply `effect`, and only then commit."""
        log = logger.bind(**_position(message))
        try:
            payload = payload_type.validate_json(message.body)
        except Exception as error:
            # A validator that raises something else than ValueError escapes pydantic as itself.
            if isinstance(error, ValidationError):
                detail = describe(error)
            else:
                detail = f"undecodable: {error!r}"[:500]
            log.warning("invalid message", error_type=type(error).__name__)
            if on_invalid is not None:
                await on_invalid(message.body, detail)
            await self.dead_letter(message, "invalid_payload", detail, attempts=0)
            await message.ack()
            return
        for attempt in range(1, self._policy.attempts + 1):
            try:
                await effect(payload)
            except PermanentError as error:
                log.warning("permanent failure", error=str(error))
                await self.dead_letter(message, "permanent_error", str(error), attempts=attempt)
                await message.ack()
                return
            except Exception as error:
                if not is_retryable(error):
                    # A bug does not heal by retrying; park the message where it can be replayed.
                    log.exception("unexpected failure")
                    await self.dead_letter(message, "unexpected_error", repr(error), attempts=attempt)
                    await message.ack()
                    return
                log.info("transient failure", attempt=attempt, error=str(error))
                if attempt < self._policy.attempts:
                    await asyncio.sleep(self._policy.delay(attempt))
                continue
            await message.ack()
            return
        log.warning("retries exhausted; message will be delivered again")
        await message.nack()

    async def dead_letter(self, message: ConsumedMessage, reason: str, detail: str, *, attempts: int) -> None:
        """Publish the original bytes with the error, attempts and position in headers."""
        position = _position(message)
        headers = {
            **{key: str(value) for key, value in message.headers.items()},
            "x-dlq-reason": reason,
            "x-dlq-error": detail[:4000],
            "x-dlq-attempts": str(attempts),
            **{f"x-dlq-{key}": value for key, value in position.items()},
        }
        key = getattr(message.raw_message, "key", None)
        await self._dead_letter(
            message.body, topic=dead_letter_topic(position["topic"]), key=key, headers=headers
        )
