"""The enricher's one subscriber: `memory.changes` → the derived index.

Each message goes through `Delivery`: an undecodable one, a malformed one and one whose update was
given up are dead-lettered to `memory.changes.dlq` (original bytes, reason, position) and the
offset moves on; nothing is retried forever. It is the only topic the enricher reads: fact
changes carry fact texts, never transcripts.
"""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from pydantic import TypeAdapter

from quipu.contracts.memory import FactChanged
from quipu.contracts.topics import Topic
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.settings import KafkaSettings

FACT_CHANGED = TypeAdapter(FactChanged)


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    enricher: Running[Enricher],
    delivery: Delivery,
    settings: EnricherSettings,
) -> ConcurrentConsumer:
    """Subscribe the enricher to `memory.changes` with its consumer group."""
    return consume_concurrently(
        broker,
        kafka,
        Topic.MEMORY_CHANGES,
        lambda message: delivery.handle(message, FACT_CHANGED, enricher.get().on_fact_changed),
        group=settings.group,
        settings=settings,
    )
