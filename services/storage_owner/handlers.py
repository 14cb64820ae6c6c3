"""The storage owner's subscriber: apply a command, reply, publish what committed, then commit.

What a committed command justifies goes out after the commit and before the offset is committed,
so a crash in between means a redelivery, an exact retry and the same messages again: the tool
calls a step carries first (they are on the run's path), then the reply, then the stream events.
A refused command publishes nothing but its reply.

Commands are applied concurrently across keys (`kit.concurrent_delivery`): a command's key is its
session (else its run), so one session's commands apply in the order sent while other sessions'
run beside them, each in its own transaction (the store's rules hold under any interleaving; the
conformance races prove it). Offsets are committed only up to the oldest command not yet replied.

Replies go only to the replies topic of the owner's settings, on the partition a command's
`quipu-reply-partition` header names; a command whose route is anything else is refused before
it is applied (docs/wire.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from faststream.kafka import KafkaBroker

from quipu.contracts.commands import (
    STRICT_COMMAND,
    DispatchedCall,
    StoreOperation,
    StoreReply,
)
from quipu.contracts.errors import ErrorCode, StoreError, StoreRefusedError
from quipu.contracts.memory_commands import ForgetPrincipal
from quipu.contracts.sealed import SealedFor
from quipu.contracts.topics import Topic, toolset_calls_topic
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store
from quipu.services.kit.broker import topic
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently, let_order_go
from quipu.services.kit.delivery import ConsumedMessage, Delivery, PermanentError
from quipu.services.kit.keys import KeyUnavailableError, MessageSeals
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.publishing import Outgoing, broker_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import partition_count
from quipu.services.storage_owner.logic import Announcement, apply_command, correlation_of, reply_partition
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.settings import OwnerSettings
from quipu.services.storage_owner.their_person import TheirPerson

_RECOUNT_AFTER_S = 5.0


@dataclass
class OwnerStores:
    """The stores the owner serves, opened when it starts, and whose words each of its answers carries."""

    store: Store
    memory: MemoryStore
    people: TheirPerson = field(init=False)

    def __post_init__(self) -> None:
        self.people = TheirPerson(self.store, self.memory)

    async def apply(
        self, command: StoreOperation, *, sealing: bool
    ) -> tuple[StoreReply, Sequence[Announcement]]:
        """Apply `command`; when the owner seals, its answers are sealed for the person whose words
        they carry (`TheirPerson`)."""
        if sealing:
            return await self.people.apply(command)
        return await apply_command(self.store, command, self.memory)


class OwnerKeyring:
    """The owner's own key source (no channel in between): the keyring of its memory store."""

    def __init__(self, memory: Callable[[], MemoryStore]) -> None:
        self._memory = memory

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        """The principal's data key (MongoDB's memory store keeps the keys)."""
        memory = self._memory()
        if not isinstance(memory, MongoMemoryStore):
            raise KeyUnavailableError("this owner keeps no data keys (its memory store is not MongoDB's)")
        return await memory.data_key(whose, create=create)


class RepliesTopic:
    """The replies topic of the owner's settings, and the partition count the broker reports."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.name = topic(settings, Topic.STORAGE_REPLIES)
        self._settings = settings
        self._partitions = 0
        self._counted_at = -_RECOUNT_AFTER_S
        self._counting = asyncio.Lock()

    async def route(self, headers: Mapping[str, Any]) -> int | None:
        """The partition a command's reply goes to; StoreError INVALID_ARGUMENT when it has none."""
        try:
            return reply_partition(headers, self.name, self._partitions)
        except StoreError:
            # Not counted yet, or partitions were added since: ask the broker (at most every few
            # seconds, once for all the commands waiting).
            async with self._counting:
                if time.monotonic() - self._counted_at >= _RECOUNT_AFTER_S:
                    self._partitions = await partition_count(self._settings, self.name)
                    self._counted_at = time.monotonic()
        return reply_partition(headers, self.name, self._partitions)

    async def route_or_any(self, headers: Mapping[str, Any]) -> int | None:
        """The command's partition when its route is valid, else None (any partition)."""
        try:
            return await self.route(headers)
        except StoreError:
            return None


def refusal(correlation_id: str, error: StoreError, op: str = "") -> StoreReply:
    """The reply refusing a command with `error`."""
    return StoreReply(correlation_id=correlation_id, op=op, error=error.to_body())


def register(
    broker: KafkaBroker,
    settings: KafkaSettings,
    stores: Running[OwnerStores],
    delivery: Delivery,
    owner: OwnerSettings,
    seals: MessageSeals,
) -> ConcurrentConsumer:
    """Subscribe the owner to `storage.commands`: sessions side by side, each session's in order.

    `delivery` opens sealed commands with `seals`, which also seal what the owner publishes.
    """
    replies = RepliesTopic(settings)
    publisher = broker_publisher(broker, settings, seals)

    async def on_command(message: ConsumedMessage) -> None:
        async def publish_reply(reply: StoreReply, partition: int | None) -> None:
            await publisher.publish(reply, partition=partition)

        async def apply(command: StoreOperation) -> None:
            try:
                partition = await replies.route(message.headers)
            except StoreRefusedError as error:
                # The refusal itself goes to the replies topic, on whichever partition.
                await publish_reply(refusal(command.correlation_id, error, op=command.op), None)
                raise PermanentError(error.message) from error
            reply, announcements = await stores.get().apply(command, sealing=seals.sealing)
            if isinstance(command, ForgetPrincipal) and seals.keys is not None:
                # This owner just shredded the key: its own cache lets go of it at once.
                seals.keys.drop(
                    SealedFor(tenant_id=command.scope.tenant_id, principal_id=command.scope.principal_id)
                )
            # One round trip for the reply and all its commit justifies. A call's topic is the
            # deployment's name for its toolset (validated by the command's schema), within the
            # tools.calls family: never a topic the command names.
            calls = [
                Outgoing(each.call, within=toolset_calls_topic(each.toolset))
                for each in announcements
                if isinstance(each, DispatchedCall)
            ]
            others = [Outgoing(each) for each in announcements if not isinstance(each, DispatchedCall)]
            acknowledged = await publisher.queue_together([*calls, Outgoing(reply, partition), *others])
            if not announcements:
                # Committed, and only its reply follows from it: nothing the session's next command
                # publishes can come before anything of this one's on a topic where order counts
                # (a reply finds its call by correlation id), so that command need not wait for the
                # broker's acknowledgement. The offset still waits for it.
                let_order_go()
            await acknowledged

        async def refuse(body: bytes, reason: str) -> None:
            correlation_id = correlation_of(body)
            if correlation_id:
                error = StoreError(ErrorCode.INVALID_ARGUMENT, reason)
                partition = await replies.route_or_any(message.headers)
                await publish_reply(refusal(correlation_id, error), partition)

        await delivery.handle(message, STRICT_COMMAND, apply, on_invalid=refuse)

    return consume_concurrently(
        broker, settings, Topic.STORAGE_COMMANDS, on_command, group=owner.group, settings=owner
    )
