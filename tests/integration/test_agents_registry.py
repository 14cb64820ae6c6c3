"""Agents as data on the real embedded broker and database: published on `agents.registry`, served
by a running planner without a restart, refused once removed, and known to a planner that starts
after they were published before it takes its first run.

The storage owner, the planner and the default tool executor run in this process on one topic
prefix. The planner's model calls the first tool it is offered once, then answers with the
instructions it was given, so an answer says which agent's definition ran.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import quipu
from quipu.assistant import app as assistant_app
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.store import RunStatus
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import ToolResultPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.agent_publisher import publish_agents, remove_agents
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.shipped_tools import default_catalog
from quipu.services.domain.toolset_registry import ToolsetRegistry, announce
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.logic.view import text_of
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.testing import FunctionModel, ModelAnswer, ModelRequest
from tests.owner_support import RawPublisher, TopicReader
from tests.support.announced import publish_built_in_agents
from tests.support.deployment import deployed, unique_prefix
from tests.timing import eventually

pytestmark = pytest.mark.slow

ARGUMENTS: dict[str, dict[str, Any]] = {"calculator": {"expression": "2+3"}}


@dataclass
class Seen:
    """What the model was asked: the model name of every call."""

    models: list[str] = field(default_factory=list)


def scripted(seen: Seen) -> FunctionModel:
    def answer(request: ModelRequest) -> ModelAnswer:
        seen.models.append(request.model)
        if request.tools and not any(
            isinstance(part, ToolResultPart) for message in request.messages for part in message.parts
        ):
            name = request.tools[0].name
            arguments = ARGUMENTS.get(name, {"task": "add 2 and 3"})  # else an agent-tool
            return [ToolUsePart(id="toolu_" + uuid.uuid4().hex[:16], name=name, input=arguments)]
        return f"answered as: {request.system}"

    return FunctionModel(answer)


@dataclass
class System:
    settings: KafkaSettings
    store: KafkaStore
    agents: AgentRegistry
    events: TopicReader
    publisher: RawPublisher
    seen: Seen

    async def start(self, agent_id: str) -> tuple[str, str]:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id=agent_id, text="go"
        )
        await self.publisher.send(
            self.settings.topic_prefix + Topic.RUNS_REQUESTED.value,
            request.model_dump_json().encode(),
            key=request.partition_key().encode(),
        )
        return request.run_id, session_id

    def run_events(self, run_id: str) -> list[RunEvent]:
        parsed = self.events.parsed(RunEvent)
        return [event for event in parsed if event.run_id == run_id]

    async def until_ended(self, run_id: str, what: str) -> list[RunEvent]:
        async def ended() -> bool:
            return any(event.type is StreamEventType.RUN_STREAM_END for event in self.run_events(run_id))

        await eventually(ended, within=60.0, what=what)
        return self.run_events(run_id)

    async def until_registered(self, agent_id: str, registered: bool = True) -> None:
        async def known() -> bool:
            return (agent_id in self.agents.registered()) is registered

        await eventually(known, within=20.0, what=f"the planner's view of {agent_id} on agents.registry")

    async def answer_of(self, run_id: str) -> str:
        """The text of the run's last assistant message, as its records hold it."""
        messages = await build_messages_from_run_log(self.store, run_id)
        return text_of([message for message in messages if message.role == "assistant"][-1])


def refusal_kind(events: list[RunEvent]) -> str:
    [failed] = [
        event
        for event in events
        if event.type is StreamEventType.WORKFLOW and event.payload.get("phase") == "failed"
    ]
    return str(failed.payload["failure"]["kind"])


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("ag"))
    seen = Seen()
    agents = AgentRegistry()  # the planner's view of agents.registry: what it serves
    planner = create_planner(settings, deps=PlannerDeps(model=scripted(seen), agents=agents))
    executor = create_executor(settings)
    async with deployed(
        stack,
        settings,
        [executor],  # announced before the planner starts, as `quipu up` orders them
        [planner],
        store=True,
        readers=[Topic.RUNS_EVENTS.value],
        publisher=True,
    ) as up:
        [events] = up.readers
        yield System(settings, up.store, agents, events, up.publisher, seen)


