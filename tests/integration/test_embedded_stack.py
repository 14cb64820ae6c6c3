"""The embedded stack and the kit's broker settings, against the real Tansu and SecantusDB."""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from faststream.middlewares import AckPolicy
from pymongo import AsyncMongoClient

from quipu.contracts.topics import TOPICS, Topic, topic_names
from quipu.deploy.local.stack import (
    BOOTSTRAP_ENV,
    MONGO_URI_ENV,
    EmbeddedStack,
    create_topics,
    delete_topics,
)
from quipu.services.kit.broker import make_broker, subscriber_options, topic
from quipu.services.kit.settings import KafkaSettings
from tests.conftest import EventLoopWatchdog
from tests.timing import scaled

Document = dict[str, Any]


async def _describe(bootstrap: str, names: list[str]) -> dict[str, int]:
    """Partition count of each named topic that exists."""
    if not names:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        present = [name for name in names if name in existing]
        # An empty list would describe every topic of the broker.
        described = await admin.describe_topics(present) if present else []
    finally:
        await admin.close()
    return {item["topic"]: len(item["partitions"]) for item in described}


def test_stack_gives_endpoints(stack: EmbeddedStack) -> None:
    host, _, port = stack.bootstrap.rpartition(":")
    assert host and port.isdigit()
    assert stack.mongo_uri.startswith("mongodb://")
    if stack.kafka_is_embedded:
        assert stack.kafka_settings().fetch_max_wait_ms == 10
        assert stack.environment()["QUIPU_KAFKA_FLAVOUR"] == "tansu"
    if not os.environ.get(MONGO_URI_ENV):
        assert "retryWrites=false" in stack.mongo_uri


async def test_every_registry_topic_and_its_dlq_exist(stack: EmbeddedStack, topic_prefix: str) -> None:
    partitions = await _describe(stack.bootstrap, topic_names(topic_prefix))

    expected = {}
    for spec in TOPICS:
        expected[topic_prefix + spec.topic.value] = spec.partitions
        expected[topic_prefix + spec.topic.dlq] = spec.partitions
    assert partitions == expected


async def test_create_topics_twice_creates_nothing_new(stack: EmbeddedStack, unique: str) -> None:
    prefix = f"{unique}."
    first = await create_topics(stack.bootstrap, prefix)
    second = await create_topics(stack.bootstrap, prefix)
    deleted = await delete_topics(stack.bootstrap, prefix)

    assert sorted(first) == sorted(topic_names(prefix))
    assert second == []
    assert sorted(deleted) == sorted(first)
    assert await _describe(stack.bootstrap, first) == {}


async def test_a_message_round_trips_fast_with_the_kit_settings(
    kafka_settings: KafkaSettings,
) -> None:
    broker = make_broker(kafka_settings, client_id="round-trip")
    arrivals: dict[int, asyncio.Future[float]] = {}
    received: list[dict[str, Any]] = []

    @broker.subscriber(
        topic(kafka_settings, Topic.RUNS_REQUESTED),
        **subscriber_options(kafka_settings, group="round-trip"),
    )
    async def on_message(message: dict[str, Any]) -> None:
        received.append(message)
        arrivals[message["n"]].set_result(time.perf_counter())

    latencies = []
    async with asyncio.timeout(scaled(30)):
        await broker.start()
        try:
            # Fast is the fetch wait: Tansu's fetch long-poll does not wake on new data, so a hop
            # costs about half of it (FastStream's default 500 ms gives ~250 ms, the kit's 10 a few
            # ms). What is checked is that the running consumer fetches with the kit's wait, not
            # how fast this machine is; the latencies are printed for the reader.
            [consumer] = [getattr(subscriber, "consumer", None) for subscriber in broker.subscribers]
            assert consumer is not None
            assert consumer._fetcher._fetch_max_wait_ms == kafka_settings.fetch_max_wait_ms
            for n in range(30):
                # An idle gap, as in real traffic: the consumer waits in a fetch when the
                # message lands, which is where the fetch wait shows (PLATFORM_NOTES).
                await asyncio.sleep(0.02)
                arrivals[n] = asyncio.get_running_loop().create_future()
                sent = time.perf_counter()
                await broker.publish(
                    {"n": n, "text": "hello"},
                    topic(kafka_settings, Topic.RUNS_REQUESTED),
                    key=b"session-1",
                )
                latencies.append(await arrivals[n] - sent)
        finally:
            await broker.stop()

    assert received == [{"n": n, "text": "hello"} for n in range(30)]
    print(f"round trip median {statistics.median(latencies) * 1000:.1f} ms")


