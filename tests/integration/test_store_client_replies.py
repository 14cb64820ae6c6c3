"""A store client passes over the replies of the other clients that read its partition.

Clients pick a partition of `storage.replies` each, and several share one when there are more
clients than partitions: a reply for another client's call must not be decoded or opened here.
Real broker; the replies are published by hand onto the client's partition (no owner).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from quipu.contracts.commands import LoadSessionStatus, StoreReply
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.topics import Topic
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from tests.timing import scaled


class CountingSeals(MessageSeals):
    """Plaintext seals that count what they are asked to open."""

    def __init__(self) -> None:
        super().__init__(None)
        self.opened: list[bytes] = []

    async def open(self, body: bytes) -> bytes:
        self.opened.append(body)
        return await super().open(body)


def _refusal(correlation_id: str) -> bytes:
    error = StoreError(ErrorCode.SESSION_NOT_FOUND, "no such session")
    return (
        StoreReply(correlation_id=correlation_id, op="load_session_status", error=error.to_body())
        .model_dump_json()
        .encode()
    )


async def test_replies_for_other_clients_are_not_opened(kafka_settings: KafkaSettings) -> None:
    seals = CountingSeals()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    async with (
        asyncio.timeout(scaled(60)),
        KafkaStore(kafka_settings, reply_timeout_s=scaled(30), seals=seals) as store,
    ):
        await producer.start()
        try:
            call = asyncio.create_task(store.call(LoadSessionStatus(session_id="s-1", correlation_id="mine")))
            await asyncio.sleep(0)  # the call is pending before any reply is on the partition
            topic, partition = (
                kafka_settings.topic_prefix + Topic.STORAGE_REPLIES.value,
                store.reply_partition,
            )
            for number in range(10):
                await producer.send_and_wait(topic, _refusal(f"theirs-{number}"), partition=partition)
            await producer.send_and_wait(topic, _refusal("mine"), partition=partition)
            with pytest.raises(StoreError) as refused:
                await call
        finally:
            await producer.stop()

    assert refused.value.code is ErrorCode.SESSION_NOT_FOUND
    assert [StoreReply.model_validate_json(body).correlation_id for body in seals.opened] == ["mine"]
