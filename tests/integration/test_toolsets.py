"""Toolsets on their own topics, announced on `tools.registry`, on the real embedded broker and database.

The storage owner, the planner and four tool executors run in this process on one topic
prefix: the default executor (the shipped tools, `tools.calls`), one of the `slow` toolset
(`tools.calls.slow`; its tool blocks until the test lets it go) and two copies of the `fast`
toolset (`tools.calls.fast`). The planner learns all three from their announcements; its model
calls the first tool it is offered, then answers.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faststream import FastStream

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.errors import ErrorCode, StoreRefusedError
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import CancelRun, RunRequested
from quipu.contracts.store import RunStatus
from quipu.contracts.tools import ToolCallCompleted
from quipu.contracts.topics import Topic, dead_letter_topic, toolset_calls_topic
from quipu.contracts.transcript import ToolResultPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.planner.settings import PlannerSettings
from quipu.services.tool_executor.app import ToolExecutorDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.testing import FunctionModel, ModelAnswer, ModelRequest
from quipu.tools import Toolset, tool
from tests.owner_support import RawPublisher, TopicReader
from tests.support.deployment import deployed, unique_prefix
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow


@dataclass
class Slow:
    """The slow toolset's tool: it reports that it started and waits until released."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    hang_canceled: asyncio.Event = field(default_factory=asyncio.Event)

    def toolset(self) -> Toolset:
        @tool(timeout_s=30.0)
        async def crunch(size: int) -> str:
            """Crunches numbers for a long time.

            Args:
                size: How many numbers.
            """
            self.started.set()
            await self.release.wait()
            return f"crunched {size}"

        @tool(timeout_s=30.0)
        async def hang(seconds: int) -> str:
            """Waits until its run is canceled.

            Args:
                seconds: How long it would take.
            """
            self.hanging.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.hang_canceled.set()
                raise
            return f"waited {seconds}"

        return Toolset("slow", tools=[crunch, hang], version="1")


def fast_toolset(copy: str, ran: list[str]) -> Toolset:
    """One copy's `fast` toolset: the same tool, recording which copy ran each call."""

    @tool
    def ping(word: str) -> str:
        """Answers at once.

        Args:
            word: What to echo.
        """
        ran.append(copy)
        return f"pong {word}"

    return Toolset("fast", tools=[ping], version="1")


AGENTS = AgentRegistry(
    [
        AgentDefinition(id="cruncher", instructions="Crunch.", tools=["crunch"]),
        AgentDefinition(id="pinger", instructions="Ping.", tools=["ping"]),
        AgentDefinition(id="hanger", instructions="Wait.", tools=["hang"]),
        AgentDefinition(id="stranded", instructions="Try.", tools=["ping", "vanished_tool"]),
        AgentDefinition(id="latecomer", instructions="Ping late.", tools=["ping_late"]),
    ]
)

ARGUMENTS = {"crunch": {"size": 3}, "hang": {"seconds": 5}, "ping": {"word": "hi"}, "ping_late": {}}


@tool
def ping_late() -> str:
    """Answers, once its executor is up."""
    return "pong, late"


LATE = Toolset("late", tools=[ping_late], version="1")


def call_the_first_tool(request: ModelRequest) -> ModelAnswer:
    """Calls the first offered tool once, then answers."""
    if any(isinstance(part, ToolResultPart) for message in request.messages for part in message.parts):
        return "done"
    name = request.tools[0].name
    return [ToolUsePart(id="toolu_" + uuid.uuid4().hex[:16], name=name, input=ARGUMENTS[name])]


