"""The tool executor's subscribers: tool calls run concurrently, commits kept behind them; cancels.

`tools.calls` (consumer group, shared by every executor copy). Each message is handed to a task
and the subscriber takes the next one at once, so a slow tool holds neither its partition nor
the other tools (a model's parallel tool uses share a run id, hence a partition). Each task goes
through `Delivery`: decode (an invalid message goes to `tools.calls.dlq`), run the tool, publish
the one result, and only then settle. Offsets are committed per partition up to the oldest call
still running (`logic.OffsetLedger`), so a crash re-delivers every unanswered call, never skips
one. When partitions move to another copy, their calls in flight get `revoke_grace_s` to finish
and commit first.

`runs.control` (no consumer group: every copy reads every partition). A group hands each
message to one member only, and a cancel is keyed by session while calls are keyed by run, so
in a group a cancel would mostly reach a copy that is not running the calls. Read outside a
group, every copy sees every cancel, from the beginning of the topic: replaying old cancels is
harmless. Invalid control messages are the planner's to dead-letter; the executor skips them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from pydantic import TypeAdapter, ValidationError

from contracts.runs import CancelRun
from contracts.tools import ToolCallCompleted, ToolCallRequested
from contracts.topics import Topic
from services.kit.broker import subscriber_options, topic
from services.kit.delivery import Delivery, PermanentError, RetryableError
from services.kit.logging import bound_ids, get_logger
from services.kit.settings import KafkaSettings
from services.tool_executor.logic import OffsetLedger, Ticket, ToolRunner
from services.tool_executor.settings import ToolExecutorSettings

CALL = TypeAdapter(ToolCallRequested)
CANCEL = TypeAdapter(CancelRun)

PublishResult = Callable[[ToolCallCompleted], Awaitable[None]]
"""Publishes one result to `tools.results` and waits for the broker's acknowledgement."""

logger = get_logger(__name__)


class _TrackedMessage:
    """A consumed message as `Delivery` sees it: acking settles it in the ledger, never more."""

    def __init__(self, message: KafkaMessage, ticket: Ticket, dispatcher: CallDispatcher) -> None:
        self.body: bytes = message.body
        self.headers: dict[str, Any] = dict(message.headers)
        self.raw_message: Any = message.raw_message
        self._consumer = message.consumer
        self._ticket = ticket
        self._dispatcher = dispatcher

    async def ack(self) -> None:
        await self._dispatcher.settle(self._ticket, self._consumer)

    async def nack(self) -> None:
        # Left unsettled: its partition's commit stays before it, so after a restart or a
        # rebalance it is delivered again (and answered from the record if it was answered).
        logger.warning("tool call left for redelivery", partition=self._ticket.partition)


