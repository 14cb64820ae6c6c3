"""The recorder's I/O: the memory store client (memory commands to the owner) and the summarizer's model."""

from __future__ import annotations

from quipu.services.domain.memory.summary import Summarizer
from quipu.services.domain.models.factory import make_model
from quipu.services.domain.models.port import ModelClient
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings


def memory_client(kafka: KafkaSettings, settings: TranscriptRecorderSettings) -> KafkaMemoryStore:
    """A `MemoryStore` that sends memory commands to the storage owner (start it before use)."""
    return KafkaMemoryStore.for_service(kafka, settings)


def summarizer(
    kafka: KafkaSettings, settings: TranscriptRecorderSettings, model: ModelClient | None = None
) -> Summarizer:
    """The summarizer over `model`, else the configured model (Claude with a key, else scripted).

    The model's own deadline must fit inside the consumer's poll interval, like every long call.
    """
    chosen = model or make_model(settings.model, max_poll_interval_ms=kafka.max_poll_interval_ms)
    return Summarizer(chosen, settings.summary_max_tokens)