@dataclass
class System:
    store: KafkaStore
    registry: ToolsetRegistry
    events: TopicReader
    results: TopicReader
    slow: Slow
    fast_ran: list[str]
    publisher: RawPublisher
    prefix: str
    settings: KafkaSettings
    sessions: dict[str, str] = field(default_factory=dict)

    async def cancel(self, run_id: str) -> None:
        cancel = CancelRun(run_id=run_id, session_id=self.sessions[run_id])
        await self.publisher.send(
            self.prefix + Topic.RUNS_CONTROL.value,
            cancel.model_dump_json().encode(),
            key=cancel.session_id.encode(),
        )

    async def start(self, agent_id: str) -> str:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id=agent_id, text="go"
        )
        await self.publisher.send(
            self.prefix + Topic.RUNS_REQUESTED.value,
            request.model_dump_json().encode(),
            key=request.partition_key().encode(),
        )
        self.sessions[request.run_id] = session_id
        return request.run_id

    def run_events(self, run_id: str) -> list[RunEvent]:
        parsed = self.events.parsed(RunEvent)
        return [event for event in parsed if event.run_id == run_id]

    def closed(self, run_id: str) -> bool:
        return any(event.type is StreamEventType.RUN_STREAM_END for event in self.run_events(run_id))

    async def until_closed(self, run_ids: list[str], what: str) -> None:
        async def all_closed() -> bool:
            return all(self.closed(run_id) for run_id in run_ids)

        await eventually(all_closed, within=30.0, what=what)

    async def until_announced(self) -> None:
        async def every_toolset() -> bool:
            return {"default", "fast", "slow"} <= set(self.registry.toolsets())

        await eventually(every_toolset, within=20.0, what="every executor's announcement read by the planner")

    def results_of(self, run_id: str) -> list[ToolCallCompleted]:
        parsed = self.results.parsed(ToolCallCompleted)
        return [result for result in parsed if result.run_id == run_id]


async def create_toolset_topics(bootstrap: str, prefix: str, toolsets: list[str]) -> None:
    """A toolset's calls topic and its `.dlq` (a deployment declares them beside the registry's)."""
    names = [prefix + toolset_calls_topic(toolset) for toolset in toolsets]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, 8, 1) for name in names + [dead_letter_topic(n) for n in names]]
        )
    finally:
        await admin.close()


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    prefix = unique_prefix("ts")
    await create_toolset_topics(stack.bootstrap, prefix, ["slow", "fast", "late"])
    settings = stack.kafka_settings(topic_prefix=prefix)
    slow, fast_ran = Slow(), list[str]()
    registry = ToolsetRegistry()
    planner = create_planner(
        settings,
        # Runs wait this long for tools not announced yet: the latecomer's toolset comes in time,
        # the stranded agent's never does.
        PlannerSettings(tools_wait_s=scaled(10.0)),
        deps=PlannerDeps(model=FunctionModel(call_the_first_tool), agents=AGENTS, registry=registry),
    )
    executors: list[FastStream] = [
        create_executor(settings),
        create_executor(settings, deps=ToolExecutorDeps.dedicated(slow.toolset())),
        create_executor(settings, deps=ToolExecutorDeps.dedicated(fast_toolset("one", fast_ran))),
        create_executor(settings, deps=ToolExecutorDeps.dedicated(fast_toolset("two", fast_ran))),
    ]
    async with deployed(
        stack,
        settings,
        executors,  # announced first
        [planner],
        store=True,
        readers=[Topic.RUNS_EVENTS.value, Topic.TOOLS_RESULTS.value],
        publisher=True,
    ) as up:
        events, results = up.readers
        try:
            yield System(up.store, registry, events, results, slow, fast_ran, up.publisher, prefix, settings)
        finally:
            slow.release.set()


async def test_the_planner_learns_every_toolset_from_the_registry(system: System) -> None:
    await system.until_announced()
    assert system.registry.calls_topic("crunch") == "tools.calls.slow"
    assert system.registry.calls_topic("ping") == "tools.calls.fast"
    assert system.registry.calls_topic("calculator") == "tools.calls"


