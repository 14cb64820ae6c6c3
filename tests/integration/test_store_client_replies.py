"""Each store client reads a partition of `storage.replies` of its own, and only while it waits.

Clients claim a partition each in the claim group (kit.reply_claim), so none fetches another's
replies; when there are more clients than partitions several share one, and a reply for another
client's call must not be decoded or opened there. Real broker; the owner is a real process where
a test needs one, else replies are published by hand onto the client's partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from quipu.contracts.commands import LoadSessionStatus, StoreReply
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.cli.settings import CliSettings
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.settings import PlannerSettings
from tests.owner_support import Served
from tests.timing import eventually, scaled


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """`predicate` as a check for `eventually`."""

    async def check() -> bool:
        return predicate()

    return check


class CountingSeals(MessageSeals):
    """Plaintext seals that count what they are asked to open."""

    def __init__(self) -> None:
        super().__init__(None)
        self.asked: list[bytes] = []

    async def open(self, body: bytes) -> bytes:
        self.asked.append(body)
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
    assert [StoreReply.model_validate_json(body).correlation_id for body in seals.asked] == ["mine"]


async def test_each_client_reads_a_partition_of_its_own_and_no_other_clients_replies(
    stack: EmbeddedStack, unique: str, tmp_path: Path
) -> None:
    """As many clients as the replies topic has partitions, beside one owner: the claim group gives
    each a partition of its own, every call is answered there, and none fetches another's reply."""
    async with Served(stack, f"{unique}.", unique, tmp_path / "owner.log") as served:
        partitions = len(await served.store._reply_partitions())
        clients = [KafkaStore(served.settings, reply_timeout_s=scaled(10)) for _ in range(partitions - 1)]
        clients.append(served.store)
        try:
            await asyncio.gather(*(client.start() for client in clients[:-1]))

            async def claimed_apart() -> bool:
                claims = [client.claim.partition if client.claim else None for client in clients]
                return (
                    None not in claims
                    and len(set(claims)) == len(clients)
                    and all(
                        client.reply_partition == claim for client, claim in zip(clients, claims, strict=True)
                    )
                )

            await eventually(claimed_apart, within=60, what="a partition of its own for every client")

            async def calls(client: KafkaStore, number: int) -> list[ErrorCode]:
                codes = []
                for turn in range(5):
                    with pytest.raises(StoreError) as refused:
                        await client.load_session_status(f"absent-{number}-{turn}")
                    codes.append(refused.value.code)
                return codes

            # A client fetches only while it waits: a late duplicate of an earlier call of its own
            # (the owner's readiness probe was resent) is read at its next call, so warm up first.
            await asyncio.gather(*(calls(client, number) for number, client in enumerate(clients)))
            before = [client.replies_passed_over for client in clients]
            answers = await asyncio.gather(*(calls(client, number) for number, client in enumerate(clients)))
            assert answers == [[ErrorCode.SESSION_NOT_FOUND] * 5] * len(clients)
            assert [client.replies_passed_over for client in clients] == before
            assert not any(client.claim and client.claim.shared for client in clients)
            assert all(client.fetching == set() for client in clients), "idle clients fetch nothing"
        finally:
            await asyncio.gather(*(client.stop() for client in clients[:-1]))


async def test_a_client_fetches_its_partition_only_while_a_call_waits(kafka_settings: KafkaSettings) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    async with (
        asyncio.timeout(scaled(60)),
        KafkaStore(kafka_settings, reply_timeout_s=scaled(30), claim_partition=False) as store,
    ):
        assert store.fetching == set()
        await producer.start()
        try:
            call = asyncio.create_task(store.call(LoadSessionStatus(session_id="s-1", correlation_id="mine")))
            await eventually(
                holds(lambda: store.fetching == {store.reply_partition}), within=10, what="fetching"
            )
            topic = kafka_settings.topic_prefix + Topic.STORAGE_REPLIES.value
            await producer.send_and_wait(topic, _refusal("mine"), partition=store.reply_partition)
            with pytest.raises(StoreError):
                await call
        finally:
            await producer.stop()
        assert store.fetching == set()


async def test_a_services_client_claims_a_partition_and_a_client_commands_does_not(
    kafka_settings: KafkaSettings,
) -> None:
    # A command's client lives a moment: its join and leave would rebalance every other client.
    async with (
        asyncio.timeout(scaled(60)),
        KafkaStore.for_service(kafka_settings, PlannerSettings()) as service,
        KafkaStore.for_service(kafka_settings, CliSettings()) as command,
    ):
        assert service.claim is not None
        assert command.claim is None


class CallingWhileItMoves(KafkaStore):
    """A client that starts a second call while it drops a partition only an earlier call named."""

    second: asyncio.Task[object] | None = None

    async def _read_from(self, partitions: set[int]) -> None:
        if self.second is None and len(self._reading) > len(partitions):
            self.second = asyncio.create_task(
                self.call(LoadSessionStatus(session_id="s-2", correlation_id="second"))
            )
            await asyncio.sleep(0)  # the second call is pending (and fetching) before the move goes on
        await super()._read_from(partitions)


async def test_a_call_that_begins_while_the_client_settles_is_still_fetched(
    kafka_settings: KafkaSettings,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, enable_idempotence=False)
    topic = kafka_settings.topic_prefix + Topic.STORAGE_REPLIES.value
    store = CallingWhileItMoves(kafka_settings, reply_timeout_s=scaled(120), claim_partition=False)
    async with asyncio.timeout(scaled(60)), store:
        await producer.start()
        try:
            assert store.reply_partition is not None
            other = (store.reply_partition + 1) % len(await store._reply_partitions())
            await store._read_from({store.reply_partition, other})  # as after a move to a claim
            first = asyncio.create_task(
                store.call(LoadSessionStatus(session_id="s-1", correlation_id="first"))
            )
            await eventually(holds(lambda: bool(store.fetching)), within=10, what="the first call fetching")
            await producer.send_and_wait(topic, _refusal("first"), partition=store.reply_partition)
            with pytest.raises(StoreError):
                await first
            assert store.second is not None
            await producer.send_and_wait(topic, _refusal("second"), partition=store.reply_partition)
            with pytest.raises(StoreError) as refused:
                await store.second  # without a resend: the reply timeout is longer than the test's
        finally:
            await producer.stop()
    assert refused.value.code is ErrorCode.SESSION_NOT_FOUND


async def test_a_client_stopped_while_its_claim_joins_stops_without_waiting_for_the_join(
    kafka_settings: KafkaSettings,
) -> None:
    # aiokafka's stop waited for the join under way, which Tansu answers only once the group's
    # rebalance is over: every short-lived client (a CLI command, a test) waited ~5 s to close,
    # for a partition it would never use.
    client = KafkaStore(kafka_settings, reply_timeout_s=scaled(5.0))
    await client.start()
    claim = client._claim
    assert claim is not None
    await client.stop()

    assert claim.partition is None, "the stop waited for the group to give it a partition"
