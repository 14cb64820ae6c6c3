"""The planner's subscribers: `runs.requested`, `runs.control`, `tools.results`.

Each handler is one line: decode through `Delivery` (DLQ for what does not validate), run the
planner's method for the trigger, commit after it returns.
"""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from pydantic import TypeAdapter

from contracts.runs import CancelRun, RunRequested
from contracts.tools import ToolCallCompleted
from contracts.topics import Topic
from services.kit.broker import subscriber_options, topic
from services.kit.delivery import Delivery
from services.kit.settings import KafkaSettings
from services.planner.adapters import Planner

RUN_REQUESTED = TypeAdapter(RunRequested)
CANCEL_RUN = TypeAdapter(CancelRun)
TOOL_CALL_COMPLETED = TypeAdapter(ToolCallCompleted)


class PlannerHolder:
    """The planner, once the app's startup hook has built it."""

    def __init__(self) -> None:
        self.planner: Planner | None = None

    def get(self) -> Planner:
        """The running planner."""
        if self.planner is None:
            raise RuntimeError("the planner is not started")
        return self.planner


def register(
    broker: KafkaBroker, settings: KafkaSettings, holder: PlannerHolder, delivery: Delivery, group: str
) -> None:
    """Subscribe the planner to its three topics, each with its own consumer group."""

    @broker.subscriber(
        topic(settings, Topic.RUNS_REQUESTED),
        **subscriber_options(settings, group=f"{group}-requests", ack_policy=AckPolicy.MANUAL),
    )
    async def on_run_requested(message: KafkaMessage) -> None:
        await delivery.handle(message, RUN_REQUESTED, holder.get().on_run_requested)

    @broker.subscriber(
        topic(settings, Topic.RUNS_CONTROL),
        **subscriber_options(settings, group=f"{group}-control", ack_policy=AckPolicy.MANUAL),
    )
    async def on_cancel(message: KafkaMessage) -> None:
        await delivery.handle(message, CANCEL_RUN, holder.get().on_cancel)

    @broker.subscriber(
        topic(settings, Topic.TOOLS_RESULTS),
        **subscriber_options(settings, group=f"{group}-results", ack_policy=AckPolicy.MANUAL),
    )
    async def on_tool_result(message: KafkaMessage) -> None:
        await delivery.handle(message, TOOL_CALL_COMPLETED, holder.get().on_tool_result)
