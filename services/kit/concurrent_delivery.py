"""Concurrent consumption whose commits never pass a message that is not done.

FastStream's consume loop awaits each message before it fetches the next, so a subscriber works
on one message at a time: a planner waiting on the store for one run holds every other run. And
its manual `ack()` commits everything the consumer has read, so acking a message that finished
early would commit past messages still running. `ConcurrentConsumer` hands each message to a
task (at most `max_in_flight` at once; the subscriber blocks when all are busy), goes through
`Delivery` in that task (decode, effect with retries, DLQ), and commits each partition only up to
its oldest message not yet done (`OffsetLedger`). A crash re-delivers every unfinished message,
never skips one.

- `order`: messages with the same order key (by default the Kafka key, the order a producer relies
  on when it keys by session) are handled one after the other, in the order consumed; different
  keys run concurrently. Without one every message runs at once (a model's parallel tool calls
  share a key and must run together). A handler that has done all the next message of its key
  must follow says so (`let_order_go`): the next starts while it finishes (the owner: once a
  command whose commit justifies nothing but its reply has committed and queued that reply).
- A message whose retries ran out (`Delivery` nacks it) is handled again after
  `redeliver_after_s`, still holding its key, as a rewind would; it is never skipped.
- No exception ends a task without settling its message. `handle` raising (it should not:
  `Delivery.handle` settles everything) is tried again `handle_attempts` times, then the message is
  logged with its coordinates and skipped (`skipped` counts them); an order key that cannot be
  read from the message falls back to its Kafka key.
- A consumer has one commit in flight at a time, of every partition that moved since the last:
  a message's slot does not wait for its commit, and the messages that finish while a commit is in
  flight share the next. A revoke and a drain wait for the commits of what was settled.
- When partitions move to another copy, their messages in flight get `revoke_grace_s` to finish
  and commit; on shutdown `drain` gives them a grace, then cancels the rest (delivered again).
- A message is marked `first_delivery` (`kit.delivery.first_delivery`) when no earlier handling of
  it can exist: its offset is at or past the partition's high watermark as the first fetch of this
  assignment reported it (what was already in the partition then may have been begun by its
  previous owner), on its first pass (not handled again after a nack). The watermark is read as
  soon as a fetch of the assignment reported it (an empty one too), else at the assignment's first
  message: from that fetch or a later one, so never lower than it was (watermarks only grow).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy

from quipu.contracts.topics import Topic
from quipu.services.kit import fetch_pace
from quipu.services.kit.broker import InLoopKafkaMessage, subscriber_options, topic
from quipu.services.kit.delivery import ConsumedMessage, describe_error
from quipu.services.kit.keyed_locks import KeyedLocks
from quipu.services.kit.logging import get_logger
from quipu.services.kit.settings import ConsumerSettings, KafkaSettings

logger = get_logger(__name__)

WATERMARK_POLL_S = 0.005
WATERMARK_WAIT_S = 30.0
"""How long an assignment's first watermarks are looked for: a fetch reports them within its wait."""

OrderKey = Callable[[KafkaMessage], bytes | None]
"""What a message is ordered by: messages with equal keys are handled one at a time, in order."""


_LET_ORDER_GO: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "quipu_let_order_go", default=None
)


def let_order_go() -> None:
    """The message being handled has done everything the next message of its order key must
    follow: that one may start now, while this one finishes (its handler still settles it, and
    its partition is committed only once it has). Nothing for a message handled without an order
    key, or outside a concurrent consumer."""
    let_go = _LET_ORDER_GO.get()
    if let_go is not None:
        let_go()


def by_kafka_key(message: KafkaMessage) -> bytes | None:
    """The message's Kafka key: the order its producer chose (a session, a run)."""
    record: Any = message.raw_message  # one ConsumerRecord (not a batch subscriber)
    key: bytes | None = record.key
    return key


@dataclass(frozen=True)
class Ticket:
    """One consumed message in flight: where it sits, and the assignment it was consumed under."""

    topic: str
    partition: int
    offset: int
    generation: int
    first_delivery: bool = False
    """No earlier handling of the message can exist (the module doc)."""


