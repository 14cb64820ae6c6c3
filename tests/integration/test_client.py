"""A Python program drives runs through `quipu.Client` alone, against the real services.

The storage owner, the planner and the tool executor run in this process on the embedded broker
and database, on this module's own topic prefix (as `test_own_tools.py` runs them); the model is
the offline `ScriptedModel`. The program under test touches nothing but `quipu.Client`: it runs
a turn and follows its events to the end (and again from a position it kept), answers a run
suspended by `ask_user`, and cancels a run that waits on a slow tool of its own. With the
deployment's key channel given, the turn it publishes is sealed under its person's key.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from quipu import Client
from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.store import CancellationReason, RunStatus
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.keys import message_seals
from quipu.services.kit.run_events import StreamedEvent
from quipu.services.kit.settings import KafkaSettings, KeySettings, StoreClientSettings
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.storage_owner.settings import OwnerSettings
from quipu.services.tool_executor.app import ToolExecutorDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.tools import Toolset
from tests.owner_support import every_record_on_topics, free_port, readable_anywhere
from tests.support.deployment import deployed, unique_prefix
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow

desk = Toolset("desk", version="1.0.0")
RELEASE = asyncio.Event()
"""Lets the slow tool answer (set once its run is canceled, and at the end in any case)."""


@desk.tool(timeout_s=120.0)
async def hold(ticket: str) -> str:
    """Waits until the desk is free, then answers (a tool slow enough to cancel its run).

    Args:
        ticket: What the caller waits for.
    """
    await RELEASE.wait()
    return f"ticket {ticket} served"


CLERK = AgentDefinition(id="clerk", instructions="You run a desk.", tools=["hold", "ask_user", "calculator"])


@pytest.fixture(scope="module")
async def kafka(stack: EmbeddedStack) -> AsyncIterator[KafkaSettings]:
    """The three services up on a prefix of their own; the settings a program is given."""
    settings = stack.kafka_settings(topic_prefix=unique_prefix("cli"))
    planner = create_planner(
        settings,
        deps=PlannerDeps(model=ScriptedModel(), agents=AgentRegistry([CLERK])),
    )
    executor = create_executor(settings, deps=ToolExecutorDeps.serving(desk))
    # The executor is announced before the planner starts, as `quipu up` orders them.
    async with deployed(stack, settings, [executor], [planner]):
        try:
            yield settings
        finally:
            RELEASE.set()


@pytest.fixture
async def client(kafka: KafkaSettings) -> AsyncIterator[Client]:
    settings = StoreClientSettings(store_reply_timeout_s=scaled(10.0))
    async with Client(kafka, store_settings=settings, tenant_id="acme", principal_id="ada") as client:
        yield client


def new_session() -> str:
    return "s-" + uuid.uuid4().hex[:10]


async def to_the_end(events: AsyncIterator[StreamedEvent], within_s: float = 60.0) -> list[StreamedEvent]:
    """Every event the iterator gives until it ends; fails after `scaled(within_s)`."""
    seen: list[StreamedEvent] = []

    async def drain() -> None:
        async for streamed in events:
            seen.append(streamed)

    await asyncio.wait_for(drain(), timeout=scaled(within_s))
    return seen


def types(events: list[StreamedEvent]) -> list[StreamEventType]:
    return [streamed.event.type for streamed in events]


async def test_a_turn_is_followed_to_its_end_and_again_from_a_kept_position(client: Client) -> None:
    run_id = await client.run("calculate 6*7", session_id=new_session(), agent_id="clerk")

    events = await to_the_end(client.follow(run_id))

    assert types(events)[-1] is StreamEventType.RUN_STREAM_END
    assert {streamed.event.run_id for streamed in events} == {run_id}
    assert StreamEventType.TOOL_END in types(events)
    positions = [streamed.position for streamed in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    result = await client.result(run_id)
    assert result.status is RunStatus.COMPLETED
    assert "42" in result.text

    # Another program, given only the text of a position, picks up after it.
    kept = str(events[2].position)
    async with Client(client.kafka) as other:
        rest = await to_the_end(other.follow(run_id, after=kept))
    assert [streamed.position for streamed in rest] == positions[3:]


async def test_runs_followed_at_once_each_end_with_their_own_events(client: Client) -> None:
    # One client's streams share one consumer (kit.event_feed): the runs of two sessions, one of
    # them with a second run behind it, followed together, each to its own end.
    first, second = new_session(), new_session()
    run_ids = [
        await client.run("calculate 6*7", session_id=first, agent_id="clerk"),
        await client.run("calculate 2*3", session_id=second, agent_id="clerk"),
    ]
    followed = await asyncio.gather(*(to_the_end(client.follow(run_id)) for run_id in run_ids))
    run_ids.append(await client.run("calculate 5*5", session_id=first, agent_id="clerk"))
    followed.append(await to_the_end(client.follow(run_ids[-1])))

    for run_id, events in zip(run_ids, followed, strict=True):
        assert {streamed.event.run_id for streamed in events} == {run_id}
        assert types(events)[-1] is StreamEventType.RUN_STREAM_END
    assert [(await client.result(run_id)).status for run_id in run_ids] == [RunStatus.COMPLETED] * 3


async def test_a_suspended_run_is_answered_and_its_continuation_completes(client: Client) -> None:
    run_id = await client.run("ask me which city", session_id=new_session(), agent_id="clerk")

    asked = await to_the_end(client.follow(run_id))

    assert (await client.status(run_id)).status is RunStatus.SUSPENDED
    questions = [streamed.event for streamed in asked if streamed.event.type.value.startswith("await_")]
    assert len(questions) == await client.pending_inputs(run_id) == 1
    assert "which city" in str(questions[0].payload)

    continuation = await client.answer(run_id, "Quito")

    answered = await to_the_end(client.follow(continuation))
    assert types(answered)[-1] is StreamEventType.RUN_STREAM_END
    result = await client.result(continuation)
    assert result.status is RunStatus.COMPLETED
    assert result.meta.session_id == (await client.status(run_id)).session_id
    assert "Quito" in result.text
    assert (await client.status(run_id)).successor_run_id == continuation


async def test_a_run_waiting_on_a_slow_tool_is_canceled(client: Client) -> None:
    run_id = await client.run("hold ticket 7", session_id=new_session(), agent_id="clerk")
    following = client.follow(run_id)
    async with following:
        first = await anext(following)  # the run has started: it can only end by its tool or a cancel
    kept = following.position
    assert kept == first.position

    await client.cancel(run_id)

    async def canceled() -> bool:
        return (await client.status(run_id)).status is RunStatus.CANCELED

    await eventually(canceled, within=30.0, what="the run canceled")
    RELEASE.set()
    rest = await to_the_end(client.follow(run_id, after=kept))
    assert types(rest)[-1] is StreamEventType.RUN_STREAM_END
    assert rest[0].position > first.position
    meta = await client.status(run_id)
    assert meta.cancellation_reason == CancellationReason.USER_REQUESTED.value


async def test_with_a_key_channel_a_turn_travels_sealed_under_its_person_s_key(stack: EmbeddedStack) -> None:
    name = "k" + uuid.uuid4().hex[:10]
    prefix = f"{name}."
    kafka = stack.kafka_settings(topic_prefix=prefix)
    port = free_port()
    keys = KeySettings(url=f"http://127.0.0.1:{port}", token=SecretStr("client-test-token"))
    owner = create_owner(kafka, stack.mongo_settings(database=name), OwnerSettings(keys_port=port), keys=keys)
    await create_topics(stack.bootstrap, prefix)
    await owner.start()
    words = "meet me under the old clock tower"
    try:
        settings = StoreClientSettings(keys=keys)
        async with Client(kafka, store_settings=settings, tenant_id="acme", principal_id="ana") as client:
            run_id = await client.run(words, session_id=new_session())
        records = await every_record_on_topics(stack.bootstrap, prefix)
        (published,) = records[prefix + Topic.RUNS_REQUESTED.value]
        assert readable_anywhere(records, words) == []
        seals = message_seals(keys)
        try:
            opened = RunRequested.model_validate_json(await seals.open(published.value or b""))
        finally:
            await seals.close()
        assert (opened.run_id, opened.text, opened.principal_id) == (run_id, words, "ana")
    finally:
        await owner.stop()
        await delete_topics(stack.bootstrap, prefix)
