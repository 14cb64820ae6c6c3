"""ConcurrentConsumer: keys in order, keys side by side, commits never past a message not done."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from faststream.kafka.annotations import KafkaMessage
from pydantic import TypeAdapter

from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, by_kafka_key, let_order_go
from quipu.services.kit.delivery import ConsumedMessage, Delivery, RetryableError, RetryPolicy
from quipu.services.kit.keyed_locks import KeyedLocks
from tests.timing import eventually, scaled

TOPIC = "runs.requested"
TEXT = TypeAdapter(str)


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass
class Commits:
    positions: list[tuple[int, int]] = field(default_factory=list)

    async def commit(self, offsets: dict[Any, int]) -> None:
        for partition, position in offsets.items():
            self.positions.append((partition.partition, position))


@dataclass
class Message:
    body: bytes
    raw_message: Record
    consumer: Commits
    headers: dict[str, Any] = field(default_factory=dict)


class Letters:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        self.sent.append((topic, headers))


def _message(commits: Commits, offset: int, key: str, body: str, partition: int = 0) -> KafkaMessage:
    record = Record(TOPIC, partition, offset, key.encode())
    return cast(KafkaMessage, Message(f'"{body}"'.encode(), record, commits))


def _consumer(
    effect: Any,
    *,
    ordered: bool = True,
    max_in_flight: int = 16,
    letters: Letters | None = None,
    revoke_grace_s: float = 1.0,
    commit_linger_s: float = 0.0,
) -> ConcurrentConsumer:
    delivery = Delivery(letters or Letters(), RetryPolicy(attempts=1))
    return ConcurrentConsumer(
        lambda message: delivery.handle(message, TEXT, effect),
        name="test",
        max_in_flight=max_in_flight,
        revoke_grace_s=revoke_grace_s,
        order=by_kafka_key if ordered else None,
        redeliver_after_s=0.01,
        commit_linger_s=commit_linger_s,
    )


async def _handlers_done(consumer: ConcurrentConsumer) -> None:
    for _ in range(500):
        if consumer.in_flight() == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("messages still in flight")


async def _settled(consumer: ConcurrentConsumer) -> None:
    """Every message handled and committed."""
    await _handlers_done(consumer)
    await consumer.flush()


async def test_one_key_runs_in_order_while_other_keys_run_beside_it() -> None:
    gates = {"a1": asyncio.Event()}
    events: list[str] = []

    async def effect(body: str) -> None:
        events.append(f"start {body}")
        if body in gates:
            await gates[body].wait()
        events.append(f"end {body}")

    commits = Commits()
    consumer = _consumer(effect)
    for offset, (key, body) in enumerate([("a", "a1"), ("a", "a2"), ("b", "b1")]):
        await consumer.dispatch(_message(commits, offset, key, body))
    await asyncio.sleep(0.05)
    # b1 finished while a1 is held; a2 waits behind a1.
    assert events == ["start a1", "start b1", "end b1"]
    assert all(position <= 0 for _, position in commits.positions)  # offset 0 is not done
    gates["a1"].set()
    await _settled(consumer)
    assert events[3:] == ["end a1", "start a2", "end a2"]
    assert commits.positions[-1] == (0, 3)


async def test_a_message_that_lets_its_order_go_is_followed_at_once_and_still_committed_last() -> None:
    # The owner, once a command that justifies only its reply has committed and queued it: the
    # session's next command need not wait for the broker's acknowledgement of that reply.
    acknowledged = asyncio.Event()
    events: list[str] = []

    async def effect(body: str) -> None:
        events.append(f"start {body}")
        if body == "a1":
            let_order_go()
            let_order_go()  # once is what counts
            await acknowledged.wait()
        events.append(f"end {body}")

    commits = Commits()
    consumer = _consumer(effect)
    for offset, body in enumerate(["a1", "a2", "a3"]):
        await consumer.dispatch(_message(commits, offset, "a", body))

    async def a3_ended() -> bool:
        return "end a3" in events

    await eventually(a3_ended, within=5, what="the messages after the one that let its order go")
    assert events == ["start a1", "start a2", "end a2", "start a3", "end a3"]
    await asyncio.sleep(0)
    assert all(position == 0 for _, position in commits.positions)  # offset 0 is not done
    acknowledged.set()
    await _settled(consumer)
    assert commits.positions[-1] == (0, 3)


async def test_a_key_let_go_lets_its_next_holder_in_and_outside_a_handler_nothing_is_let_go() -> None:
    let_order_go()
    locks: KeyedLocks[str] = KeyedLocks()
    async with locks.hold("k") as let_go:
        let_go()
        let_go()
        async with locks.hold("k"):  # the next holder is in at once
            assert len(locks) == 1
    assert len(locks) == 0


async def test_unordered_messages_of_one_key_run_together() -> None:
    running = 0
    peak = 0

    async def effect(_body: str) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    commits = Commits()
    consumer = _consumer(effect, ordered=False)
    for offset in range(4):
        await consumer.dispatch(_message(commits, offset, "run-1", f"call {offset}"))
    await _settled(consumer)
    assert peak == 4
    assert commits.positions[-1] == (0, 4)


async def test_a_message_whose_retries_ran_out_is_handled_again_before_its_key_moves_on() -> None:
    attempts: list[str] = []

    async def effect(body: str) -> None:
        attempts.append(body)
        if body == "flaky" and attempts.count("flaky") < 3:
            raise RetryableError("the store is away")

    commits = Commits()
    consumer = _consumer(effect)
    await consumer.dispatch(_message(commits, 0, "s", "flaky"))
    await consumer.dispatch(_message(commits, 1, "s", "next"))
    await _settled(consumer)
    assert attempts == ["flaky", "flaky", "flaky", "next"]
    assert commits.positions[-1] == (0, 2)


async def test_an_invalid_message_is_dead_lettered_and_committed() -> None:
    seen: list[str] = []

    async def effect(body: str) -> None:
        seen.append(body)

    letters = Letters()
    commits = Commits()
    consumer = _consumer(effect, letters=letters)
    record = Record(TOPIC, 0, 0, b"s")
    await consumer.dispatch(cast(KafkaMessage, Message(b"{not json", record, commits)))
    await consumer.dispatch(_message(commits, 1, "s", "fine"))
    await _settled(consumer)
    assert seen == ["fine"]
    assert [topic for topic, _ in letters.sent] == [f"{TOPIC}.dlq"]
    assert commits.positions[-1] == (0, 2)


async def test_drain_cancels_what_did_not_finish_and_commits_nothing_past_it() -> None:
    async def effect(body: str) -> None:
        if body == "stuck":
            await asyncio.Event().wait()

    commits = Commits()
    consumer = _consumer(effect)
    await consumer.dispatch(_message(commits, 0, "a", "stuck"))
    await consumer.dispatch(_message(commits, 1, "b", "quick"))
    await asyncio.sleep(0.02)
    await consumer.drain(0.05)
    assert consumer.in_flight() == 0
    assert all(position <= 0 for _, position in commits.positions)  # offset 0 comes back
    await consumer.dispatch(_message(commits, 2, "c", "late"))  # after drain: not taken
    assert consumer.in_flight() == 0


async def test_a_full_consumer_takes_no_more_until_a_slot_frees() -> None:
    gate = asyncio.Event()

    async def effect(_body: str) -> None:
        await gate.wait()

    commits = Commits()
    consumer = _consumer(effect, max_in_flight=2)
    await consumer.dispatch(_message(commits, 0, "a", "one"))
    await consumer.dispatch(_message(commits, 1, "b", "two"))
    third = asyncio.create_task(consumer.dispatch(_message(commits, 2, "c", "three")))
    await asyncio.sleep(0.02)
    assert not third.done()
    gate.set()
    await third
    await _settled(consumer)
    assert commits.positions[-1] == (0, 3)


async def test_a_broker_failure_while_handling_is_tried_again_not_left_behind() -> None:
    calls = 0

    async def handle(message: ConsumedMessage) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KafkaConnectionError("the broker is away")
        await message.ack()

    commits = Commits()
    consumer = ConcurrentConsumer(
        handle, name="test", max_in_flight=4, revoke_grace_s=1.0, order=by_kafka_key, redeliver_after_s=0.01
    )
    await consumer.dispatch(_message(commits, 0, "s", "once"))
    await _settled(consumer)
    assert calls == 2
    assert commits.positions[-1] == (0, 1)


async def test_an_order_key_that_cannot_be_read_falls_back_to_the_kafka_key() -> None:
    seen: list[str] = []

    async def effect(body: str) -> None:
        seen.append(body)

    def by_body(message: KafkaMessage) -> bytes | None:
        json.loads(message.body)  # a deeply nested body raises RecursionError here
        return b"principal"

    commits = Commits()
    delivery = Delivery(Letters(), RetryPolicy(attempts=1))
    consumer = ConcurrentConsumer(
        lambda message: delivery.handle(message, TEXT, effect),
        name="test",
        max_in_flight=4,
        revoke_grace_s=1.0,
        order=by_body,
        redeliver_after_s=0.01,
    )
    deep = b"[" * 100_000 + b"]" * 100_000
    await consumer.dispatch(cast(KafkaMessage, Message(deep, Record(TOPIC, 0, 0, b"s"), commits)))
    await consumer.dispatch(_message(commits, 1, "s", "after"))
    await _settled(consumer)
    assert seen == ["after"]
    assert commits.positions[-1] == (0, 2), "the unreadable message was settled (dead-lettered)"


async def test_a_handler_that_keeps_raising_is_skipped_after_bounded_tries() -> None:
    calls: list[int] = []

    async def handle(message: ConsumedMessage) -> None:
        offset = message.raw_message.offset
        calls.append(offset)
        if offset == 0:
            raise RecursionError("maximum recursion depth exceeded")
        await message.ack()

    commits = Commits()
    consumer = ConcurrentConsumer(
        handle,
        name="test",
        max_in_flight=4,
        revoke_grace_s=1.0,
        order=by_kafka_key,
        redeliver_after_s=0.01,
        handle_attempts=3,
    )
    await consumer.dispatch(_message(commits, 0, "s", "poison"))
    await consumer.dispatch(_message(commits, 1, "s", "next"))
    await _settled(consumer)
    assert calls == [0, 0, 0, 1]
    assert consumer.skipped == 1
    assert commits.positions[-1] == (0, 2)


async def test_each_rebalance_that_assigns_partitions_is_told_to_whoever_asked() -> None:
    """The planner drops the views it kept of runs whose results another copy may have taken."""
    told: list[str] = []
    consumer = ConcurrentConsumer(
        lambda message: asyncio.sleep(0),
        name="test",
        max_in_flight=1,
        revoke_grace_s=1.0,
        order=None,
        on_assigned=lambda: told.append("assigned"),
    )
    await consumer.listener.on_partitions_revoked({TopicPartition(TOPIC, 0)})
    assert told == []
    await consumer.listener.on_partitions_assigned({TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)})
    assert told == ["assigned"]


@dataclass
class HeldCommits:
    """A consumer whose first commit waits for `release`; every commit's offsets, by call."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[dict[int, int]] = field(default_factory=list)

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.calls.append({partition.partition: position for partition, position in offsets.items()})
        if len(self.calls) == 1:
            await self.release.wait()


