"""The enricher as a FastStream application."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.reindex import IndexMaintenance
from quipu.services.enricher import handlers
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.keys import message_seals
from quipu.services.kit.lifecycle import Opened, ServiceDefinition, service_app
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
    kafka = kafka.in_background()  # nobody waits on an enrichment: its consumers fetch less often
    check_timeouts(kafka, settings)
    given = deps or EnricherDeps()
    seals = message_seals(settings.keys)  # fact changes are sealed under their principal's key

    async def open_enricher(_: KafkaBroker, opened: Opened) -> Enricher:
        store = given.store or await opened.start(
            KafkaMemoryStore.connect(kafka, reply_timeout_s=settings.store_reply_timeout_s, attempts=1)
        )
        return Enricher(store, settings, clock=given.clock)

    return service_app(
        kafka,
        settings,
        name=SERVICE,
        client_id=f"{SERVICE}-{os.getpid()}",
        # One try at the delivery level: the enricher bounds its own tries and turns the last
        # failure into a dead letter, where the shared default would rewind and retry forever.
        attempts=1,
        seals=seals,
        open=open_enricher,
        subscribe=lambda broker, delivery, enricher: [
            handlers.register(broker, kafka, enricher, delivery, settings)
        ],
    )


DEFINITION = ServiceDefinition(
    SERVICE, EnricherSettings, lambda connections, settings: create_app(connections.kafka, settings)
)
