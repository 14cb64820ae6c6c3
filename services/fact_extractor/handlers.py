"""The fact extractor's subscriber: `history.recorded`, one message at a time per partition.

Decoded through `Delivery` (an invalid message goes to `history.recorded.dlq`), handed to
`FactExtractor`, and committed only after its operations are applied (or refused for good). A
transient failure (store UNAVAILABLE, model timeout) is retried, then rewound for redelivery,
which is harmless: the operations of a turn are applied under the turn id exactly once.
"""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from pydantic import TypeAdapter

from contracts.memory import HistoryRecorded
from contracts.topics import Topic
from services.fact_extractor.adapters import FactExtractor
from services.kit.broker import subscriber_options, topic
from services.kit.delivery import Delivery
from services.kit.settings import KafkaSettings

HISTORY_RECORDED = TypeAdapter(HistoryRecorded)


class ExtractorHolder:
    """The extractor, once the app's startup hook has built it."""

    def __init__(self) -> None:
        self.extractor: FactExtractor | None = None

    def get(self) -> FactExtractor:
        """The running extractor."""
        if self.extractor is None:
            raise RuntimeError("the fact extractor is not started")
        return self.extractor


def register(
    broker: KafkaBroker, settings: KafkaSettings, holder: ExtractorHolder, delivery: Delivery, group: str
) -> None:
    """Subscribe the extractor to `history.recorded` in consumer group `group`."""

    @broker.subscriber(
        topic(settings, Topic.HISTORY_RECORDED),
        **subscriber_options(settings, group=group, ack_policy=AckPolicy.MANUAL),
    )
    async def on_history_recorded(message: KafkaMessage) -> None:
        await delivery.handle(message, HISTORY_RECORDED, holder.get().on_history_recorded)
