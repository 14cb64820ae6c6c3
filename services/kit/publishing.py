"""The one way a service publishes: any registry payload, to its topic, with its key.

    publisher = broker_publisher(broker, settings)       # on the service's FastStream broker
    publisher = producer_publisher(producer, settings)   # or on a plain aiokafka producer
    await publisher.publish(ToolCallRequested(...))      # tools.calls, keyed by the run id

The topic follows from the payload's type alone and the key from the registry's key function
(`quipu.contracts.topics`); the deployment's prefix comes from `KafkaSettings`. A message never
chooses where it goes: the only routes a caller adds are ones its own configuration gives it
(the owner's reply partition, a store client's reply-partition header). A contract test checks
that nothing else in the services sends to Kafka.

Every record sent is told to kit.fetch_pace (`published`, with the partition and offset the
broker acknowledged): a consumer of this process holding that partition fetches it at once, and
no other consumer of the process wakes for it.

This is where aiokafka's errors meet Quipu's: the broker's refusal is a `PublishError`, retryable
unless resending the same record must be refused the same way (too large, an invalid topic
name; `broker_may_take_again`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from quipu.contracts.errors import QuipuError
from quipu.contracts.topics import UnroutablePayloadError, spec_for
from quipu.services.kit import fetch_pace
from quipu.services.kit.delivery import broker_may_take_again
from quipu.services.kit.handover import HandedRecord
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.producers import Producer
from quipu.services.kit.settings import KafkaSettings


class PublishError(QuipuError):
    """Raised when the broker did not take a message; retryable unless the record itself is refused.

    The message names the topic and the library's error type, never the record.
    """

    def __init__(self, topic: str, error: KafkaError) -> None:
        super().__init__(f"publishing to {topic} failed: {type(error).__name__}")
        self.topic = topic
        self.retryable = broker_may_take_again(error)


@dataclass(frozen=True)
class Queued:
    """A record the producer took: what resolves to the broker's `RecordMetadata` (where it put
    the record) once the broker has taken it, and the headers the record carries there."""

    acknowledged: Awaitable[object]
    headers: tuple[tuple[str, bytes], ...]


class Send(Protocol):
    """Hands one record to the producer and returns once it is queued (`Queued`). Records of one
    partition are sent in the order they were queued."""

    def __call__(
        self, topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Awaitable[Queued]: ...


@dataclass(frozen=True)
class Outgoing:
    """One message of a `TopicPublisher.publish_together`, with its routes (from the caller's
    configuration, as `publish`'s)."""

    message: BaseModel
    partition: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    within: str | None = None


@dataclass(frozen=True)
class _Sent:
    """What a record carries to the broker."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]

    def acknowledged(self, where: RecordMetadata) -> HandedRecord | None:
        """The record as the broker keeps it (None when the broker told no create time)."""
        if where.timestamp is None or where.timestamp < 0:
            return None
        return HandedRecord(self.key, self.value, self.headers, where.timestamp)


class TopicPublisher:
    """Publishes registry payloads through one producer, within one deployment's topics."""

    def __init__(self, settings: KafkaSettings, send: Send, seals: MessageSeals | None = None) -> None:
        """`seals` seal the words of payloads that name `sealed_for` (quipu.contracts.sealed)."""
        self._prefix = settings.topic_prefix
        self._send = send
        # Handed to a consumer of this process only once every in-sync replica has it (kit.handover).
        self._hand = settings.acks == "all"
        self._seals = seals or MessageSeals(None)

    def topic_of(self, message: BaseModel) -> str:
        """The physical topic `message` goes to (UnroutablePayloadError when no topic carries it)."""
        return self._prefix + spec_for(message).topic.value

    async def publish(
        self,
        message: BaseModel,
        *,
        partition: int | None = None,
        headers: Mapping[str, str] | None = None,
        within: str | None = None,
    ) -> None:
        """Send `message` to its topic with its key and wait for the broker's acknowledgement
        (PublishError when it did not take it).

        `partition`, `headers` and `within` are routes from the caller's configuration, never from
        a message. `within` names one of the payload topic's own family instead of the topic
        itself (`tools.calls.<toolset>` for a `tools.calls` payload, from the toolset registry);
        a name outside that family is an UnroutablePayloadError.
        """
        await self.publish_together([Outgoing(message, partition, headers or {}, within)])

    async def publish_together(self, messages: Sequence[Outgoing]) -> None:
        """Send every one of `messages` and wait for all the broker's acknowledgements (PublishError:
        the first one it did not take; the others may have gone).

        All are sealed before any is sent, and queued in their order before any acknowledgement
        is awaited: those of one partition keep that order, and one produce request can carry them
        all (a command's reply and what its commit justifies wait for one round trip, not one each).
        """
        await (await self.queue_together(messages))

    async def queue(
        self,
        message: BaseModel,
        *,
        partition: int | None = None,
        headers: Mapping[str, str] | None = None,
        within: str | None = None,
    ) -> Awaitable[None]:
        """Queue `message` as `publish` sends it, without waiting for the broker: returns once it
        is queued (behind every message this publisher queued before it), with what waits for
        its acknowledgement (PublishError when the broker did not take it). Await that before
        anything that must follow the message from another producer."""
        return await self.queue_together([Outgoing(message, partition, headers or {}, within)])

    async def queue_together(self, messages: Sequence[Outgoing]) -> Awaitable[None]:
        """`publish_together` without the wait: every one of `messages` sealed, then queued in
        order; returns with what waits for all their acknowledgements (PublishError: the first
        refusal, at once when the producer refused one as it was queued: none after it is sent)."""
        specs = [spec_for(each.message) for each in messages]
        topics = [
            self._prefix + _family_member(spec.topic.value, each.within)
            for spec, each in zip(specs, messages, strict=True)
        ]
        bodies = [await self._seals.encode(each.message) for each in messages]  # KeyUnavailableError
        queued: list[Awaitable[object]] = []
        records: list[_Sent] = []
        refused: tuple[str, KafkaError] | None = None
        for topic, spec, each, body in zip(topics, specs, messages, bodies, strict=True):
            key = spec.key_for(each.message)
            try:
                taken = await self._send(topic, body, key=key, partition=each.partition, headers=each.headers)
            except KafkaError as error:
                refused = (topic, error)
                break
            queued.append(taken.acknowledged)
            records.append(_Sent(key, body, taken.headers))
            if each.partition is not None:
                fetch_pace.sent(topic, each.partition, body)
        return asyncio.ensure_future(_acknowledged(topics, queued, records, refused, hand=self._hand))


def taken() -> Awaitable[None]:
    """What `queue` returns for a message already taken (or never sent): nothing to wait for."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


async def all_taken(acknowledgements: Sequence[Awaitable[None]]) -> None:
    """Wait for every one of `acknowledgements` (from `queue`): the first failure is raised once
    all are settled, so none is left behind unawaited."""
    results = await asyncio.gather(*acknowledgements, return_exceptions=True)
    failure = next((result for result in results if isinstance(result, BaseException)), None)
    if failure is not None:
        raise failure


async def _acknowledged(
    topics: Sequence[str],
    queued: Sequence[Awaitable[object]],
    records: Sequence[_Sent],
    refused: tuple[str, KafkaError] | None,
    *,
    hand: bool,
) -> None:
    """Wait for every acknowledgement of `queued` (`records` sent to `topics`, in order); each
    record taken is reported to the process's fetch pace, with what was sent when it may be
    handed over (`hand`); the first refusal (`refused`: the producer's, as the records were
    queued) is raised once all are settled."""
    failure: tuple[str, BaseException] | None = refused
    results = await asyncio.gather(*queued, return_exceptions=True)
    for topic, sent, record in zip(topics, results, records, strict=False):
        if isinstance(sent, RecordMetadata):
            handed = record.acknowledged(sent) if hand else None
            fetch_pace.published(sent.topic, sent.partition, sent.offset, handed)
        elif isinstance(sent, BaseException) and failure is None:
            failure = (topic, sent)
    if failure is not None:
        topic, error = failure
        if isinstance(error, KafkaError):
            raise PublishError(topic, error) from error
        raise error


def _family_member(topic: str, within: str | None) -> str:
    if within is None or within == topic:
        return topic
    if not within.startswith(topic + ".") or within.endswith(".dlq"):
        raise UnroutablePayloadError(f"{within!r} is not a topic of the {topic} family")
    return within


def broker_publisher(
    broker: KafkaBroker, settings: KafkaSettings, seals: MessageSeals | None = None
) -> TopicPublisher:
    """A `TopicPublisher` on a service's FastStream broker."""

    async def send(
        topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Queued:
        correlation_id = str(uuid.uuid4())
        acknowledged = await broker.publish(
            body,
            topic=topic,
            key=key,
            partition=partition,
            headers=dict(headers) or None,
            correlation_id=correlation_id,
            no_confirm=True,
        )
        # What FastStream puts on the record: a content type (none for bytes), the correlation id,
        # then the caller's headers.
        sent = {"content-type": "", **({"correlation_id": correlation_id} | dict(headers))}
        return Queued(acknowledged, tuple((name, value.encode()) for name, value in sent.items()))

    return TopicPublisher(settings, send, seals)


def producer_publisher(
    producer: Producer, settings: KafkaSettings, seals: MessageSeals | None = None
) -> TopicPublisher:
    """A `TopicPublisher` on a started producer (clients without a FastStream broker)."""

    async def send(
        topic: str, body: bytes, *, key: bytes | None, partition: int | None, headers: Mapping[str, str]
    ) -> Queued:
        encoded = tuple((name, value.encode()) for name, value in headers.items())
        acknowledged: Awaitable[RecordMetadata] = await producer.send(
            topic, body, key=key, partition=partition, headers=list(encoded) or None
        )
        return Queued(acknowledged, encoded)

    return TopicPublisher(settings, send, seals)