async def test_a_handled_message_is_committed_and_not_redelivered(
    kafka_settings: KafkaSettings,
) -> None:
    name = topic(kafka_settings, Topic.TOOLS_CALLS)

    async def consume_once(payload: str) -> list[str]:
        broker = make_broker(kafka_settings)
        seen: list[str] = []
        arrived = asyncio.Event()

        @broker.subscriber(name, **subscriber_options(kafka_settings, group="commit"))
        async def on_message(message: str) -> None:
            seen.append(message)
            arrived.set()

        await broker.start()
        try:
            await broker.publish(payload, name, key=b"run-1")
            await asyncio.wait_for(arrived.wait(), scaled(10))
            await asyncio.sleep(0.3)  # room for a wrongly redelivered message to show up
        finally:
            await broker.stop()
        return seen

    assert await consume_once("first") == ["first"]
    # Same group, offsets reset to earliest: without a commit "first" would come back.
    assert await consume_once("second") == ["second"]


async def test_subscribers_start_together(kafka_settings: KafkaSettings) -> None:
    broker = make_broker(kafka_settings)
    seen: set[str] = set()
    all_seen = asyncio.Event()
    topics = [spec.topic for spec in TOPICS[:4]]
    for each in topics:

        @broker.subscriber(
            topic(kafka_settings, each), **subscriber_options(kafka_settings, group=each.value)
        )
        async def on_message(message: str) -> None:
            seen.add(message)
            if len(seen) == len(topics):
                all_seen.set()

    # Concurrency shown by overlap, not by a clock: every subscriber's start (a group join, ~1 s
    # on Tansu) must have begun before the first of them finished.
    begun: list[str] = []
    first_finished_after: list[int] = []
    for subscriber in broker.subscribers:
        original_start = subscriber.start

        async def start(original: Callable[[], Awaitable[None]] = original_start) -> None:
            begun.append("start")
            await original()
            if not first_finished_after:
                first_finished_after.append(len(begun))

        subscriber.start = start  # type: ignore[method-assign]
    await broker.start()
    try:
        for each in topics:
            await broker.publish(each.value, topic(kafka_settings, each))
        await asyncio.wait_for(all_seen.wait(), scaled(10))
    finally:
        await broker.stop()

    assert seen == {each.value for each in topics}
    assert first_finished_after == [len(topics)]


async def test_mongo_commits_two_inserts_in_one_transaction(stack: EmbeddedStack, unique: str) -> None:
    client: AsyncMongoClient[Document] = AsyncMongoClient(stack.mongo_uri)
    try:
        collection = client[unique]["pairs"]
        await collection.insert_one({"_id": "seed"})  # collections are not created in a txn
        async with client.start_session() as session, await session.start_transaction():
            await collection.insert_one({"_id": "a"}, session=session)
            await collection.insert_one({"_id": "b"}, session=session)
            assert await collection.count_documents({}) == 1  # not visible outside yet
        assert sorted(await collection.distinct("_id")) == ["a", "b", "seed"]
    finally:
        await client.drop_database(unique)
        await client.close()


async def test_mongo_aborts_both_inserts_when_the_transaction_fails(
    stack: EmbeddedStack, unique: str
) -> None:
    client: AsyncMongoClient[Document] = AsyncMongoClient(stack.mongo_uri)
    try:
        collection = client[unique]["pairs"]
        await collection.insert_one({"_id": "seed"})
        with pytest.raises(RuntimeError, match="fail after the writes"):
            async with client.start_session() as session, await session.start_transaction():
                await collection.insert_one({"_id": "a"}, session=session)
                await collection.insert_one({"_id": "b"}, session=session)
                raise RuntimeError("fail after the writes")
        assert await collection.distinct("_id") == ["seed"]
    finally:
        await client.drop_database(unique)
        await client.close()


def _process_group_members(pgids: set[int]) -> set[int]:
    """Live processes (not zombies) in any of the given process groups, read from /proc."""
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgid = fields[0], int(fields[2])
        if pgid in pgids and state != "Z":
            members.add(int(entry.name))
    return members


