"""A consumer outside any consumer group, for tests that read partitions they assign themselves."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

from quipu.services.kit.settings import KafkaSettings


def group_less(settings: KafkaSettings) -> AIOKafkaConsumer:
    """A consumer outside any group, from the beginning, with the fetch wait of `settings` (not
    started; to be assigned)."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