@dataclass
class _PartitionLedger:
    generation: int
    new_from: int | None
    """The partition's high watermark at the assignment's first message: from there on, messages
    were appended after this consumer owned the partition (None: unknown, none is new)."""
    pending: set[int] = field(default_factory=set)
    next_offset: int = -1
    committed: int = -1

    def position(self) -> int:
        """The offset to commit: the oldest message still pending, or past the newest one begun."""
        return min(self.pending) if self.pending else self.next_offset


class OffsetLedger:
    """Per partition: the messages begun and not yet settled, and how far a commit may go.

    Messages are handled concurrently and finish in any order, but a Kafka commit is one position
    per partition: everything before it counts as done. So the position committed is the oldest
    message still in flight (or past the newest when none is). A message that is never settled
    (the consumer shut down before finishing it) holds its partition's position, so it is
    delivered again. `forget` drops revoked partitions; tickets of the old assignment are then
    ignored.
    """

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _PartitionLedger] = {}
        self._generations = 0
        self._watermarks: dict[tuple[str, int], int] = {}
        """Assigned partitions' first high watermarks, read before their first message came."""

    def watermark(self, topic: str, partition: int, highwater: int) -> None:
        """The first high watermark a fetch of the partition's assignment reported."""
        if (topic, partition) not in self._partitions:
            self._watermarks.setdefault((topic, partition), highwater)

    def begin(self, topic: str, partition: int, offset: int, highwater: int | None = None) -> Ticket:
        """A consumed message starts; `highwater` is its partition's as its consumer knows it now
        (read once per assignment, at its first message)."""
        ledger = self._partitions.get((topic, partition))
        if ledger is None:
            self._generations += 1
            known = self._watermarks.pop((topic, partition), None)
            if known is None and highwater is not None and highwater > offset:
                known = highwater  # from the fetch that brought the message, or a later one
            ledger = self._partitions[(topic, partition)] = _PartitionLedger(self._generations, known)
        ledger.pending.add(offset)
        ledger.next_offset = max(ledger.next_offset, offset + 1)
        new = ledger.new_from is not None and offset >= ledger.new_from
        return Ticket(topic, partition, offset, ledger.generation, first_delivery=new)

    def settle(self, ticket: Ticket) -> None:
        """A message is done (answered, dead-lettered, or canceled with its run)."""
        ledger = self._current(ticket)
        if ledger is not None:
            ledger.pending.discard(ticket.offset)

    def uncommitted(self, ticket: Ticket) -> int | None:
        """The position to commit for the ticket's partition, if it moved past the last commit."""
        ledger = self._current(ticket)
        if ledger is None:
            return None
        position = ledger.position()
        return position if position > ledger.committed else None

    def committed(self, ticket: Ticket, position: int) -> None:
        """A commit of `position` for the ticket's partition succeeded."""
        ledger = self._current(ticket)
        if ledger is not None:
            ledger.committed = max(ledger.committed, position)

    def in_flight(self, topic: str, partition: int) -> int:
        """Messages begun and not settled in a partition."""
        ledger = self._partitions.get((topic, partition))
        return len(ledger.pending) if ledger is not None else 0

    def forget(self, partitions: set[tuple[str, int]]) -> None:
        """Drop revoked partitions: whoever owns them next starts from their committed position."""
        for key in partitions:
            self._partitions.pop(key, None)
            self._watermarks.pop(key, None)

    def _current(self, ticket: Ticket) -> _PartitionLedger | None:
        ledger = self._partitions.get((ticket.topic, ticket.partition))
        if ledger is None or ledger.generation != ticket.generation:
            return None
        return ledger


