"""The recorder's subscriber: `history.turns`, one message at a time per partition.

Decode through `Delivery` (an invalid message goes to `history.turns.dlq`), record the turn and
fold the summary, commit after both are durable. Turns are keyed by session, so one copy handles
a session's turns in order; another copy racing it after a rebalance meets the store's rules
(the turn id makes a second append a no-op; the summary save is conditional).
"""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from pydantic import TypeAdapter

from contracts.runs import TurnCompleted
from contracts.topics import Topic
from services.kit.broker import subscriber_options, topic
from services.kit.delivery import Delivery
from services.kit.settings import KafkaSettings
from services.transcript_recorder.logic import TranscriptRecorder

TURN_COMPLETED = TypeAdapter(TurnCompleted)


class RecorderHolder:
    """The recorder, once the app's startup hook has built it."""

    def __init__(self) -> None:
        self.recorder: TranscriptRecorder | None = None

    def get(self) -> TranscriptRecorder:
        """The running recorder."""
        if self.recorder is None:
            raise RuntimeError("the transcript recorder is not started")
        return self.recorder


def register(
    broker: KafkaBroker, settings: KafkaSettings, holder: RecorderHolder, delivery: Delivery, group: str
) -> None:
    """Subscribe the recorder to `history.turns` in consumer group `group`."""

    async def record(turn: TurnCompleted) -> None:
        await holder.get().record(turn)

    @broker.subscriber(
        topic(settings, Topic.HISTORY_TURNS),
        **subscriber_options(settings, group=group, ack_policy=AckPolicy.MANUAL),
    )
    async def on_turn_completed(message: KafkaMessage) -> None:
        await delivery.handle(message, TURN_COMPLETED, record)
