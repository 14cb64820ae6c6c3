"""Forgetting a person, end to end: after `forget`, nothing of theirs is readable anywhere.

Real service processes (owner, planner, tool executor, transcript recorder) on the embedded
broker and database. A person says a phrase in one turn (the scripted model echoes it, so their
model's answer carries it too) and has a second turn suspended on a question that repeats
another phrase (it rests in the checkpoint). Then the principal is forgotten through the owner,
as `quipu memory forget` does, and the test searches every collection of the database, every
record of every topic (dead-letter topics included: keys, values and headers, opened with the
principals' keys wherever a message is sealed) and every service's log for either phrase: nothing
readable. A bystander in another session keeps every word.

The services seal their topics (the owner's key endpoint hands out the keys), and the turns are
published as the gateway and `quipu run` publish them, sealed too. Before the forget the test also
takes the paths that name no one or someone else: a cancel after the end, an answer from a client
naming no principal, a listing of the (owner-less) session, a read of erin's run asked for bruno.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from quipu.contracts.errors import StoreError
from quipu.contracts.runs import RunKind, RunRequested
from quipu.contracts.store import RunStatus
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import TranscriptErasedError
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.run_publisher import KafkaRunPublisher
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.sealing import sealing_for
from tests.e2e.agent_support import Deployment, eventually
from tests.owner_support import (
    client_on,
    every_record_on_topics,
    opened_with_existing_keys,
    readable_anywhere,
    resting_bytes,
)
from tests.timing import scaled

pytestmark = pytest.mark.timeout(300)

TENANT = "t-erase"


async def _sealed_publisher(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> KafkaRunPublisher:
    """A run publisher as the gateway and `quipu run` are: sealing with the deployment's keys, with a
    key cache of its own (closed with the deployment)."""
    monkeypatch.setenv("QUIPU_KEYS_URL", deployment.keys.url)
    assert deployment.keys.token is not None
    monkeypatch.setenv("QUIPU_KEYS_TOKEN", deployment.keys.token.get_secret_value())
    publisher = KafkaRunPublisher(deployment.stack.kafka_settings(topic_prefix=deployment.prefix))
    await publisher.start()
    deployment.on_close(publisher.stop)
    return publisher


async def _turn(publisher: KafkaRunPublisher, session_id: str, principal_id: str, text: str) -> RunRequested:
    request = RunRequested(
        run_id="r-" + uuid.uuid4().hex,
        session_id=session_id,
        agent_id="assistant",
        principal_id=principal_id,
        tenant_id=TENANT,
        text=text,
    )
    await publisher.publish(request)
    return request


async def _answer(publisher: KafkaRunPublisher, suspended: RunRequested, answer: str) -> RunRequested:
    request = RunRequested(
        kind=RunKind.RESUME,
        run_id="r-" + uuid.uuid4().hex,
        session_id=suspended.session_id,
        agent_id=suspended.agent_id,
        tenant_id=TENANT,
        predecessor_run_id=suspended.run_id,
        answer=answer,
    )
    await publisher.publish(request)
    return request


async def _told_twice(deployment: Deployment, run_id: str) -> bool:
    """Whether the finished turn of `run_id` is on history.turns twice (once more after the cancel)."""
    found = await every_record_on_topics(deployment.stack.bootstrap, deployment.prefix)
    turns = found[deployment.prefix + Topic.HISTORY_TURNS.value]
    return sum(run_id.encode() in (record.value or b"") for record in turns) >= 2


async def _recorder_has_every_turn(deployment: Deployment) -> bool:
    """Whether the recorder has handled (committed) every turn on history.turns, the end told
    again included: one it handles after the forget must be refused (see the test)."""
    topic = deployment.prefix + Topic.HISTORY_TURNS.value
    found = await every_record_on_topics(deployment.stack.bootstrap, deployment.prefix)
    ends: dict[int, int] = {}
    for record in found[topic]:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    # Not subscribed, so it never joins the recorder's group: it only reads its committed offsets.
    reader = AIOKafkaConsumer(
        bootstrap_servers=deployment.stack.bootstrap,
        group_id=deployment.prefix + "transcript-recorder",
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        for partition, end in ends.items():
            committed = await reader.committed(TopicPartition(topic, partition))
            if committed is None or committed < end:
                return False
        return True
    finally:
        await reader.stop()


async def _database_dump(stack: EmbeddedStack, database: str) -> bytes:
    """Every document of every collection of the deployment's database, as raw BSON."""
    client = client_on(stack.mongo_uri)
    try:
        return await resting_bytes(client[database])
    finally:
        await client.close()


