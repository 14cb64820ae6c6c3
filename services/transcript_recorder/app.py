"""The transcript recorder as a FastStream application."""

from __future__ import annotations

from dataclasses import dataclass

from faststream import FastStream

from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.port import ModelClient
from quipu.services.kit.broker import broker_delivery, make_broker
from quipu.services.kit.keys import KeySettings, message_seals
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.transcript_recorder import adapters, handlers
from quipu.services.transcript_recorder.logic import TranscriptRecorder
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings

SERVICE = "transcript-recorder"


@dataclass
class RecorderDeps:
    """What the recorder works with; `create_app` builds whatever is left None."""

    memory: MemoryStore | None = None
    model: ModelClient | None = None


def create_app(
    kafka: KafkaSettings,
    settings: TranscriptRecorderSettings | None = None,
    deps: RecorderDeps | None = None,
) -> FastStream:
    """The recorder application; `deps` replaces the memory store (tests) or the summarizer's model."""
    settings = settings or TranscriptRecorderSettings()
    if settings.model_timeout_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError("model_timeout_s must be shorter than the consumer's max_poll_interval_ms")
    broker = make_broker(kafka, client_id=SERVICE)

    seals = message_seals(KeySettings())  # the turns on history.turns are sealed for their principal
    delivery = broker_delivery(broker, kafka, attempts=settings.retry_attempts, opener=seals)
    holder = handlers.RecorderHolder()
    consumer = handlers.register(broker, kafka, holder, delivery, settings)
    given = deps or RecorderDeps()
    opened: list[KafkaMemoryStore] = []

    async def build() -> None:
        # Hooks, not a lifespan: `app.start()` (in-process use) runs hooks, only `app.run()` lifespans.
        memory = given.memory
        if memory is None:
            client = adapters.memory_client(kafka, settings)
            await client.start()
            opened.append(client)
            memory = client
        holder.recorder = TranscriptRecorder(
            memory,
            adapters.summarizer(kafka, settings, given.model),
            window_messages=settings.window_messages,
            fold_batch_messages=settings.fold_batch_messages,
            fold_attempts=settings.fold_attempts,
            model_timeout_s=settings.model_timeout_s,
        )

    async def drain() -> None:
        # Before the broker stops: messages in flight can still reach the owner and commit.
        await consumer.drain(settings.drain_grace_s)

    async def close() -> None:
        for client in opened:
            await client.stop()
        opened.clear()
        await seals.close()
        holder.recorder = None

    return FastStream(broker, on_startup=[build], on_shutdown=[drain], after_shutdown=[close])
