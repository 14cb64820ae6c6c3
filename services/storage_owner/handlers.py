"""The storage owner's subscriber: apply a command, reply, publish what committed, then commit."""

from __future__ import annotations

from dataclasses import dataclass

from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy

from contracts.commands import STORE_COMMAND, StoreOperation, StoreReply
from contracts.errors import ErrorCode, StoreError
from contracts.topics import Topic
from services.kit.broker import subscriber_options, topic
from services.kit.delivery import Delivery
from services.kit.memory.protocol import MemoryStore
from services.kit.settings import KafkaSettings
from services.kit.store.client import REPLY_TO_HEADER
from services.kit.store.protocol import Store
from services.storage_owner.logic import apply_command, correlation_of


@dataclass
class OwnerDeps:
    """What the handler needs; the stores are opened in the app's lifespan."""

    store: Store | None = None
    memory: MemoryStore | None = None

    def opened_store(self) -> Store:
        """The store, once the lifespan has opened it."""
        if self.store is None:
            raise RuntimeError("the storage owner's store is not open")
        return self.store


def register(
    broker: KafkaBroker,
    settings: KafkaSettings,
    deps: OwnerDeps,
    delivery: Delivery,
    group: str,
    partition_workers: int = 1,
) -> None:
    """Subscribe the owner to `storage.commands`."""
    replies_default = topic(settings, Topic.STORAGE_REPLIES)

    @broker.subscriber(
        topic(settings, Topic.STORAGE_COMMANDS),
        **subscriber_options(settings, group=group, ack_policy=AckPolicy.MANUAL),
        # Several consumers of one group: partitions in parallel, each partition still in order.
        max_workers=partition_workers if partition_workers > 1 else None,
    )
    async def on_command(message: KafkaMessage) -> None:
        reply_to = message.headers.get(REPLY_TO_HEADER) or replies_default

        async def publish_reply(reply: StoreReply) -> None:
            await broker.publish(reply.model_dump_json().encode(), topic=str(reply_to))

        async def apply(command: StoreOperation) -> None:
            reply, publications = await apply_command(deps.opened_store(), command, deps.memory)
            await publish_reply(reply)
            for publication in publications:
                await broker.publish(
                    publication.payload.model_dump_json().encode(),
                    topic=topic(settings, publication.topic),
                    key=publication.key.encode(),
                )

        async def refuse(body: bytes, reason: str) -> None:
            correlation_id = correlation_of(body)
            if correlation_id:
                invalid = StoreError(ErrorCode.INVALID_ARGUMENT, reason)
                await publish_reply(StoreReply(correlation_id=correlation_id, error=invalid.to_body()))

        await delivery.handle(message, STORE_COMMAND, apply, on_invalid=refuse)
