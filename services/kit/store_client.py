"""The `Store` as seen by every service: commands to the storage owner over Kafka, replies back.

Request/reply is built by hand because FastStream's `broker.request()` works only in its test
broker (PLATFORM_NOTES). Each client instance picks one partition of the deployment's replies
topic, names it in the `quipu-reply-partition` header of every command (the owner never takes a
topic from a message), reads that partition alone without a consumer group (no slow group join)
from the end, and resolves one future per correlation id; the replies of other clients on the same
partition are passed over without being decoded. A timeout resends the identical
command — same correlation id, same bytes — so the owner answers it as an exact retry; when every
attempt times out the caller gets UNAVAILABLE.

On Tansu a waiting client fetches every 10 ms (its fetch does not wake on new data). A call whose
command lands on a partition of `storage.commands` that an owner of this very process holds
(`quipu up`, everything in one process) is answered by this process: the client does not fetch for
it: the reply resolves the call as soon as that owner queues it, before the broker acknowledges
it (`kit.fetch_pace.listen_sent`: a reply only answers this call, and one lost would be asked for
again), and the client is then handed the record (kit.handover) or fetches it, only to move past it.
Should that owner no longer hold the partition (a rebalance moved it elsewhere), or no reply come
within `HERE_REPLY_WAIT_S`, it fetches for the call as for any other.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from quipu.contracts.commands import (
    REPLY_PARTITION_HEADER,
    AppendRunRecord,
    AppendRunRecords,
    CreateSession,
    DispatchedCall,
    EndSession,
    ListRunRecords,
    ListRunsBySession,
    ListSessionRunRecords,
    LoadRun,
    LoadRunSuspension,
    LoadSessionStatus,
    PurgeSession,
    RecordRunCancellation,
    RecordRunSuspension,
    RecordRunTerminal,
    StartChildRun,
    StartOneShotChildRun,
    StartOneShotRun,
    StartRootRun,
    StoreOperation,
    StoreReply,
    decode_result,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import (
    AppendResult,
    Checkpoint,
    LogBasis,
    Page,
    Record,
    RunMeta,
    RunStart,
    RunStatus,
    Session,
    SessionOwner,
    StartResult,
)
from quipu.contracts.topics import Topic, spec_for
from quipu.services.kit import fetch_pace, handover
from quipu.services.kit.consumers import stop_consumer
from quipu.services.kit.delivery import MessageErasedError, PermanentError, RetryableError, describe_error
from quipu.services.kit.handover import HandedRecord
from quipu.services.kit.keys import MessageSeals, message_seals
from quipu.services.kit.producers import Producer, shared_producer
from quipu.services.kit.publishing import PublishError, TopicPublisher, producer_publisher
from quipu.services.kit.reply_claim import ReplyClaim
from quipu.services.kit.run_events import partition_for_key
from quipu.services.kit.sealing import current_sealing_for
from quipu.services.kit.settings import KafkaSettings, KeySettings, StoreClientSettings

if TYPE_CHECKING:
    from quipu.services.kit.memory_client import KafkaMemoryStore

logger = structlog.get_logger(__name__)

T = TypeVar("T")

HERE_LOOK_S = 0.05
"""How often a client looks whether the owner of this process still holds the partitions its
calls answered here went to (a rebalance may have moved one: its reply then comes from elsewhere)."""
HERE_REPLY_WAIT_S = 5.0
"""Longest a call answered in this process waits for its reply without fetching for it."""
EARLY_KEPT = 1024
"""Calls answered as their reply was queued whose record is still to be read, at most (one whose
record never comes, its partition moved, is forgotten after as many more)."""

_ON_SENT: ContextVar[asyncio.Event | None] = ContextVar("quipu_store_on_sent", default=None)
"""Set by `KafkaStore.sent` in the task of the call it starts: the call's first publish the broker
took sets it."""


def _erased_reply(value: bytes) -> StoreReply:
    """The reply a caller gets when its reply was sealed under a key shredded since (a final error)."""
    try:
        correlation_id = str(json.loads(value).get("correlation_id", ""))
    except (ValueError, AttributeError):
        correlation_id = ""
    error = StoreError(
        ErrorCode.INVALID_ARGUMENT, "the reply is sealed under the key of a forgotten principal"
    )
    return StoreReply(correlation_id=correlation_id, error=error.to_body())


async def partition_count(settings: KafkaSettings, topic: str, *, timeout_s: float = 10.0) -> int:
    """How many partitions the broker reports for `topic`; UNAVAILABLE when it cannot say."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        client_id=f"{settings.client_id}-metadata",
        request_timeout_ms=int(timeout_s * 1000),
    )
    try:
        await producer.start()
        return len(await producer.partitions_for(topic))
    except KafkaError as error:
        raise StoreError(ErrorCode.UNAVAILABLE, f"no partition count for topic {topic}") from error
    finally:
        await producer.stop()


