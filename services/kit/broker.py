"""The one way every service builds its FastStream Kafka broker and subscribes.

    settings = KafkaSettings()                       # or KafkaSettings.for_embedded(...)
    broker = make_broker(settings, client_id="planner")

    @broker.subscriber(
        topic(settings, Topic.RUNS_REQUESTED),
        **subscriber_options(settings, group="planner"),
    )
    async def on_run_requested(request: RunRequested) -> None: ...

Why not FastStream's defaults (PLATFORM_NOTES):

- FastStream's default ack policy for Kafka is `ACK_FIRST`: the offset is
  committed before the handler runs, so a crash loses the message. Here the
  offset is committed after the handler returns (`AckPolicy.ACK`), or by the
  delivery wrapper (`AckPolicy.MANUAL`). The broker default is set to `ACK`
  too, as a backstop, but always pass `subscriber_options`.
- Fetch wait, session timeout, heartbeat and offset reset come from
  `KafkaSettings`, which holds the right values for Tansu and for real Kafka. A consumer no
  caller waits on (`follow_from_start`, `KafkaSettings.in_background`) fetches less often.
- FastStream starts subscribers one after another, and a consumer-group join
  takes at least a second on Tansu (and a rebalance round on Kafka): eight
  subscribers took 8 s to start. The broker built here starts them
  concurrently (1 s for eight).
- FastStream builds a producer per broker; the broker built here publishes through the
  process's producer instead (`quipu.services.kit.producers`), so the records of every
  service in a process share produce requests.
- FastStream's own access logger writes formatted text to stdout and does not
  propagate; the broker gets a standard logger instead, so its lines go
  through `quipu.services.kit.logging` (JSON, redaction) like everything else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, TypedDict, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faststream._internal.context import Context
from faststream._internal.parser import DefaultCodec
from faststream._internal.utils.data import filter_by_dict
from faststream.kafka import KafkaBroker
from faststream.kafka.message import KafkaMessage as ConsumedRecord
from faststream.kafka.schemas.params import ConsumerConnectionParams
from faststream.middlewares import AckPolicy

from quipu.services.kit.delivery import DeadLetterLimits, Delivery, MessageOpener, RetryPolicy
from quipu.services.kit.producers import shared_producer
from quipu.services.kit.settings import KafkaSettings

BROKER_LOGGER_NAME = "quipu.faststream"
"""Standard logger FastStream writes its 'Received'/'Processed' lines to."""


class _InLoopContext(Context):
    """FastStream's `Context` resolved on the event loop. fast_depends runs a custom field's `use`
    in a worker thread unless it is a coroutine function, and FastStream's is not: with
    `KafkaMessage` every message a handler took cost a thread hop (~80 us of CPU, and the worker
    thread's wake-ups beside the loop) to look up a value the loop already holds."""

    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        resolved: dict[str, Any] = super().use(**kwargs)
        return resolved


InLoopKafkaMessage = Annotated[ConsumedRecord, _InLoopContext("message")]
"""The consumed message as a handler's parameter: `KafkaMessage`, resolved without a thread hop."""


class ConcurrentStartKafkaBroker(KafkaBroker):
    """A `KafkaBroker` whose `start()` starts every subscriber at once instead of in turn, and
    which publishes through the process's producer (`producers.shared_producer`) when `settings`
    share it."""

    def __init__(self, *args: Any, settings: KafkaSettings | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._producer_settings = settings

    async def _connect(self) -> Callable[..., AIOKafkaConsumer]:
        settings, config = self._producer_settings, self.config.broker_config
        if settings is None or not settings.share_producer or config.consumer_only:
            return await super()._connect()
        # FastStream 0.7's KafkaBrokerConfig.connect, but with a lease of the process's producer
        # where it builds a producer of its own; a broker test covers this.
        lease = cast(AIOKafkaProducer, shared_producer(settings, settings.client_id))
        codec = config.broker_codec or DefaultCodec()
        await config.producer.connect(lease, serializer=config.fd_config._serializer, codec=codec)
        await config.admin.connect(**self._connection_kwargs)
        consumer_options, _ = filter_by_dict(ConsumerConnectionParams, self._connection_kwargs)
        config.builder = functools.partial(AIOKafkaConsumer, **consumer_options)
        return config.builder

    async def start(self) -> None:
        """Connect, start all subscribers concurrently, then the publishers."""
        # Same steps as KafkaBroker.start / BrokerUsecase.start (faststream 0.7), but the
        # group joins overlap. faststream is pinned below 0.8; a broker test covers this.
        await self.connect()
        await asyncio.gather(*(subscriber.start() for subscriber in self.subscribers))
        for publisher in self.publishers:
            await publisher.start()
        self.running = True


async def tolerant_parser(record: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream's parser, but a header that is not UTF-8 cannot stop the message.

    FastStream decodes every header strictly before any handler runs; a producer's stray bytes
    would then fail the message outside the delivery wrapper, where no DLQ catches it.
    """
    try:
        return await original(record)
    except UnicodeDecodeError:
        headers = [(key, value.decode("utf-8", "replace").encode()) for key, value in record.headers]
        readable = dataclasses.replace(record, headers=headers)
        if hasattr(record, "consumer"):
            readable.consumer = record.consumer
        return await original(readable)


async def raw_decoder(message: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """JSON when the body is JSON, else the raw bytes; never an exception.

    Handlers that take the message decode it themselves (through `Delivery`); FastStream's own
    decoder raised on a truncated body labelled `application/json` or on deeply nested JSON,
    before any handler or DLQ could see the message.
    """
    try:
        return json.loads(message.body)
    except (ValueError, RecursionError):
        return message.body


class SubscriberOptions(TypedDict):
    """Keyword arguments for `KafkaBroker.subscriber`, the same for every service."""

    group_id: str
    auto_offset_reset: Literal["latest", "earliest"]
    fetch_max_wait_ms: int
    consumer_timeout_ms: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    ack_policy: AckPolicy
    no_reply: bool


def topic(settings: KafkaSettings, name: str) -> str:
    """The physical name of a registry topic (`Topic.X`, `Topic.X.dlq` or a string)."""
    return settings.topic_prefix + str(name)


def group_id(settings: KafkaSettings, name: str) -> str:
    """The physical consumer group id: prefixed like topics, so isolated tests never share one."""
    return settings.topic_prefix + name


def make_broker(
    settings: KafkaSettings,
    *,
    client_id: str | None = None,
    log_level: int = logging.DEBUG,
    graceful_timeout: float | None = 15.0,
) -> KafkaBroker:
    """A FastStream Kafka broker configured from `settings`.

    `client_id` defaults to `settings.client_id` (pass the service name).
    `log_level` is the level of FastStream's per-message 'Received/Processed'
    lines: DEBUG, because at INFO they would dominate the logs of a busy
    service; handlers log their own outcome with identifiers.
    `graceful_timeout` is how long `stop()` waits for running handlers.
    """
    return ConcurrentStartKafkaBroker(
        settings.bootstrap,
        settings=settings,
        client_id=client_id or settings.client_id,
        acks=settings.acks,
        enable_idempotence=settings.enable_idempotence,
        max_request_size=settings.max_request_bytes,
        ack_policy=AckPolicy.ACK,
        graceful_timeout=graceful_timeout,
        logger=logging.getLogger(BROKER_LOGGER_NAME),
        log_level=log_level,
        # Every subscriber: headers that are not UTF-8 and bodies FastStream cannot decode reach
        # the handler (and so the delivery wrapper and its DLQ) instead of failing before it.
        parser=tolerant_parser,
        decoder=raw_decoder,
    )


def follow_from_start(
    broker: KafkaBroker,
    settings: KafkaSettings,
    names: Sequence[str],
    handle: Callable[[InLoopKafkaMessage], Awaitable[None]],
) -> None:
    """Subscribe `handle` (its parameter an `InLoopKafkaMessage`) to every partition of the topics
    `names` (one consumer), outside any group, from the beginning.

    For a topic every copy of a service must see whole (cancels, the toolset registry): a group
    would hand each message to one copy only. Outside a group there is nothing to commit, so the
    offsets are never stored and each start replays the topic. No caller waits on such a topic,
    so it is fetched with the background wait (`KafkaSettings.background_fetch_max_wait_ms`).
    """
    broker.subscriber(
        *(topic(settings, name) for name in names),
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.background_fetch_max_wait_ms,
        consumer_timeout_ms=settings.consumer_timeout_ms,
        ack_policy=AckPolicy.MANUAL,
        no_reply=True,  # a `reply_to` header must not make FastStream publish anywhere
    )(handle)


def subscriber_options(
    settings: KafkaSettings,
    *,
    group: str,
    ack_policy: AckPolicy = AckPolicy.ACK,
) -> SubscriberOptions:
    """Subscriber keyword arguments: consumer group `group` (prefixed) and the client settings.

    `ack_policy` is `ACK` (commit after the handler returns, even when it
    raised: the delivery wrapper decides retries and the DLQ) or `MANUAL` (the
    handler commits). `ACK_FIRST` (at-most-once) and `NACK_ON_ERROR` alone
    (a poison message is redelivered forever) are refused.
    """
    if ack_policy not in {AckPolicy.ACK, AckPolicy.MANUAL}:
        raise ValueError(f"ack policy {ack_policy.value!r} is not allowed; use ACK or MANUAL")
    return SubscriberOptions(
        group_id=group_id(settings, group),
        auto_offset_reset=settings.auto_offset_reset,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        consumer_timeout_ms=settings.consumer_timeout_ms,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        ack_policy=ack_policy,
        # FastStream publishes a handler's return value to the topic a `reply_to` header names:
        # a message must never choose where anything goes (replies have their own routes).
        no_reply=True,
    )


def broker_delivery(
    broker: KafkaBroker, settings: KafkaSettings, attempts: int, opener: MessageOpener | None = None
) -> Delivery:
    """`Delivery` with `attempts` tries whose dead letters go out through `broker` (acknowledged
    before the offset moves on), within the producer limits of `settings`; `opener` opens sealed
    messages (quipu.services.kit.keys.MessageSeals)."""

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        await broker.publish(body, topic=topic, key=key, headers=headers)

    limits = DeadLetterLimits(
        max_bytes=settings.max_request_bytes,
        attempts=settings.dead_letter_attempts,
        timeout_s=settings.dead_letter_timeout_s,
    )
    return Delivery(dead_letter, RetryPolicy(attempts=attempts), limits, opener)
