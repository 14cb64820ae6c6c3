"""The planner's subscribers: `runs.requested`, `runs.control`, `tools.results`; the registries.

Each message goes through `Delivery` (DLQ for what does not validate) in a task of its own
(`kit.concurrent_delivery`): runs of different sessions advance concurrently while one key's
messages (a session's requests and cancels, a run's tool results) are handled in the order
consumed. A partition is committed only up to its oldest message not yet handled.

`tools.registry` and `agents.registry` are read outside any group, from the beginning, by every
planner copy: each keeps the whole view of the announced toolsets (`domain.toolset_registry`) and
of the registered agents (`domain.agents`). At start-up both are read to their end before any run
is taken (`kit.topic_replay.catch_up`), then followed. An entry that does not validate, or that
cannot be served, is skipped with a warning (every copy reads it, so none dead-letters it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from faststream.kafka import KafkaBroker
from pydantic import TypeAdapter, ValidationError

from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.tools import ToolCallCompleted, ToolsetAnnounced
from quipu.contracts.topics import Topic
from quipu.services.domain.agent_publisher import agent_reader
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import run_sealing_principal
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer, consume_concurrently
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.lifecycle import Running
from quipu.services.kit.logging import get_logger
from quipu.services.kit.sealing import sealing_for
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.topic_replay import RegistryReader
from quipu.services.planner.adapters import expecting_results, ignoring_erased_runs
from quipu.services.planner.orchestrator import Planner
from quipu.services.planner.settings import PlannerSettings

T = TypeVar("T")

RUN_REQUESTED = TypeAdapter(RunRequested)
CANCEL_RUN = TypeAdapter(CancelRun)
TOOL_CALL_COMPLETED = TypeAdapter(ToolCallCompleted)
TOOLSET_ANNOUNCED = TypeAdapter(ToolsetAnnounced)

logger = get_logger(__name__)


def register(
    broker: KafkaBroker,
    kafka: KafkaSettings,
    planner: Running[Planner],
    delivery: Delivery,
    settings: PlannerSettings,
) -> list[ConcurrentConsumer]:
    """Subscribe the planner to its three topics, each with its own consumer group."""

    async def run_requested(request: RunRequested) -> None:
        principal = run_sealing_principal(request.principal_id, request.session_id, request.run_id)
        erased, sealed = ignoring_erased_runs(request.run_id), sealing_for(request.tenant_id, principal)
        with erased, sealed, expecting_results(results.expect):
            await planner.get().on_run_requested(request)

    async def cancel(request: CancelRun) -> None:
        with ignoring_erased_runs(request.run_id):
            await planner.get().on_cancel(request)

    async def tool_result(completed: ToolCallCompleted) -> None:
        # Sealed for the run's principal (the call was): Delivery runs this under their key.
        with ignoring_erased_runs(completed.run_id), expecting_results(results.expect):
            await planner.get().on_tool_result(completed)

    async def invalid_request(body: bytes, reason: str) -> None:
        await planner.get().on_invalid_request(body, reason)

    def subscribe(
        source: Topic,
        suffix: str,
        payload: TypeAdapter[T],
        effect: Callable[[T], Awaitable[None]],
        on_invalid: Callable[[bytes, str], Awaitable[None]] | None = None,
        client: KafkaSettings = kafka,
        on_assigned: Callable[[], None] | None = None,
        on_call: bool = False,
    ) -> ConcurrentConsumer:
        return consume_concurrently(
            broker,
            client,
            source,
            lambda message: delivery.handle(message, payload, effect, on_invalid),
            group=f"{settings.group}-{suffix}",
            settings=settings,
            on_assigned=on_assigned,
            on_call=on_call,
        )

    def results_reassigned() -> None:
        # Only a copy holding a run's results partition writes its next steps: after a rebalance
        # another copy may have, so the views this one kept are read again.
        with contextlib.suppress(RuntimeError):  # not open (yet, or any more): it keeps no view
            planner.get().forget_kept_views()

    # Tool results come after a step sent calls: the results consumer fetches from then on, and
    # parks once they came, even while the planner is busy (kit.fetch_pace, on call).
    results = subscribe(
        Topic.TOOLS_RESULTS,
        "results",
        TOOL_CALL_COMPLETED,
        tool_result,
        on_assigned=results_reassigned,
        on_call=True,
    )
    return [
        subscribe(Topic.RUNS_REQUESTED, "requests", RUN_REQUESTED, run_requested, invalid_request),
        # No caller waits on a cancel (it is acknowledged when published): fetched less often.
        subscribe(Topic.RUNS_CONTROL, "control", CANCEL_RUN, cancel, client=kafka.in_background()),
        results,
    ]


def registry_readers(toolsets: ToolsetRegistry, agents: AgentRegistry) -> list[RegistryReader]:
    """What keeps each view current: toolsets from `tools.registry`, agents from `agents.registry`."""

    def take_announcement(body: bytes) -> None:
        try:
            announcement = TOOLSET_ANNOUNCED.validate_json(body)
        except ValidationError as error:
            logger.warning("toolset announcement skipped: invalid", errors=error.error_count())
            return
        toolsets.apply(announcement)
        logger.info("toolset announced", toolset=announcement.toolset, tools=len(announcement.tools))

    return [(Topic.TOOLS_REGISTRY, take_announcement), (Topic.AGENTS_REGISTRY, agent_reader(agents))]