class KafkaStore:
    """A `Store` whose every call is a command to the storage owner."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        reply_timeout_s: float = 5.0,
        attempts: int = 3,
        tenant_id: str = "",
        seals: MessageSeals | None = None,
        keys: KeySettings | None = None,
        claim_partition: bool = True,
    ) -> None:
        """`seals` seal the commands that carry a principal's words and open sealed replies
        (default: the key channel `keys` names, else `KeySettings()`, closed with this client).
        `claim_partition`: take a partition of its own from the claim group (kit.reply_claim);
        without, it reads a partition picked at random, possibly shared."""
        self._settings = settings
        self._owns_seals = seals is None
        self._seals = (
            seals if seals is not None else message_seals(keys if keys is not None else KeySettings())
        )
        self._reply_timeout_s = reply_timeout_s
        self._attempts = attempts
        self._tenant_id = tenant_id
        self._replies_topic = settings.topic_prefix + Topic.STORAGE_REPLIES.value
        self._pending: dict[str, asyncio.Future[StoreReply]] = {}
        self._producer: Producer | None = None
        self._commands: TopicPublisher | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._reply_partition: int | None = None
        self._reading: set[int] = set()
        self._routes: dict[str, int] = {}
        """The partition each pending call's last send named (it is read until the call ends)."""
        self._assigning = asyncio.Lock()
        self._claims = claim_partition
        self._claim: ReplyClaim | None = None
        self._moving: asyncio.Task[None] | None = None
        self._passed_over = 0
        self._commands_topic = settings.topic_prefix + Topic.STORAGE_COMMANDS.value
        self._command_partitions: list[int] = []
        self._here: dict[str, tuple[int, float]] = {}
        """The pending calls answered in this process, no fetch for them until their reply is out:
        the partition of `storage.commands` each went to, and since when (monotonic)."""
        self._looking_here: asyncio.Task[None] | None = None
        self._due: dict[int, int] = {}
        """Reply partitions read by this client where this process published a record not read
        yet: the offset past it."""
        self._unlisten: list[Callable[[], None]] = []
        self._early: dict[str, None] = {}
        """Calls resolved by a reply of this process before the broker held it (insertion order,
        bounded): the record, when it is read, is theirs, not another client's passed over."""
        self._resolving: set[asyncio.Task[None]] = set()

    @classmethod
    def for_service(
        cls,
        settings: KafkaSettings,
        client: StoreClientSettings,
        *,
        tenant_id: str = "",
        seals: MessageSeals | None = None,
    ) -> KafkaStore:
        """A client that waits for replies and resends as the service's store settings say."""
        return cls(
            settings,
            reply_timeout_s=client.store_reply_timeout_s,
            attempts=client.store_attempts,
            tenant_id=tenant_id,
            seals=seals,
            keys=client.keys,
            claim_partition=client.store_claim_partition,
        )

    async def start(self) -> None:
        """Connect, and be positioned on the replies topic before the first command is sent."""
        settings = self._settings
        self._producer = shared_producer(settings, f"{settings.client_id}-store")
        await self._producer.start()
        self._commands = producer_publisher(self._producer, settings, self._seals)
        self._command_partitions = sorted(await self._producer.partitions_for(self._commands_topic))
        self._unlisten = [
            fetch_pace.listen(self._replies_topic, self._heard),
            fetch_pace.listen_sent(self._replies_topic, self._sent_here),
        ]
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap,
            client_id=f"{settings.client_id}-store-replies",
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
            consumer_timeout_ms=settings.consumer_timeout_ms,
        )
        await self._consumer.start()
        # Until the claim group gives this client a partition of its own (a second or more), any
        # partition will do: one shared for a moment still works (others' replies are passed over).
        self._reply_partition = random.choice(await self._reply_partitions())
        await self._read_from({self._reply_partition})
        self._reader = asyncio.create_task(self._read_replies(), name="store-replies")
        if self._claims:
            self._claim = ReplyClaim(settings, self._replies_topic, self._claimed)
            self._claim.prefer(self._reply_partition)
            await self._claim.start()

    @property
    def reply_partition(self) -> int | None:
        """The partition of the replies topic this client names in its commands (set by `start`)."""
        return self._reply_partition

    @property
    def claim(self) -> ReplyClaim | None:
        """This client's membership of the claim group (None when it claims no partition)."""
        return self._claim

    @property
    def fetching(self) -> set[int]:
        """The partitions of the replies topic fetched now: none while no call waits for a reply."""
        if self._consumer is None:
            return set()
        paused = self._consumer.paused()
        return {tp.partition for tp in self._consumer.assignment() if tp not in paused}

    @property
    def replies_passed_over(self) -> int:
        """Replies fetched that no call of this client waited for (another client's, or late)."""
        return self._passed_over

    @property
    def replies_answered_early(self) -> int:
        """Calls answered by a reply of this process as it was queued, whose record is not read yet."""
        return len(self._early)

    def _claimed(self, partition: int) -> None:
        if partition != self._reply_partition:
            self._moving = asyncio.create_task(self._move_to(partition), name="store-replies-move")

    async def _move_to(self, partition: int) -> None:
        # Read the new partition before naming it; calls already sent keep theirs read until answered.
        async with self._assigning:
            await self._read_from({partition, *self._routes.values()})
            self._reply_partition = partition

    async def _settled(self) -> None:
        # No call waits any more: stop fetching, and drop the partitions only earlier calls named.
        assert self._consumer is not None and self._reply_partition is not None
        async with self._assigning:
            if self._pending:
                return
            if self._reading == {self._reply_partition}:
                self._consumer.pause(*self._consumer.assignment())
            else:
                # Pauses too, unless a call began while it awaited the broker.
                await self._read_from({self._reply_partition})

    async def _read_from(self, partitions: set[int]) -> None:
        """Read exactly `partitions`: those read already from where they are, the others from their
        end; fetched only while a call waits."""
        assert self._consumer is not None
        kept = {
            number: await self._consumer.position(TopicPartition(self._replies_topic, number))
            for number in partitions & self._reading
        }
        chosen = [TopicPartition(self._replies_topic, number) for number in sorted(partitions)]
        self._consumer.assign(chosen)
        for partition in chosen:
            if partition.partition in kept:
                self._consumer.seek(partition, kept[partition.partition])
            else:
                # Tansu may under-report the end offset; starting a little early only re-reads
                # replies no pending call waits for. Resolving the position now means none is missed.
                await self._consumer.seek_to_end(partition)
                await self._consumer.position(partition)
        self._reading = partitions
        self._fetch_as_needed()

    async def _reply_partitions(self) -> list[int]:
        assert self._consumer is not None
        for _ in range(50):
            numbers = self._consumer.partitions_for_topic(self._replies_topic)
            if numbers:
                return sorted(numbers)
            await self._consumer._client.force_metadata_update()
            await asyncio.sleep(0.1)
        raise StoreError(ErrorCode.UNAVAILABLE, f"topic {self._replies_topic} does not exist")

    def drop_key(self, whose: SealedFor) -> None:
        """Let go of this process's cached key of `whose`: a forget went through this client, so
        what the person says next must be sealed under the key made after it, not the shredded one."""
        if self._seals.keys is not None:
            self._seals.keys.drop(whose)

    async def stop(self) -> None:
        """Stop reading replies and close both clients; pending calls fail with UNAVAILABLE."""
        for unlisten in self._unlisten:
            unlisten()
        self._unlisten = []
        for resolving in list(self._resolving):
            resolving.cancel()
        if self._looking_here is not None:
            self._looking_here.cancel()
            await asyncio.gather(self._looking_here, return_exceptions=True)
        if self._claim is not None:
            await self._claim.stop()
        if self._moving is not None:
            self._moving.cancel()
            await asyncio.gather(self._moving, return_exceptions=True)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(StoreError(ErrorCode.UNAVAILABLE, "store client stopped"))
        if self._consumer is not None:
            await stop_consumer(self._consumer)  # it re-assigns as calls name partitions
        if self._producer is not None:
            await self._producer.stop()
        if self._owns_seals:
            await self._seals.close()

    async def __aenter__(self) -> KafkaStore:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _read_replies(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    await self._resolve(message.value or b"")
            if self._due:
                await self._settle_due()

    async def _settle_due(self) -> None:
        """Forget this process's replies read already; stop fetching when only calls answered
        here are left."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        for partition, end in list(self._due.items()):
            held = TopicPartition(self._replies_topic, partition)
            if held not in assigned or await self._consumer.position(held) >= end:
                del self._due[partition]
        self._fetch_as_needed()

    def _heard(self, partition: int, offset: int, record: HandedRecord | None) -> None:
        """This process published a record on the replies topic: take it now (handed, else
        fetched) if it is on a partition this client reads while calls answered here wait, or
        answered one already as it was queued (read past it, so no backlog builds up)."""
        if partition in self._reading and (self._here or self._early):
            self._due[partition] = max(offset + 1, self._due.get(partition, 0))
            self._fetch_as_needed()
            if record is not None and self._consumer is not None:
                handover.hand(self._consumer, TopicPartition(self._replies_topic, partition), offset, record)

    def _sent_here(self, partition: int, value: bytes) -> None:
        """An owner of this process queued a reply for a partition this client reads: when it
        answers a pending call, resolve that call now, as the record would once fetched."""
        if partition not in self._reading or not any(
            correlation_id.encode() in value for correlation_id in self._pending
        ):
            return
        resolving = asyncio.ensure_future(self._resolve(value, early=True))
        self._resolving.add(resolving)
        resolving.add_done_callback(self._resolving.discard)

    def _fetch_as_needed(self) -> None:
        """Fetch the partitions read while a call waits for a reply from elsewhere, or a reply of
        this process's is on the broker unread; no fetch else."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        if self._due or any(correlation_id not in self._here for correlation_id in self._pending):
            self._consumer.resume(*assigned)
        else:
            self._consumer.pause(*assigned)

    def _answer_here(self, command: StoreOperation) -> None:
        """Note the call of `command` as answered here when an owner of this process holds the
        partition it goes to (by its key, with the producer's partitioner)."""
        key = spec_for(command).key_of(command)
        if key is None or not self._command_partitions:
            return
        partition = partition_for_key(key, self._command_partitions)
        if fetch_pace.holds(self._commands_topic, partition):
            self._here[command.correlation_id] = (partition, time.monotonic())
            if self._looking_here is None or self._looking_here.done():
                self._looking_here = asyncio.create_task(self._look_here(), name="store-replies-here")

    async def _look_here(self) -> None:
        """While calls are answered here: fetch for those whose partition the owner of this
        process no longer holds, or that waited `HERE_REPLY_WAIT_S`."""
        while self._here:
            await asyncio.sleep(HERE_LOOK_S)
            now = time.monotonic()
            partitions = {partition for partition, _ in self._here.values()}
            held = {number for number in partitions if fetch_pace.holds(self._commands_topic, number)}
            elsewhere = [
                correlation_id
                for correlation_id, (partition, since) in self._here.items()
                if partition not in held or now - since >= HERE_REPLY_WAIT_S
            ]
            for correlation_id in elsewhere:
                del self._here[correlation_id]
            if elsewhere:
                self._fetch_as_needed()

    async def _resolve(self, value: bytes, *, early: bool = False) -> None:
        # Other clients may read this partition too: their replies are passed over before they are
        # decoded or opened (the correlation id is in clear in every reply; a false match is only
        # decoded in vain).
        if not any(correlation_id.encode() in value for correlation_id in self._pending):
            answered = next((done for done in self._early if done.encode() in value), None)
            if answered is None:
                self._passed_over += 1
            else:
                del self._early[answered]  # the record of a reply taken as it was queued
            return
        try:
            reply = StoreReply.model_validate_json(await self._seals.open(value))
        except MessageErasedError:
            reply = _erased_reply(value)
        except (ValueError, PermanentError, RetryableError) as error:
            # Never the value itself in the log: a reply may carry anyone's words.
            logger.warning("unreadable store reply skipped", error=describe_error(error))
            return
        future = self._pending.get(reply.correlation_id)
        if future is not None and not future.done():
            future.set_result(reply)
            if early:
                self._early[reply.correlation_id] = None
                while len(self._early) > EARLY_KEPT:
                    del self._early[next(iter(self._early))]

    async def call(self, command: StoreOperation) -> Any:
        """Send `command` and return its decoded result, or raise the owner's StoreError."""
        if self._commands is None:
            raise StoreError(ErrorCode.UNAVAILABLE, "store client not started")
        correlation_id = command.correlation_id or str(uuid.uuid4())
        command = command.model_copy(
            update={
                "correlation_id": correlation_id,
                "tenant_id": command.tenant_id or self._tenant_id,
                "sealed_for": command.sealed_for or command.whose_words() or current_sealing_for(),
            }
        )
        future: asyncio.Future[StoreReply] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        try:
            reply = await self._send_until_answered(command, future)
        finally:
            self._pending.pop(correlation_id, None)
            self._routes.pop(correlation_id, None)
            if not self._pending:
                await self._settled()
        if reply.error is not None:
            raise StoreError.from_body(reply.error)
        return decode_result(command, reply.result)

    # --- capabilities (`Store`): the owner's client has all three ---------------------------------

    @property
    def pipeline(self) -> KafkaStore:
        """This client (`sent`): a command is under way once the broker holds it, and commands for
        one run share its key, so the owner applies them in the order sent."""
        return self

    @property
    def outbox(self) -> KafkaStore:
        """This client: its `append_run_records` carries a step's calls and the owner publishes them."""
        return self

    @property
    def owner_memory(self) -> KafkaMemoryStore:
        """The owner's memory store over this client's transport (memory commands)."""
        # The memory client is built on this module's KafkaStore, so it is imported when asked for.
        from quipu.services.kit.memory_client import KafkaMemoryStore  # noqa: PLC0415

        return KafkaMemoryStore(self)

    async def sent(self, operation: Awaitable[T]) -> asyncio.Task[T]:
        """`operation` (one call of this client) under way: returns once the broker holds its
        command, or once it ended without (its error is then the task's). A command sent after
        this returns is behind it on its partition, so the owner applies the two in that order
        when they share a key."""
        published = asyncio.Event()
        token = _ON_SENT.set(published)
        try:
            call = asyncio.ensure_future(operation)  # the task's context holds `published`
        finally:
            _ON_SENT.reset(token)
        waiting = asyncio.ensure_future(published.wait())
        try:
            await asyncio.wait({call, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        return call

    async def _send_until_answered(
        self, command: StoreOperation, future: asyncio.Future[StoreReply]
    ) -> StoreReply:
        assert self._commands is not None
        assert self._consumer is not None and self._reply_partition is not None
        # A resend is the same frozen command, so the same bytes (sealed ones under a fresh
        # nonce: the same plaintext); its route is this client's partition at the time.
        correlation_id = command.correlation_id
        try:
            for _ in range(self._attempts):
                self._routes[correlation_id] = self._reply_partition
                self._answer_here(command)
                self._fetch_as_needed()
                route = {REPLY_PARTITION_HEADER: str(self._reply_partition)}
                try:
                    await self._commands.publish(command, headers=route)
                    published = _ON_SENT.get()
                    if published is not None:
                        published.set()
                    return await asyncio.wait_for(asyncio.shield(future), self._reply_timeout_s)
                except (TimeoutError, PublishError) as error:
                    logger.info("store command unanswered; resending", op=command.op, error=repr(error))
        finally:
            self._here.pop(correlation_id, None)
        raise StoreError(ErrorCode.UNAVAILABLE, f"{command.op}: no reply from the storage owner")

    # --- the Store protocol ---------------------------------------------------------------------

    async def create_session(
        self, session_id: str, created_at: datetime, owner: SessionOwner | None = None
    ) -> Session:
        result: Session = await self.call(
            CreateSession(session_id=session_id, created_at=created_at, owner=owner)
        )
        return result

    async def end_session(self, session_id: str, ended_at: datetime) -> Session:
        result: Session = await self.call(EndSession(session_id=session_id, ended_at=ended_at))
        return result

    async def load_session_status(self, session_id: str) -> Session:
        result: Session = await self.call(LoadSessionStatus(session_id=session_id))
        return result

    async def purge_session(self, session_id: str) -> None:
        await self.call(PurgeSession(session_id=session_id))

    async def start_root_run(
        self, run: RunStart, started: Record, stopped: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        command = StartRootRun(run=run, started=started, stopped=stopped, records=list(records))
        result: StartResult = await self.call(command)
        return result

    async def start_child_run(
        self,
        run: RunStart,
        parent_link: Record,
        started: Record,
        stopped: Record,
        records: Sequence[Record] = (),
    ) -> StartResult:
        result: StartResult = await self.call(
            StartChildRun(
                run=run, parent_link=parent_link, started=started, stopped=stopped, records=list(records)
            )
        )
        return result

    async def start_one_shot_run(
        self, run: RunStart, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        command = StartOneShotRun(run=run, started=started, records=list(records))
        result: StartResult = await self.call(command)
        return result

    async def start_one_shot_child_run(
        self, run: RunStart, parent_link: Record, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        result: StartResult = await self.call(
            StartOneShotChildRun(run=run, parent_link=parent_link, started=started, records=list(records))
        )
        return result

    async def append_run_record(self, record: Record) -> AppendResult:
        result: AppendResult = await self.call(AppendRunRecord(record=record))
        return result

    async def append_run_records(
        self,
        records: Sequence[Record],
        calls: Sequence[DispatchedCall] = (),
        *,
        follows: LogBasis | None = None,
    ) -> list[AppendResult]:
        """Append a step's records (only while the run's log is `follows`, when given); the owner
        publishes `calls` once they commit (an outbox)."""
        result: list[AppendResult] = await self.call(
            AppendRunRecords(records=list(records), calls=list(calls), follows=follows)
        )
        return result

    async def record_run_cancellation(self, record: Record) -> AppendResult:
        result: AppendResult = await self.call(RecordRunCancellation(record=record))
        return result

    async def record_run_suspension(self, checkpoint: Checkpoint, record: Record) -> AppendResult:
        result: AppendResult = await self.call(RecordRunSuspension(checkpoint=checkpoint, record=record))
        return result

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> AppendResult:
        result: AppendResult = await self.call(
            RecordRunTerminal(record=record, records=list(records), follows=follows)
        )
        return result

    async def load_run(self, run_id: str) -> RunMeta:
        result: RunMeta = await self.call(LoadRun(run_id=run_id))
        return result

    async def load_run_suspension(self, run_id: str) -> Checkpoint:
        result: Checkpoint = await self.call(LoadRunSuspension(run_id=run_id))
        return result

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        result: Page = await self.call(ListRunRecords(run_id=run_id, cursor=cursor, limit=limit))
        return result

    async def list_session_run_records(self, session_id: str, cursor: str, limit: int) -> Page:
        result: Page = await self.call(
            ListSessionRunRecords(session_id=session_id, cursor=cursor, limit=limit)
        )
        return result

    async def list_runs_by_session(self, session_id: str, statuses: list[RunStatus]) -> list[RunMeta]:
        result: list[RunMeta] = await self.call(ListRunsBySession(session_id=session_id, statuses=statuses))
        return result