class CallDispatcher:
    """Runs each consumed call in its own task, at most `max_in_flight` at once, and commits in order."""

    def __init__(
        self,
        runner: ToolRunner,
        delivery: Delivery,
        publish: PublishResult,
        *,
        max_in_flight: int,
        revoke_grace_s: float,
    ) -> None:
        self._runner = runner
        self._delivery = delivery
        self._publish = publish
        self._slots = asyncio.Semaphore(max_in_flight)
        self._revoke_grace_s = revoke_grace_s
        self._ledger = OffsetLedger()
        self._tasks: dict[asyncio.Task[None], Ticket] = {}
        self._commit_lock = asyncio.Lock()
        self._revoking: set[tuple[str, int]] = set()
        self._closing = False
        self.listener = _RebalanceListener(self)

    async def dispatch(self, message: KafkaMessage) -> None:
        """Start one consumed call; returns once it runs (or at once when it must wait for later)."""
        record: Any = message.raw_message  # one ConsumerRecord (not a batch subscriber)
        ticket = self._ledger.begin(record.topic, record.partition, record.offset)
        if self._closing or (ticket.topic, ticket.partition) in self._revoking:
            return  # not started, so never settled: delivered again to whoever owns the partition
        await self._slots.acquire()
        if self._closing:
            self._slots.release()
            return
        task = asyncio.create_task(self._process(message, ticket), name=f"tool call {ticket.offset}")
        self._tasks[task] = ticket
        task.add_done_callback(self._tasks.pop)

    async def _process(self, message: KafkaMessage, ticket: Ticket) -> None:
        try:
            await self._delivery.handle(_TrackedMessage(message, ticket, self), CALL, self._answer)
        except KafkaError:
            # Not even the dead-letter topic took it: leave it unsettled for a later delivery.
            logger.exception("tool call could not be handled", partition=ticket.partition)
        finally:
            self._slots.release()

    async def _answer(self, request: ToolCallRequested) -> None:
        if not request.run_id or not request.tool_use_id:
            raise PermanentError("a tool call needs a run_id and a tool_use_id")
        with bound_ids(
            run_id=request.run_id,
            session_id=request.session_id or None,
            tenant_id=request.tenant_id or None,
            event_id=request.event_id,
            tool_use_id=request.tool_use_id,
            tool_name=request.tool_name,
        ):
            result = await self._runner.run(request)
            if result is None:
                logger.info("tool call canceled with its run")
                return
            await self._publish(result)
            logger.info(
                "tool call completed",
                is_error=result.is_error,
                awaiting=result.awaiting is not None,
                duration_ms=result.duration_ms,
            )

    async def settle(self, ticket: Ticket, consumer: Any) -> None:
        """A call is done: commit its partition up to the oldest call still in flight."""
        self._ledger.settle(ticket)
        async with self._commit_lock:
            # Commits queue here; whoever gets the lock commits the furthest position so far.
            position = self._ledger.uncommitted(ticket)
            if position is None:
                return
            try:
                await consumer.commit({TopicPartition(ticket.topic, ticket.partition): position})
            except KafkaError as error:
                # The partition moved to another copy; it will deliver what was not committed.
                logger.info("commit refused", partition=ticket.partition, error=type(error).__name__)
                return
            self._ledger.committed(ticket, position)

    async def release(self, partitions: set[tuple[str, int]]) -> None:
        """Partitions are being revoked: let their calls finish and commit (bounded), then forget them."""
        self._revoking |= partitions
        try:
            running = [
                task for task, ticket in self._tasks.items() if (ticket.topic, ticket.partition) in partitions
            ]
            if running:
                await asyncio.wait(running, timeout=self._revoke_grace_s)
            self._ledger.forget(partitions)
        finally:
            self._revoking -= partitions

    async def drain(self, grace_s: float) -> None:
        """Shutdown: take no new calls, give those in flight `grace_s`, cancel the rest (redelivered)."""
        self._closing = True
        running = list(self._tasks)
        if not running:
            return
        _, unfinished = await asyncio.wait(running, timeout=grace_s)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        logger.info("tool executor drained", finished=len(running) - len(unfinished), left=len(unfinished))

    def cancel_run(self, cancel: CancelRun) -> None:
        """Cancel the run's calls in flight; its later calls are not run."""
        canceled = self._runner.cancel_run(cancel.run_id)
        if canceled:
            logger.info("run canceled", run_id=cancel.run_id, calls_canceled=canceled)


class _RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Lets calls of revoked partitions finish before another copy takes them over."""

    def __init__(self, dispatcher: CallDispatcher) -> None:
        self._dispatcher = dispatcher

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._dispatcher.release({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        logger.info("tool call partitions assigned", partitions=sorted(tp.partition for tp in assigned))


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    settings: ToolExecutorSettings,
    runner: ToolRunner,
    delivery: Delivery,
) -> CallDispatcher:
    """Subscribe the executor to `tools.calls` (its group) and `runs.control` (every partition)."""
    results_topic = topic(kafka, Topic.TOOLS_RESULTS)

    async def publish(result: ToolCallCompleted) -> None:
        try:
            await broker.publish(
                result.model_dump_json().encode(), topic=results_topic, key=result.partition_key().encode()
            )
        except KafkaError as error:
            # The broker is briefly away: try again (the tool is not run again, its result is kept).
            raise RetryableError(f"publishing the result failed: {type(error).__name__}") from error

    dispatcher = CallDispatcher(
        runner,
        delivery,
        publish,
        max_in_flight=settings.max_in_flight,
        revoke_grace_s=settings.revoke_grace_s,
    )

    @broker.subscriber(
        topic(kafka, Topic.TOOLS_CALLS),
        **subscriber_options(kafka, group=settings.group, ack_policy=AckPolicy.MANUAL),
        listener=dispatcher.listener,
    )
    async def on_call(message: KafkaMessage) -> None:
        await dispatcher.dispatch(message)

    @broker.subscriber(
        topic(kafka, Topic.RUNS_CONTROL),
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        # Outside a group there is nothing to commit: the offsets are never stored.
        ack_policy=AckPolicy.MANUAL,
    )
    async def on_control(message: KafkaMessage) -> None:
        try:
            cancel = CANCEL.validate_json(message.body)
        except ValidationError:
            logger.debug("control message skipped: not a CancelRun")
            return
        dispatcher.cancel_run(cancel)

    return dispatcher
