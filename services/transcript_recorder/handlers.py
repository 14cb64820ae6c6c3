"""The recorder's subscriber: `history.turns`, sessions side by side, each session's turns in order.

Decode through `Delivery` (an invalid message goes to `history.turns.dlq`), record the turn and
fold the summary, commit after both are durable. Turns are keyed by session, so one copy handles
a session's turns in order; another copy racing it after a rebalance meets the store's rules
(the turn id makes a second append a no-op; the summary save is conditional).
"""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from pydantic import TypeAdapter

from quipu.contracts.runs import TurnCompleted
from quipu.contracts.topics import Topic
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.settings import KafkaSettings
from quipu.services.transcript_recorder.logic import TranscriptRecorder
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings

TURN_COMPLETED = TypeAdapter(TurnCompleted)


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    recorder: Running[TranscriptRecorder],
    delivery: Delivery,
    settings: TranscriptRecorderSettings,
) -> ConcurrentConsumer:
    """Subscribe the recorder to `history.turns` in its consumer group."""

    async def record(turn: TurnCompleted) -> None:
        await recorder.get().record(turn)

    return consume_concurrently(
        broker,
        kafka,
        Topic.HISTORY_TURNS,
        lambda message: delivery.handle(message, TURN_COMPLETED, record),
        group=settings.group,
        settings=settings,
    )
