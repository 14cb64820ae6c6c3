"""One Kafka producer for the services of a process that reach Kafka alike.

    producer = shared_producer(settings)      # a lease: aiokafka's producer, for this holder
    await producer.start()                    # the first lease starts the process's producer
    await producer.send(topic, body, key=key)
    await producer.stop()                     # flushes; the last lease closes the producer

An aiokafka producer keeps at most one produce request in flight to a broker: records queued
meanwhile wait and leave together in the next request. Services of one process (the planner
and its store client in production; every service under `quipu up`, the tests and the benches)
each had a producer of their own, so each sent its own requests, most carrying one record. A
lease of one producer per event loop and connection settings (brokers, acknowledgements,
idempotence, request size) makes their records share requests: in the run bench (every service
in one process, 50 sessions at once) 11.6 produce requests a run became 6.3, one connection and
its buffers in place of five (NOTES.md has what it did and did not change).

A record's order is the order of its partition, whoever queued it, so sharing changes nothing a
consumer sees. The shared producer's client id is the settings' `client_id` (the deployment's),
not a service's. `KafkaSettings.share_producer` false gives every holder a producer of its own.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerClosed
from aiokafka.structs import RecordMetadata

from quipu.services.kit.settings import KafkaSettings

_Key = tuple[str, str, str | int, bool, int]


class Producer(Protocol):
    """What the kit uses of a producer: aiokafka's, or a lease of the process's (`SharedProducer`)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable[RecordMetadata]: ...

    async def partitions_for(self, topic: str) -> set[int]: ...


@dataclass
class _Shared:
    """The process's producer for one key, and how many started leases hold it."""

    producer: AIOKafkaProducer
    started: asyncio.Task[None]
    holders: int = 0


_LOOPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, _Shared]] = (
    weakref.WeakKeyDictionary()
)
"""The shared producers of each event loop (a producer belongs to the loop that started it)."""


def _key(settings: KafkaSettings) -> _Key:
    return (
        settings.bootstrap,
        settings.client_id,
        settings.acks,
        settings.enable_idempotence,
        settings.max_request_bytes,
    )


def new_producer(settings: KafkaSettings, client_id: str) -> AIOKafkaProducer:
    """A producer of its own, as `settings` configure one (not started)."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        client_id=client_id,
        acks=settings.acks,
        enable_idempotence=settings.enable_idempotence,
        max_request_size=settings.max_request_bytes,
    )


class SharedProducer:
    """A lease of the process's producer for `settings`, with the part of aiokafka's producer
    interface FastStream and the kit use. `start` and `stop` are this holder's alone: stop flushes
    what is queued (every holder's: one producer's records cannot be told apart) and closes the
    producer only when no other started lease holds it; a stopped lease sends nothing more."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._key = _key(settings)
        self._held: _Shared | None = None

    async def start(self) -> None:
        """Hold the process's producer, starting it when no lease does."""
        if self._held is not None:
            return
        producers = _LOOPS.setdefault(asyncio.get_running_loop(), {})
        shared = producers.get(self._key)
        if shared is None:
            producer = new_producer(self._settings, self._settings.client_id)
            shared = _Shared(producer, asyncio.ensure_future(producer.start()))
            producers[self._key] = shared
        try:
            await asyncio.shield(shared.started)
        except BaseException:
            if shared.started.done() and producers.get(self._key) is shared:
                # A producer that failed to start is not handed out again: the next start tries anew.
                del producers[self._key]
            raise
        shared.holders += 1
        self._held = shared

    async def stop(self) -> None:
        """Flush what is queued; close the producer if this was its last holder."""
        shared, self._held = self._held, None
        if shared is None:
            return
        shared.holders -= 1
        if shared.holders > 0:
            await shared.producer.flush()
            return
        producers = _LOOPS.get(asyncio.get_running_loop())
        if producers is not None and producers.get(self._key) is shared:
            del producers[self._key]
        await shared.producer.stop()

    @property
    def _closed(self) -> bool:
        # FastStream reads a connected producer's `_closed`.
        return self._held is None

    def _producer(self) -> AIOKafkaProducer:
        if self._held is None:
            raise ProducerClosed()  # what a stopped aiokafka producer raises; a lease not started yet too
        return self._held.producer

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable[RecordMetadata]:
        """aiokafka's `send`: queue one record; the awaitable resolves when the broker took it."""
        acknowledged: Awaitable[RecordMetadata] = await self._producer().send(
            topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
        )
        return acknowledged

    def create_batch(self) -> Any:
        """aiokafka's `create_batch` (FastStream's batch publish)."""
        return self._producer().create_batch()

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Awaitable[RecordMetadata]:
        """aiokafka's `send_batch`."""
        acknowledged: Awaitable[RecordMetadata] = await self._producer().send_batch(
            batch, topic, partition=partition
        )
        return acknowledged

    async def partitions_for(self, topic: str) -> set[int]:
        """aiokafka's `partitions_for`: the topic's partition numbers."""
        partitions: set[int] = await self._producer().partitions_for(topic)
        return partitions

    async def flush(self) -> None:
        """Wait until every record queued on the producer is acknowledged or failed."""
        await self._producer().flush()


def shared_producer(settings: KafkaSettings, client_id: str) -> Producer:
    """The producer a holder named `client_id` uses: a lease of the process's one for `settings`,
    or a producer of its own when `settings.share_producer` is off."""
    if settings.share_producer:
        return SharedProducer(settings)
    own: Producer = new_producer(settings, client_id)
    return own