class _TrackedMessage:
    """A consumed message as `Delivery` sees it: ack settles it in the ledger; nack marks a retry."""

    def __init__(
        self, message: KafkaMessage, ticket: Ticket, consumer: ConcurrentConsumer, *, again: bool
    ) -> None:
        self.body: bytes = message.body
        self.headers: dict[str, Any] = dict(message.headers)
        self.raw_message: Any = message.raw_message
        self.first_delivery = ticket.first_delivery and not again
        """Read by `Delivery` (kit.delivery.first_delivery): never on a pass after a nack."""
        self.nacked = False
        self._kafka_consumer = message.consumer
        self._ticket = ticket
        self._consumer = consumer

    async def ack(self) -> None:
        await self._consumer.settle(self._ticket, self._kafka_consumer)

    async def nack(self) -> None:
        # Left unsettled, so its partition's commit stays before it; handled again shortly.
        self.nacked = True


class ConcurrentConsumer:
    """Handles consumed messages in tasks and commits in order (module doc).

    `handle` takes one message through `Delivery.handle` (or does what it does): it acks the
    message once its effect is durable or dead-lettered, nacks it when it must come again.
    """

    def __init__(
        self,
        handle: Callable[[ConsumedMessage], Awaitable[None]],
        *,
        name: str,
        max_in_flight: int,
        revoke_grace_s: float,
        order: OrderKey | None,
        redeliver_after_s: float = 1.0,
        commit_linger_s: float = 0.0,
        handle_attempts: int = 3,
        on_assigned: Callable[[], None] | None = None,
        on_call: bool = False,
    ) -> None:
        """`on_assigned` is called after each rebalance that gave this consumer its partitions;
        `on_call`: its records come when its service expects them (`expect()`; kit.fetch_pace)."""
        self._handle = handle
        self.on_call = on_call
        self._on_assigned = on_assigned
        self._handle_attempts = handle_attempts
        self.skipped = 0
        """Messages settled without being handled, because `handle` kept raising."""
        self._name = name
        self._slots = asyncio.Semaphore(max_in_flight)
        self._revoke_grace_s = revoke_grace_s
        self._order = order
        self._redeliver_after_s = redeliver_after_s
        self._commit_linger_s = commit_linger_s
        self._ledger = OffsetLedger()
        self._keys: KeyedLocks[bytes | None] = KeyedLocks()
        self._tasks: dict[asyncio.Task[None], Ticket] = {}
        self._due: dict[tuple[str, int], Ticket] = {}
        """The partitions settled since the last commit began, each with its latest ticket."""
        self._committing_with: Any = None
        self._committer: asyncio.Task[None] | None = None
        self._revoking: set[tuple[str, int]] = set()
        self._closing = False
        self.listener = _RebalanceListener(self)
        self.kafka_consumer: Callable[[], Any] = lambda: None
        """The subscriber's aiokafka consumer once it started (None before): its watermarks."""
        self._watermark_reads: set[asyncio.Task[None]] = set()

    def expect(self, records: int) -> None:
        """`records` will come soon (the service sent what they answer): fetch them at once, parked
        or not (kit.fetch_pace; a consumer on call is woken by nothing else)."""
        fetch_pace.expect(self.kafka_consumer(), records)

    def in_flight(self) -> int:
        """Messages being handled or waiting for their key."""
        return len(self._tasks)

    async def dispatch(self, message: InLoopKafkaMessage) -> None:
        """Start one consumed message; returns once it runs (or at once when it must wait for later)."""
        record: Any = message.raw_message  # one ConsumerRecord (not a batch subscriber)
        ticket = self._ledger.begin(
            record.topic, record.partition, record.offset, _highwater(message, record.topic, record.partition)
        )
        if self._stopped(ticket):
            return  # not started, so never settled: delivered again to whoever owns the partition
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            return
        task = asyncio.create_task(self._process(message, ticket), name=f"{self._name} {ticket.offset}")
        self._tasks[task] = ticket
        task.add_done_callback(self._tasks.pop)

    def _stopped(self, ticket: Ticket) -> bool:
        return self._closing or (ticket.topic, ticket.partition) in self._revoking

    async def _process(self, message: KafkaMessage, ticket: Ticket) -> None:
        try:
            if self._order is not None:
                async with self._keys.hold(self._order_key(message)) as let_go:
                    token = _LET_ORDER_GO.set(let_go)
                    try:
                        await self._handle_until_done(message, ticket)
                    finally:
                        _LET_ORDER_GO.reset(token)
            else:
                await self._handle_until_done(message, ticket)
        finally:
            self._slots.release()

    def _order_key(self, message: KafkaMessage) -> bytes | None:
        assert self._order is not None
        try:
            return self._order(message)
        except Exception:
            # An order key read from the body (a principal) of a body that cannot be read: the
            # message is invalid and goes to the DLQ in its turn; its producer's key orders it.
            return by_kafka_key(message)

    async def _handle_until_done(self, message: KafkaMessage, ticket: Ticket) -> None:
        failures = 0
        again = False
        while True:
            tracked = _TrackedMessage(message, ticket, self, again=again)
            again = True
            try:
                await self._handle(tracked)
            except Exception as error:
                failures += 1
                if failures >= self._handle_attempts:
                    await self._skip(tracked, ticket, error)
                    return
                # Perhaps the broker is briefly away (not even the dead-letter topic took it).
                tracked.nacked = True
            if not tracked.nacked or self._stopped(ticket):
                return
            await asyncio.sleep(self._redeliver_after_s)

    async def _skip(self, tracked: _TrackedMessage, ticket: Ticket, error: Exception) -> None:
        """Give a message up for good: its partition must not wait for it."""
        self.skipped += 1
        logger.error(
            "message could not be handled; skipped",
            consumer=self._name,
            topic=ticket.topic,
            partition=ticket.partition,
            offset=ticket.offset,
            error=describe_error(error),
            skipped_total=self.skipped,
        )
        await tracked.ack()

    async def settle(self, ticket: Ticket, kafka_consumer: Any) -> None:
        """A message is done: its partition is committed up to the oldest message still in flight,
        by the next commit of this consumer (not awaited: the message's slot is free at once)."""
        self._ledger.settle(ticket)
        self._due[(ticket.topic, ticket.partition)] = ticket
        self._committing_with = kafka_consumer
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_due(), name=f"{self._name} commits")

    async def _commit_due(self) -> None:
        # One commit at a time, each of every partition that moved since the last: the messages
        # that finish while a commit lingers or is in flight share the next one.
        while self._due:
            if self._commit_linger_s > 0 and not self._closing and not self._revoking:
                await asyncio.sleep(self._commit_linger_s)
            due, self._due = self._due, {}
            positions = {
                ticket: position
                for ticket in due.values()
                if (position := self._ledger.uncommitted(ticket)) is not None
            }
            if not positions:
                continue
            offsets = {TopicPartition(ticket.topic, ticket.partition): at for ticket, at in positions.items()}
            try:
                await self._committing_with.commit(offsets)
            except Exception as error:
                # The partition moved to another copy (it delivers what was not committed), or the
                # broker is away: the partition's next message carries the position.
                logger.info(
                    "commit refused",
                    consumer=self._name,
                    partitions=sorted(ticket.partition for ticket in positions),
                    error=describe_error(error),
                )
                continue
            for ticket, position in positions.items():
                self._ledger.committed(ticket, position)

    async def flush(self, within_s: float | None = None) -> None:
        """Wait until every message settled so far is committed (or its commit was refused), for
        at most `within_s` (a commit waits for the broker as long as it is away)."""
        deadline = None if within_s is None else time.monotonic() + within_s
        while self._committer is not None and not self._committer.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            await asyncio.wait({self._committer}, timeout=left)

    async def release(self, partitions: set[tuple[str, int]]) -> None:
        """Partitions are being revoked: let their messages finish and commit (bounded), then forget them."""
        for read in list(self._watermark_reads):
            read.cancel()
        self._revoking |= partitions
        try:
            running = [
                task for task, ticket in self._tasks.items() if (ticket.topic, ticket.partition) in partitions
            ]
            if running:
                await asyncio.wait(running, timeout=self._revoke_grace_s)
            await self.flush(self._revoke_grace_s)  # while this copy still owns them
            self._ledger.forget(partitions)
        finally:
            self._revoking -= partitions

    def assigned(self, partitions: set[tuple[str, int]]) -> None:
        """A rebalance gave this consumer `partitions` (logged: operators and tests read it); their
        first watermarks are read as soon as a fetch reports them."""
        logger.info(
            "partitions assigned",
            consumer=self._name,
            partitions=sorted(partition for _, partition in partitions),
        )
        if self._on_assigned is not None:
            self._on_assigned()
        kafka = self.kafka_consumer()
        if kafka is not None and partitions:
            read = asyncio.create_task(self._read_watermarks(kafka, partitions), name=f"{self._name} marks")
            self._watermark_reads.add(read)
            read.add_done_callback(self._watermark_reads.discard)

    async def _read_watermarks(self, kafka: Any, partitions: set[tuple[str, int]]) -> None:
        waiting = set(partitions)
        deadline = time.monotonic() + WATERMARK_WAIT_S
        while waiting and time.monotonic() < deadline and not self._closing:
            for topic_name, partition in list(waiting):
                try:
                    mark = kafka.highwater(TopicPartition(topic_name, partition))
                except AssertionError:
                    mark = -1  # no longer assigned
                if mark is not None:
                    waiting.discard((topic_name, partition))
                    if mark >= 0:
                        self._ledger.watermark(topic_name, partition, mark)
            await asyncio.sleep(WATERMARK_POLL_S)

    async def drain(self, grace_s: float) -> None:
        """Shutdown: take no new messages, give those in flight `grace_s`, cancel the rest (redelivered)."""
        self._closing = True
        for read in list(self._watermark_reads):
            read.cancel()
        running = list(self._tasks)
        if running:
            _, unfinished = await asyncio.wait(running, timeout=grace_s)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            logger.info(
                "consumer drained",
                consumer=self._name,
                finished=len(running) - len(unfinished),
                left=len(unfinished),
            )
        await self.flush(grace_s)