def _held_message(commits: HeldCommits, partition: int, offset: int) -> KafkaMessage:
    record = Record(TOPIC, partition, offset, f"key {partition}".encode())
    return cast(KafkaMessage, Message(b'"done"', record, cast(Commits, commits)))


async def _one_commit_begun(commits: HeldCommits) -> None:
    for _ in range(500):
        if commits.calls:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no commit began")


async def test_messages_that_finish_while_a_commit_is_in_flight_share_the_next_one() -> None:
    # One commit request for every partition that moved, not one a message: under load the
    # commits were an eighth of a run's broker requests.
    async def effect(_body: str) -> None:
        return None

    commits = HeldCommits()
    consumer = _consumer(effect)
    await consumer.dispatch(_held_message(commits, 0, 0))
    await _one_commit_begun(commits)
    for partition, offset in [(0, 1), (1, 0), (2, 0), (2, 1)]:
        await consumer.dispatch(_held_message(commits, partition, offset))
    await _handlers_done(consumer)
    assert commits.calls == [{0: 1}]  # the first still in flight; the slots are free meanwhile
    commits.release.set()
    await consumer.flush()
    assert commits.calls == [{0: 1}, {0: 2, 1: 1, 2: 2}]


async def test_a_revoke_and_a_drain_commit_what_was_settled_before_they_end() -> None:
    async def effect(_body: str) -> None:
        return None

    commits = HeldCommits()
    commits.release.set()
    consumer = _consumer(effect)
    await consumer.dispatch(_held_message(commits, 0, 0))
    await consumer.dispatch(_held_message(commits, 1, 0))
    await consumer.listener.on_partitions_revoked({TopicPartition(TOPIC, 0)})
    assert any(call.get(0) == 1 for call in commits.calls)  # before another copy takes it
    await consumer.dispatch(_held_message(commits, 1, 1))
    await consumer.drain(1.0)
    assert commits.calls[-1] == {1: 2}