async def test_a_slow_toolset_does_not_delay_another_toolsets_calls(system: System) -> None:
    await system.until_announced()
    slow_run = await system.start("cruncher")
    await asyncio.wait_for(system.slow.started.wait(), scaled(20.0))

    quick_runs = [await system.start("pinger") for _ in range(4)]
    await system.until_closed(quick_runs, "every quick run closed while the slow tool is still blocked")

    # Ordering, not timing: the fast toolset's runs finished while the slow call is still held.
    assert not system.slow.release.is_set() and not system.closed(slow_run)
    for run_id in quick_runs:
        assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
        [result] = system.results_of(run_id)
        assert result.tool_name == "ping" and result.content == "pong hi" and not result.is_error
    assert (await system.store.load_run(slow_run)).status is RunStatus.RUNNING

    system.slow.release.set()
    await system.until_closed([slow_run], "the slow run closed")
    assert (await system.store.load_run(slow_run)).status is RunStatus.COMPLETED
    [crunched] = system.results_of(slow_run)
    assert crunched.content == "crunched 3"


async def test_two_copies_of_one_toolsets_executor_share_its_calls(system: System) -> None:
    await system.until_announced()
    started: list[str] = []
    before = len(system.fast_ran)  # calls of the earlier tests

    async def both_copies_ran() -> bool:
        # A copy joins the group when it starts: calls are sent in rounds until both have run some.
        await system.until_closed(started, "the calls sent so far answered")
        if {"one", "two"} <= set(system.fast_ran[before:]):
            return True
        started.extend([await system.start("pinger") for _ in range(4)])
        return False

    await eventually(both_copies_ran, within=60.0, what="both copies of the fast toolset ran calls")

    assert len(system.fast_ran) - before == len(started)  # no call ran twice
    for run_id in started:
        assert len(system.results_of(run_id)) == 1  # each call answered once, by one copy


async def test_an_agent_declaring_a_tool_nobody_announced_fails_at_run_start(system: System) -> None:
    await system.until_announced()
    run_id = await system.start("stranded")

    await system.until_closed([run_id], "the stranded run closed")

    assert (await system.store.load_run(run_id)).status is RunStatus.FAILED
    said = json.dumps([event.payload for event in system.run_events(run_id)])
    assert "missing_tool" in said and "vanished_tool" in said
    assert system.results_of(run_id) == []  # no tool was called, not even the served one


async def test_a_cancel_reaches_the_toolsets_executor_running_the_call(system: System) -> None:
    await system.until_announced()
    run_id = await system.start("hanger")
    await asyncio.wait_for(system.slow.hanging.wait(), scaled(20.0))

    await system.cancel(run_id)

    await asyncio.wait_for(system.slow.hang_canceled.wait(), scaled(20.0))
    await system.until_closed([run_id], "the canceled run closed")
    assert (await system.store.load_run(run_id)).status is RunStatus.CANCELED
    assert system.results_of(run_id) == []  # a canceled call publishes no result


async def test_a_run_taken_before_its_toolset_is_announced_waits_for_it_then_runs(system: System) -> None:
    """`quipu up --processes` starts the planner and the executors at once: a run the planner takes
    before an executor has announced its toolset waits for the announcement instead of failing."""
    await system.until_announced()
    run_id = await system.start("latecomer")

    async def taken() -> bool:
        try:
            return (await system.store.load_run(run_id)).status is RunStatus.RUNNING
        except StoreRefusedError as error:
            assert error.code is ErrorCode.RUN_NOT_FOUND
            return False  # not taken yet

    await eventually(taken, within=20.0, what="the latecomer's run started")
    assert system.registry.find("ping_late") is None and not system.closed(run_id)
    late = create_executor(system.settings, deps=ToolExecutorDeps.dedicated(LATE))
    await late.start()
    try:
        await system.until_closed([run_id], "the latecomer's run closed once its toolset was announced")
    finally:
        await late.stop()

    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    [result] = system.results_of(run_id)
    assert (result.tool_name, result.content, result.is_error) == ("ping_late", "pong, late", False)