def _stack_workdirs() -> set[Path]:
    """This process's embedded stacks' temporary directories (other runs may share /tmp)."""
    mine = str(os.getpid())
    return {
        path
        for path in Path(tempfile.gettempdir()).glob("quipu-stack-*")
        if (path / "owner.pid").exists() and (path / "owner.pid").read_text() == mine
    }


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
async def test_stop_leaves_no_process_and_no_directory_behind() -> None:
    own = EmbeddedStack(environ={}, create_registry_topics=False)
    before = _stack_workdirs()
    await own.astart()
    pids = set(own.pids)
    workdirs = _stack_workdirs() - before
    assert len(pids) == 2
    assert len(workdirs) == 1
    assert _process_group_members(pids) >= pids  # each child leads its own group

    await own.astop()

    assert _process_group_members(pids) == set()
    assert not any(path.exists() for path in workdirs)
    with pytest.raises(RuntimeError, match="not started"):
        _ = own.bootstrap


def test_external_endpoints_start_nothing(stack: EmbeddedStack) -> None:
    external = EmbeddedStack(
        environ={BOOTSTRAP_ENV: stack.bootstrap, MONGO_URI_ENV: stack.mongo_uri},
        create_registry_topics=False,
    )
    with external:
        assert external.pids == []
        assert external.bootstrap == stack.bootstrap
        assert external.mongo_uri == stack.mongo_uri
        assert external.kafka_flavour == "kafka"  # unless QUIPU_KAFKA_FLAVOUR says otherwise


@pytest.mark.allow_event_loop_blocking
async def test_the_watchdog_catches_a_blocking_call_and_ignores_awaiting() -> None:
    threshold = scaled(0.2)
    watchdog = EventLoopWatchdog(threshold=threshold, interval=0.02)
    watchdog.start()
    await asyncio.sleep(2.5 * threshold)  # waiting is not blocking
    time.sleep(2.5 * threshold)  # noqa: ASYNC251 - the blocking call under test
    await asyncio.sleep(0.1)
    await watchdog.stop()

    assert len(watchdog.stalls) == 1
    assert watchdog.stalls[0].seconds >= 1.5 * threshold
    assert "test_the_watchdog_catches_a_blocking_call" in watchdog.stalls[0].stack


@pytest.mark.allow_event_loop_blocking
async def test_the_watchdog_does_not_blame_the_loop_for_a_starved_process() -> None:
    # Another thread holding the GIL (a C-level loop never yields it) starves the idle loop, as a
    # busy CI machine does: the loop sits in its selector, and no callback of its holds it.
    loop = asyncio.get_running_loop()
    go, done = threading.Event(), asyncio.Event()

    def starve() -> None:
        go.wait()
        sum(range(3 * 10**7))
        loop.call_soon_threadsafe(done.set)

    starving = threading.Thread(target=starve)
    starving.start()  # started first: Thread.start itself waits, in the loop's thread
    watchdog = EventLoopWatchdog(threshold=0.1, interval=0.02)
    watchdog.start()
    await asyncio.sleep(0.05)
    go.set()
    await done.wait()
    await watchdog.stop()
    starving.join()

    assert watchdog.stalls == []


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No QUIPU_KAFKA_* variable from the caller's shell changes the settings under test."""
    for name in list(os.environ):
        if name.startswith("QUIPU_KAFKA_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_environment")
def test_kafka_settings_keep_production_defaults_unless_tansu() -> None:
    real = KafkaSettings(bootstrap="kafka:9092")
    tansu = KafkaSettings.for_embedded("127.0.0.1:9092", fetch_max_wait_ms=1)

    assert (real.enable_idempotence, real.acks, real.fetch_max_wait_ms) == (True, "all", 500)
    assert (real.session_timeout_ms, real.heartbeat_interval_ms) == (10_000, 3_000)
    assert (tansu.enable_idempotence, tansu.acks, tansu.fetch_max_wait_ms) == (False, "all", 1)
    assert (tansu.session_timeout_ms, tansu.heartbeat_interval_ms) == (2_000, 500)
    assert tansu.auto_offset_reset == "earliest"


@pytest.mark.usefixtures("clean_environment")
def test_subscriber_options_apply_the_settings_and_refuse_at_most_once() -> None:
    settings = KafkaSettings.for_embedded("127.0.0.1:9092", topic_prefix="p.")
    options = subscriber_options(settings, group="planner")

    assert options["group_id"] == "p.planner"
    assert options["ack_policy"] is AckPolicy.ACK
    assert options["auto_offset_reset"] == "earliest"
    assert (options["fetch_max_wait_ms"], options["session_timeout_ms"]) == (10, 2_000)
    assert options["heartbeat_interval_ms"] == 500
    assert topic(settings, Topic.RUNS_REQUESTED.dlq) == "p.runs.requested.dlq"
    with pytest.raises(ValueError, match="not allowed"):
        subscriber_options(settings, group="planner", ack_policy=AckPolicy.ACK_FIRST)
