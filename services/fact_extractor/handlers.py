"""The fact extractor's subscriber: `history.recorded`, principals side by side, each in order.

Decoded through `Delivery` (an invalid message goes to `history.recorded.dlq`), handed to
`FactExtractor`, and committed only after its operations are applied (or refused for good). A
transient failure (store UNAVAILABLE, model timeout) is retried, then handled again a second
later, which is harmless: the operations of a turn are applied under the turn id exactly once.
Turns of different principals are extracted concurrently (a model call each); one principal's
turns one at a time, since each extraction reads the facts the previous one may have written.
"""

from __future__ import annotations

import json

from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from pydantic import TypeAdapter

from quipu.contracts.memory import HistoryRecorded
from quipu.contracts.topics import Topic
from quipu.services.fact_extractor.adapters import FactExtractor
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, by_kafka_key, consume_concurrently
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.settings import KafkaSettings

HISTORY_RECORDED = TypeAdapter(HistoryRecorded)


def by_principal(message: KafkaMessage) -> bytes | None:
    """A turn's principal: the extractor reads a principal's facts to tell new from known, so two
    turns of one principal (two sessions, keyed apart) must not be extracted at once."""
    try:
        scope = json.loads(message.body)["scope"]
        return f"{scope.get('tenant_id', '')}/{scope['principal_id']}".encode()
    except (ValueError, TypeError, KeyError, AttributeError):
        return by_kafka_key(message)  # not a HistoryRecorded: it goes to the DLQ in its turn


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    extractor: Running[FactExtractor],
    delivery: Delivery,
    settings: FactExtractorSettings,
) -> ConcurrentConsumer:
    """Subscribe the extractor to `history.recorded` in its consumer group."""
    return consume_concurrently(
        broker,
        kafka,
        Topic.HISTORY_RECORDED,
        lambda message: delivery.handle(message, HISTORY_RECORDED, extractor.get().on_history_recorded),
        group=settings.group,
        settings=settings,
        order=by_principal,
    )
