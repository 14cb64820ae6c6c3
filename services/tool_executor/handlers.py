"""The tool executor's subscribers: tool calls run concurrently, commits kept behind them; cancels.

`tools.calls`, or the toolset's own `tools.calls.<toolset>` (consumer group, shared by every
copy of one toolset's executor). Each message is handed to a task
(`kit.concurrent_delivery`) and the subscriber takes the next one at once, so a slow tool holds
neither its partition nor the other tools (a model's parallel tool uses share a run id, hence a
partition). Each task goes through `Delivery`: decode (an invalid message goes to
`tools.calls.dlq`), run the tool, publish the one result, and only then settle. Offsets are
committed per partition up to the oldest call still running, so a crash re-delivers every
unanswered call, never skips one. When partitions move to another copy, their calls in flight
get `revoke_grace_s` to finish and commit first.

`runs.control` (no consumer group: every copy reads every partition). A group hands each
message to one member only, and a cancel is keyed by session while calls are keyed by run, so
in a group a cancel would mostly reach a copy that is not running the calls. Read outside a
group, every copy sees every cancel, from the beginning of the topic: replaying old cancels is
harmless. Invalid control messages are the planner's to dead-letter; the executor skips them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.kafka import KafkaBroker
from pydantic import TypeAdapter, ValidationError

from quipu.contracts.runs import CancelRun
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.services.kit.broker import InLoopKafkaMessage, follow_from_start
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from quipu.services.kit.delivery import Delivery, PermanentError
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.logging import bound_ids, get_logger
from quipu.services.kit.publishing import broker_publisher
from quipu.services.kit.settings import KafkaSettings
from quipu.services.tool_executor.logic import ToolRunner
from quipu.services.tool_executor.settings import ToolExecutorSettings

CALL = TypeAdapter(ToolCallRequested)
CANCEL = TypeAdapter(CancelRun)

PublishResult = Callable[[ToolCallCompleted], Awaitable[None]]
"""Publishes one result to `tools.results` and waits for the broker's acknowledgement."""

logger = get_logger(__name__)


class CallAnswerer:
    """Answers one call: runs it (once per tool use) and publishes its one result."""

    def __init__(self, runner: Running[ToolRunner], publish: PublishResult) -> None:
        self._runner = runner
        self._publish = publish

    async def answer(self, request: ToolCallRequested) -> None:
        """Run the call and publish its result; nothing when its run is canceled."""
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
            result = await self._runner.get().run(request)
            if result is None:
                logger.info("tool call canceled with its run")
                return
            await self._publish(result)  # sealed for the call's principal (Delivery's sealing_as)
            logger.info(
                "tool call completed",
                is_error=result.is_error,
                awaiting=result.awaiting is not None,
                duration_ms=result.duration_ms,
            )

    def cancel_run(self, cancel: CancelRun) -> None:
        """Cancel the run's calls in flight; its later calls are not run."""
        canceled = self._runner.get().cancel_run(cancel.run_id)
        if canceled:
            logger.info("run canceled", run_id=cancel.run_id, calls_canceled=canceled)


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    settings: ToolExecutorSettings,
    runner: Running[ToolRunner],
    delivery: Delivery,
    seals: MessageSeals | None = None,
    *,
    calls_topic: str = Topic.TOOLS_CALLS.value,
    group: str | None = None,
) -> ConcurrentConsumer:
    """Subscribe the executor to its toolset's `calls_topic` (its group) and `runs.control`
    (every partition); `seals` seal each result for the principal its call was sealed for."""
    publisher = broker_publisher(broker, kafka, seals)

    # A broker briefly away is a retryable PublishError: the delivery tries again (the tool is not
    # run again, its result is kept).
    answerer = CallAnswerer(runner, publisher.publish)
    # Unordered: a model's parallel tool uses share a run id, hence a key, and must run together.
    calls = consume_concurrently(
        broker,
        kafka,
        calls_topic,
        lambda message: delivery.handle(message, CALL, answerer.answer),
        group=group or settings.group,
        settings=settings,
        order=None,
    )

    async def on_control(message: InLoopKafkaMessage) -> None:
        try:
            cancel = CANCEL.validate_json(message.body)
        except ValidationError:
            logger.debug("control message skipped: not a CancelRun")
            return
        answerer.cancel_run(cancel)

    follow_from_start(broker, kafka, [Topic.RUNS_CONTROL], on_control)
    return calls