def _service_logs(folder: Path) -> bytes:
    """Everything every service process logged."""
    return b"".join(path.read_bytes() for path in sorted(folder.glob("*.log")))


async def _until_status(deployment: Deployment, run_id: str, status: RunStatus) -> None:
    async def reached() -> bool:
        try:
            return (await deployment.store.load_run(run_id)).status is status
        except StoreError:
            return False  # not started yet

    await eventually(reached, 60, f"run {run_id} {status.value}")


async def _readable_on_topics(deployment: Deployment, phrases: tuple[str, ...]) -> dict[str, list[str]]:
    """Where any phrase is readable on any topic of the deployment, its sealed messages opened with
    whatever key still exists (a fresh key client: no cache of this test's making)."""
    found = await every_record_on_topics(deployment.stack.bootstrap, deployment.prefix)
    opened = await opened_with_existing_keys(found, deployment.keys)
    return {phrase: readable_anywhere(opened, phrase) for phrase in phrases}


async def test_after_forget_nothing_of_the_principal_is_readable_in_any_collection_topic_or_log(
    stack: EmbeddedStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"erase{uuid.uuid4().hex[:8]}"
    said, asked, kept = (f"{word}{uuid.uuid4().hex[:8]}" for word in ("tangerine", "quince", "lemon"))
    async with Deployment(stack, f"{name}.", name, tmp_path, sealed=True) as deployment:
        deployment.start_recorder()
        publisher = await _sealed_publisher(deployment, monkeypatch)
        session_id, other_session = await deployment.session(), await deployment.session()
        first = await _turn(publisher, session_id, "erin", f"my locker code is {said}")
        await _until_status(deployment, first.run_id, RunStatus.COMPLETED)
        second = await _turn(publisher, session_id, "erin", f"ask me whether {asked} is ripe")
        await _until_status(deployment, second.run_id, RunStatus.SUSPENDED)
        bystander = await _turn(publisher, other_session, "bruno", f"my locker code is {kept}")
        await _until_status(deployment, bystander.run_id, RunStatus.COMPLETED)
        # A cancel that comes after the end (the planner tells the end again), and an answer from
        # a client that names no one (the continuation is still erin's run): both about erin.
        await deployment.cancel(first.run_id, session_id)
        await eventually(lambda: _told_twice(deployment, first.run_id), 60, "the end told again")
        answered = await _answer(publisher, second, "yes")
        await _until_status(deployment, answered.run_id, RunStatus.COMPLETED)

        memory = KafkaMemoryStore(deployment.store)
        # A read by session id names no principal: a reader says whose (the gateway: the session's owner).
        with sealing_for(TENANT, "erin"):
            recorded = await eventually(
                lambda: memory.list_history(session_id, 0, 10), 30, "erin's turn in the history"
            )
        assert any(said in row.text for row in recorded)
        # The session was created without an owner (as `quipu run --session` does) and is listed by
        # a reader naming no one; erin's run is read by someone working for bruno: both readings
        # come back under erin's key, whoever asked.
        page = await deployment.store.list_session_run_records(session_id, "", 50)
        assert any(said.encode() in record.payload for record in page.records)
        with sealing_for(TENANT, "bruno"):
            await deployment.store.list_run_records(first.run_id, "", 50)
        before = await _database_dump(stack, name)
        assert said.encode() not in before  # sealed at rest even before forgetting
        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        # Before forgetting, no topic shows the words without a key ...
        assert [place for phrase in (said, asked, kept) for place in readable_anywhere(wire, phrase)] == []
        # ... and with the keys they open (this search can find them).
        assert all((await _readable_on_topics(deployment, (said, asked, kept))).values())

        # Forget while the recorder may still be handling erin's turns (the end told again is
        # likeliest): one it handles after the forget must be refused, not written under a new key.
        await memory.forget_principal(TENANT, "erin")
        await eventually(lambda: _recorder_has_every_turn(deployment), 60, "every turn handled")

        dump = await _database_dump(stack, name)
        for phrase in (said, asked):
            assert phrase.encode() not in dump, phrase
        assert await memory.list_history(session_id, 0, 10) == []
        for run_id in (first.run_id, second.run_id):
            with pytest.raises(TranscriptErasedError):
                await build_messages_from_run_log(deployment.store, run_id)
        kept_messages = await build_messages_from_run_log(deployment.store, bystander.run_id)
        assert any(kept in str(message.model_dump()) for message in kept_messages)
        # Every topic, dead letters included: nothing of erin opens any more.
        after = await _readable_on_topics(deployment, (said, asked, kept))
        assert after[said] == after[asked] == [], after
        assert after[kept]  # the bystander's words still open
        # No service logged the words (logs never carry input values).
        logs = await asyncio.to_thread(_service_logs, tmp_path)
        assert logs and not any(phrase.encode() in logs for phrase in (said, asked, kept))


def _tool_done(deployment: Deployment, run_id: str) -> bool:
    """Whether the run's tool call has ended, by itself or at its deadline."""
    return any(execution.event in ("end", "canceled") for execution in deployment.executions(run_id))


async def _caught_up(deployment: Deployment, groups: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether every consumer group (prefixed) has committed past every record of its topics
    (prefixed names, or name prefixes ending in "."), read outside the groups: their commits are
    read first and the topics' ends after, so nothing can have been published in between unseen."""
    reader = AIOKafkaConsumer(bootstrap_servers=deployment.stack.bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        existing = await reader.topics()
        committed: dict[tuple[str, TopicPartition], int] = {}
        for group, names in groups.items():
            topics = [
                topic
                for topic in sorted(existing)
                for name in names
                if topic == deployment.prefix + name
                or (name.endswith(".") and topic.startswith(deployment.prefix + name) and ".dlq" not in topic)
            ]
            looking = AIOKafkaConsumer(
                bootstrap_servers=deployment.stack.bootstrap,
                group_id=deployment.prefix + group,
                enable_auto_commit=False,
            )
            await looking.start()
            try:
                for topic in topics:
                    for number in sorted(reader.partitions_for_topic(topic) or ()):
                        partition = TopicPartition(topic, number)
                        committed[(group, partition)] = await looking.committed(partition) or 0
            finally:
                await looking.stop()
        ends = await reader.end_offsets(list({partition for _, partition in committed}))
        return all(position >= ends[partition] for (_, partition), position in committed.items())
    finally:
        await reader.stop()


async def test_a_run_in_flight_across_the_forget_publishes_none_of_its_words_again(
    stack: EmbeddedStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """erin's run is calling a slow tool (past its 2 s deadline) when she is forgotten, and comes
    back (a new key) before it answers. Every service's key cache lets go of her old key meanwhile
    (a short TTL). What the run would still seal (the tool's answer, the run's end, the finished
    turn with her question) would be readable under the new key: none of it is published or written."""
    name = f"erase{uuid.uuid4().hex[:8]}"
    said, back = f"plum{uuid.uuid4().hex[:8]}", f"fig{uuid.uuid4().hex[:8]}"
    slow = scaled(4.0)
    deployment = Deployment(stack, f"{name}.", name, tmp_path, sealed=True, tool_delays={"calculator": slow})
    deployment.environment["QUIPU_KEYS_CACHE_TTL_S"] = "0.5"
    deployment.owner.environment["QUIPU_KEYS_CACHE_TTL_S"] = "0.5"
    async with deployment:
        deployment.start_recorder()
        publisher = await _sealed_publisher(deployment, monkeypatch)
        session_id = await deployment.session()
        asked = await _turn(publisher, session_id, "erin", f"my locker code is {said}, calculate 6*7")
        await eventually(lambda: deployment.executions(asked.run_id), 60, "the slow tool called")

        memory = KafkaMemoryStore(deployment.store)
        await memory.forget_principal(TENANT, "erin")
        # She comes back through a client that holds no key of hers (the first one's cache would
        # still seal under the shredded key for its TTL: her new words would read as erased).
        returning = await _sealed_publisher(deployment, monkeypatch)
        again = await _turn(returning, await deployment.session(), "erin", f"hello, I am back: {back}")
        await _until_status(deployment, again.run_id, RunStatus.COMPLETED)
        await eventually(lambda: _tool_done(deployment, asked.run_id), 60, "the slow tool done")
        groups = {
            "tool-executor": ("tools.calls.",),
            "planner-results": (Topic.TOOLS_RESULTS.value,),
            "storage-owner": (Topic.STORAGE_COMMANDS.value,),
            "transcript-recorder": (Topic.HISTORY_TURNS.value,),
        }
        await eventually(lambda: _caught_up(deployment, groups), 60, "every service done with it")

        dump = await _database_dump(stack, name)
        assert said.encode() not in dump
        found = await _readable_on_topics(deployment, (said, back))
        assert found[said] == [], found
        assert found[back]  # what she said after the forget is hers to keep, and readable