async def test_a_revoke_and_a_drain_whose_commit_does_not_return_end_within_their_grace() -> None:
    # A commit waits for the broker as long as it is away: the rebalance must not wait with it.
    async def effect(_body: str) -> None:
        return None

    commits = HeldCommits()  # never released
    consumer = _consumer(effect, revoke_grace_s=0.05)
    await consumer.dispatch(_held_message(commits, 0, 0))
    await _one_commit_begun(commits)
    await asyncio.wait_for(consumer.listener.on_partitions_revoked({TopicPartition(TOPIC, 0)}), timeout=10)
    await asyncio.wait_for(consumer.drain(0.05), timeout=10)
    commits.release.set()
    await consumer.flush()


@dataclass
class CountedCommits(Commits):
    calls: int = 0

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.calls += 1
        await super().commit(offsets)


async def _commits_of_messages_handled_one_after_another(linger_s: float) -> CountedCommits:
    async def effect(body: str) -> None:
        pass

    consumer = _consumer(effect, commit_linger_s=linger_s)
    commits = CountedCommits()
    for offset in range(6):
        await consumer.dispatch(_message(commits, offset // 2, f"k{offset}", "body", partition=offset % 2))
        await _handlers_done(consumer)
        await asyncio.sleep(0)  # a commit due without a linger goes out now
    await consumer.flush()
    return commits


async def test_offsets_of_messages_handled_within_the_linger_go_in_one_commit() -> None:
    lingering = await _commits_of_messages_handled_one_after_another(scaled(1.0))
    assert lingering.calls == 1
    assert sorted(lingering.positions) == [(0, 3), (1, 3)]
    at_once = await _commits_of_messages_handled_one_after_another(0.0)
    assert at_once.calls == 6