async def test_an_agent_applied_to_a_running_planner_is_served_without_a_restart(system: System) -> None:
    early, _ = await system.start("adder")
    assert refusal_kind(await system.until_ended(early, "the run for an unknown agent refused")) == (
        "AGENT_NOT_FOUND"
    )

    adder = quipu.Agent(id="adder", instructions="You add.", tools=["calculator"], model="claude-adder")
    await publish_agents(system.settings, [adder])
    await system.until_registered("adder")
    run_id, _ = await system.start("adder")
    await system.until_ended(run_id, "the run of the applied agent ended")

    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    assert "answered as: You add." in await system.answer_of(run_id)
    assert "claude-adder" in system.seen.models


async def test_the_planner_serves_no_agent_nobody_registered_not_even_the_built_in_assistant(
    system: System,
) -> None:
    refused, _ = await system.start("assistant")
    assert refusal_kind(await system.until_ended(refused, "the assistant's run refused")) == "AGENT_NOT_FOUND"

    await publish_built_in_agents(system.settings)  # what `quipu up` does before anything starts
    await system.until_registered("assistant")
    await system.until_registered("math_agent")
    run_id, _ = await system.start("assistant")
    await system.until_ended(run_id, "the assistant's run ended")

    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    assert system.agents.get_agent("assistant").model_dump() == assistant_app.agents[0].model_dump()


async def test_a_registered_agent_calls_another_registered_agent_as_a_tool(system: System) -> None:
    helper = quipu.Agent(id="helper", instructions="You help.", description="Adds.", tools=["calculator"])
    lead = quipu.Agent(id="lead", instructions="You lead.", tools=[helper])
    await publish_agents(system.settings, [helper, lead])
    await system.until_registered("lead")
    await system.until_registered("helper")

    run_id, session_id = await system.start("lead")
    await system.until_ended(run_id, "the lead's run ended after its helper's child run")

    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    runs = await system.store.list_runs_by_session(session_id, [])
    [child] = [run for run in runs if run.parent_run_id == run_id]
    assert (child.agent_id, child.status) == ("helper", RunStatus.COMPLETED)
    assert "answered as: You lead." in await system.answer_of(run_id)


async def test_a_removed_agent_is_refused_at_run_start(system: System) -> None:
    await publish_agents(system.settings, [quipu.Agent(id="temp", instructions="Soon gone.")])
    await system.until_registered("temp")
    await remove_agents(system.settings, ["temp"])
    await system.until_registered("temp", registered=False)

    run_id, _ = await system.start("temp")
    assert (
        refusal_kind(await system.until_ended(run_id, "the removed agent's run refused")) == "AGENT_NOT_FOUND"
    )


async def test_a_planner_reads_both_registries_to_their_end_before_it_starts(stack: EmbeddedStack) -> None:
    """What was registered before a planner started is in its view when `start()` returns, before
    any run is taken: no run arriving in its first moments fails with missing_tool or unknown agent."""
    prefix = f"ac{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix)
    settings = stack.kafka_settings(topic_prefix=prefix)
    try:
        many = [quipu.Agent(id=f"early-{n}", instructions=f"Agent {n}.") for n in range(40)]
        await publish_agents(settings, many)
        announcement = announce("early", "1", default_catalog(), at=utc_now_ms())
        async with RawPublisher(stack.bootstrap) as raw:
            await raw.send(
                prefix + Topic.TOOLS_REGISTRY.value, announcement.model_dump_json().encode(), key=b"early"
            )
        agents, toolsets = AgentRegistry(), ToolsetRegistry()
        planner = create_planner(
            settings,
            deps=PlannerDeps(model=FunctionModel(lambda request: "hi"), agents=agents, registry=toolsets),
        )
        seen_before_subscribing: list[tuple[list[str], list[str]]] = []

        @planner.on_startup
        def before_the_broker_starts() -> None:
            # Start-up hooks run in order, all before the broker starts any subscriber: what the
            # view holds here is what the first run taken would find.
            seen_before_subscribing.append((agents.registered(), toolsets.toolsets()))

        await planner.start()
        try:
            assert seen_before_subscribing == [(sorted(agent.id for agent in many), ["early"])]
        finally:
            await planner.stop()
    finally:
        await delete_topics(stack.bootstrap, prefix)