def _highwater(message: KafkaMessage, topic: str, partition: int) -> int | None:
    """The partition's high watermark as the message's consumer last fetched it (None: not known)."""
    consumer: Any = message.consumer
    try:
        mark = consumer.highwater(TopicPartition(topic, partition))
    except (AssertionError, AttributeError):
        return None  # revoked meanwhile (aiokafka asserts the assignment), or no Kafka consumer
    return mark if isinstance(mark, int) else None


class _RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Lets messages of revoked partitions finish before another copy takes them over."""

    def __init__(self, consumer: ConcurrentConsumer) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._consumer.release({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._consumer.assigned({(tp.topic, tp.partition) for tp in assigned})


def consume_concurrently(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    source: Topic | str,
    handle: Callable[[ConsumedMessage], Awaitable[None]],
    *,
    group: str,
    settings: ConsumerSettings,
    order: OrderKey | None = by_kafka_key,
    on_assigned: Callable[[], None] | None = None,
    on_call: bool = False,
) -> ConcurrentConsumer:
    """Subscribe `handle` to `source` in consumer group `group`, through a `ConcurrentConsumer`
    (`on_assigned`: called after each rebalance of the group; `on_call`: its records come when the
    service expects them, `ConcurrentConsumer.expect`).

    The app drains the returned consumer on shutdown, before the broker stops.
    """
    consumer = ConcurrentConsumer(
        handle,
        name=f"{group} {source}",
        max_in_flight=settings.max_in_flight,
        revoke_grace_s=settings.revoke_grace_s,
        commit_linger_s=settings.commit_linger_s,
        order=order,
        on_assigned=on_assigned,
        on_call=on_call,
    )
    subscriber = broker.subscriber(
        topic(kafka, source),
        **subscriber_options(kafka, group=group, ack_policy=AckPolicy.MANUAL),
        listener=consumer.listener,
    )
    subscriber(consumer.dispatch)
    consumer.kafka_consumer = lambda: getattr(subscriber, "consumer", None)
    return consumer
