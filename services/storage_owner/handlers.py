"""The storage owner's subscriber: apply a command, reply, publish what committed, then commit.

Commands are applied concurrently across keys (`kit.concurrent_delivery`): a command's key is its
session (else its run), so one session's commands apply in the order sent while other sessions'
run beside them, each in its own transaction (the store's rules hold under any interleaving; the
conformance races prove it). Offsets are committed only up to the oldest command not yet replied.
"""

from __future__ import annotations

from dataclasses import dataclass

from faststream.kafka import KafkaBroker

from contracts.commands import STORE_COMMAND, StoreOperation, StoreReply
from contracts.errors import ErrorCode, StoreError
from contracts.topics import Topic
from services.kit.broker import topic
from services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from services.kit.delivery import ConsumedMessage, Delivery
from services.kit.memory.protocol import MemoryStore
from services.kit.settings import KafkaSettings
from services.kit.store.client import REPLY_TO_HEADER
from services.kit.store.protocol import Store
from services.storage_owner.logic import apply_command, correlation_of
from services.storage_owner.settings import OwnerSettings


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
    owner: OwnerSettings,
) -> ConcurrentConsumer:
    """Subscribe the owner to `storage.commands`: sessions side by side, each session's in order."""
    replies_default = topic(settings, Topic.STORAGE_REPLIES)

    async def on_command(message: ConsumedMessage) -> None:
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

    return consume_concurrently(
        broker, settings, Topic.STORAGE_COMMANDS, on_command, group=owner.group, settings=owner
    )
