"""The enricher as a FastStream application."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from faststream import FastStream

from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.reindex import IndexMaintenance
from quipu.services.enricher import handlers
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.broker import broker_delivery, make_broker
from quipu.services.kit.keys import KeySettings, message_seals
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings

SERVICE = "enricher"


@dataclass
class EnricherDeps:
    """What the enricher uses; without a store it opens a Kafka client to the storage owner."""

    store: IndexMaintenance | None = None
    clock: Callable[[], datetime] = field(default=utc_now_ms)


def check_timeouts(kafka: KafkaSettings, settings: EnricherSettings) -> None:
    """Refuse tries that, all together, could outlive the consumer's poll interval."""
    worst_s = settings.retry_attempts * (
        settings.store_reply_timeout_s + settings.retry_delay_s * 2**settings.retry_attempts
    )
    if worst_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError(
            f"retry_attempts x (store_reply_timeout_s + backoff) = {worst_s:g} s must stay below the "
            f"consumer's max_poll_interval_ms={kafka.max_poll_interval_ms}"
        )


def create_app(
    kafka: KafkaSettings, settings: EnricherSettings | None = None, deps: EnricherDeps | None = None
) -> FastStream:
    """The enricher application; `deps` replaces the store (tests use the in-memory one)."""
    settings = settings or EnricherSettings()
    check_timeouts(kafka, settings)
    broker = make_broker(kafka, client_id=f"{SERVICE}-{os.getpid()}")

    # One try at the delivery level: the enricher bounds its own tries and turns the last failure
    # into a dead letter, where the shared default would rewind and retry the change forever.
    seals = message_seals(KeySettings())  # fact changes are sealed under their principal's key
    delivery = broker_delivery(broker, kafka, attempts=1, opener=seals)
    holder = handlers.EnricherHolder()
    consumer = handlers.register(broker, kafka, holder, delivery, settings)
    given = deps or EnricherDeps()
    opened: list[KafkaMemoryStore] = []

    async def build() -> None:
        # Hooks, not a lifespan: `app.start()` (in-process use, tests) runs hooks only.
        store = given.store
        if store is None:
            client = KafkaMemoryStore.connect(
                kafka, reply_timeout_s=settings.store_reply_timeout_s, attempts=1
            )
            await client.start()
            opened.append(client)
            store = client
        holder.enricher = Enricher(store, settings, clock=given.clock)

    async def drain() -> None:
        # Before the broker stops: messages in flight can still reach the owner and commit.
        await consumer.drain(settings.drain_grace_s)

    async def close() -> None:
        for client in opened:
            await client.stop()
        opened.clear()
        await seals.close()
        holder.enricher = None

    return FastStream(broker, on_startup=[build], on_shutdown=[drain], after_shutdown=[close])
