"""The transcript recorder as a FastStream application."""

from __future__ import annotations

from dataclasses import dataclass

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.port import ModelClient
from quipu.services.kit.keys import message_seals
from quipu.services.kit.lifecycle import Opened, ServiceDefinition, service_app
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
    kafka = kafka.in_background()  # nobody waits on a recording: its consumers fetch less often
    if settings.model_timeout_s * 1000 >= kafka.max_poll_interval_ms:
        raise ValueError("model_timeout_s must be shorter than the consumer's max_poll_interval_ms")
    seals = message_seals(settings.keys)  # the turns on history.turns are sealed for their principal
    given = deps or RecorderDeps()

    async def open_recorder(_: KafkaBroker, opened: Opened) -> TranscriptRecorder:
        memory = given.memory or await opened.start(adapters.memory_client(kafka, settings))
        return TranscriptRecorder(
            memory,
            adapters.summarizer(kafka, settings, given.model),
            window_messages=settings.window_messages,
            fold_batch_messages=settings.fold_batch_messages,
            fold_attempts=settings.fold_attempts,
            model_timeout_s=settings.model_timeout_s,
        )

    return service_app(
        kafka,
        settings,
        name=SERVICE,
        attempts=settings.retry_attempts,
        seals=seals,
        open=open_recorder,
        subscribe=lambda broker, delivery, recorder: [
            handlers.register(broker, kafka, recorder, delivery, settings)
        ],
    )


DEFINITION = ServiceDefinition(
    SERVICE, TranscriptRecorderSettings, lambda connections, settings: create_app(connections.kafka, settings)
)
