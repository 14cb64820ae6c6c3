"""A user's own `@tool` functions run end to end offline, on the real embedded broker and database.

The storage owner, the planner and the tool executor run in this process on one topic prefix,
as `test_planner_kafka.py` runs them; the planner's model is the offline `ScriptedModel` and the
executor serves a `Toolset` of two typed functions (one async, one sync) besides the shipped
tools. A run of an agent offered those tools makes the model call them with arguments fitted to
their schemas; the executor validates and runs them; the run completes with their results.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.store import RunStatus
from quipu.contracts.tools import ToolCallCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import ToolResultPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import ToolExecutorDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.testing import ScriptedModel
from quipu.tools import ToolContext, Toolset
from tests.owner_support import TopicReader
from tests.support.deployment import deployed, unique_prefix

pytestmark = pytest.mark.slow

SKU = r"^[A-Z]{3}-\d{3}$"


@dataclass
class Calls:
    """What the user's tools were called with, inside the executor."""

    stock: list[tuple[str, str, str, str]] = field(default_factory=list)
    reserved: list[tuple[str, int, bool]] = field(default_factory=list)


CALLS = Calls()
shop = Toolset("shop", version="1.0.0")


@shop.tool(max_concurrency=4)
async def check_stock(
    sku: Annotated[str, Field(pattern=SKU)],
    warehouse: Literal["lima", "cusco"] = "lima",
    *,
    context: ToolContext,
) -> dict[str, Any]:
    """How many units of an item a warehouse holds.

    Args:
        sku: The item's stock-keeping unit, like "ABC-123".
        warehouse: Which warehouse to look in.
    """
    CALLS.stock.append((sku, warehouse, context.run_id, context.idempotency_key))
    return {"answer": f"{sku} has 7 units in {warehouse}"}


@shop.tool(timeout_s=5.0)
def reserve(sku: Annotated[str, Field(pattern=SKU)], quantity: Annotated[int, Field(ge=1, le=5)]) -> str:
    """Reserves units of an item (a blocking client: it runs in a worker thread).

    Args:
        sku: The item's stock-keeping unit.
        quantity: How many units to hold.
    """
    CALLS.reserved.append((sku, quantity, threading.current_thread() is threading.main_thread()))
    return f"reserved {quantity} of {sku}"


SHOPPER = AgentDefinition(
    id="shopper", instructions="You run a shop.", tools=["check_stock", "reserve", "calculator"]
)


@dataclass
class Shop:
    """The three services, a store client and the topics a client reads."""

    store: KafkaStore
    events: TopicReader
    results: TopicReader
    publish: Any

    def run_events(self, run_id: str) -> list[RunEvent]:
        parsed = self.events.parsed(RunEvent)
        return [event for event in parsed if event.run_id == run_id]

    async def run(self, text: str) -> str:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id="shopper", text=text
        )
        await self.publish(request)
        await self.events.wait_for(
            lambda _: any(e.type is StreamEventType.RUN_STREAM_END for e in self.run_events(request.run_id)),
            within=30.0,
        )
        return request.run_id


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[Shop]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("own"))
    planner = create_planner(
        settings,
        deps=PlannerDeps(model=ScriptedModel(), agents=AgentRegistry([SHOPPER])),
    )
    executor = create_executor(settings, deps=ToolExecutorDeps.serving(shop))
    async with deployed(
        stack,
        settings,
        [executor],  # announced before the planner starts, as `quipu up` orders them
        [planner],
        store=True,
        readers=[Topic.RUNS_EVENTS.value, Topic.TOOLS_RESULTS.value],
        publisher=True,
    ) as up:

        async def publish(request: RunRequested) -> None:
            await up.publisher.send(
                settings.topic_prefix + Topic.RUNS_REQUESTED.value,
                request.model_dump_json().encode(),
                key=request.partition_key().encode(),
            )

        events, results = up.readers
        yield Shop(up.store, events, results, publish)


def _results(system: Shop, run_id: str) -> list[ToolCallCompleted]:
    parsed = system.results.parsed(ToolCallCompleted)
    return [result for result in parsed if result.run_id == run_id]


async def test_the_offline_model_calls_your_tools_and_the_run_completes_with_their_results(
    system: Shop,
) -> None:
    run_id = await system.run("hello, what do you have?")

    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    messages = await build_messages_from_run_log(system.store, run_id)
    validate_planner_transcript(messages)
    uses = [part for part in messages[1].parts if isinstance(part, ToolUsePart)]
    assert [use.name for use in uses] == ["check_stock", "reserve"]  # the user's tools, not the shipped one
    results = [part for part in messages[2].parts if isinstance(part, ToolResultPart)]
    assert [result.is_error for result in results] == [False, False], results

    [(sku, warehouse, _, key)] = [call for call in CALLS.stock if call[2] == run_id]
    assert re.fullmatch(SKU, sku) and warehouse in ("lima", "cusco")
    assert key == uses[0].id  # the idempotency key is the tool-use id
    [reserved] = [call for call in CALLS.reserved if call[0] == uses[1].input["sku"]]
    assert 1 <= reserved[1] <= 5
    assert reserved[2] is False  # the sync tool ran in a worker thread, not the event loop's

    final = " ".join(part.text for part in messages[3].parts if hasattr(part, "text"))
    assert f"The check_stock says {sku} has 7 units in {warehouse}." in final, final
    assert f"reserved {reserved[1]} of {reserved[0]}" in final, final
    assert len(_results(system, run_id)) == 2  # one result per call


async def test_naming_one_of_your_tools_calls_only_that_one(system: Shop) -> None:
    run_id = await system.run("please check_stock for me")
    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    messages = await build_messages_from_run_log(system.store, run_id)
    assert [part.name for part in messages[1].parts if isinstance(part, ToolUsePart)] == ["check_stock"]
