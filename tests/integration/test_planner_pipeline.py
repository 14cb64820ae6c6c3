"""A new turn's start is pipelined: the model is called while the start is on its way, and the first
step follows the start on its partition, naming the log it assumed (AppendRunRecords `follows`).

The storage owner (group commit on), the planner and the tool executor run in this process on the
embedded broker and database; the planner's store client notes every command it sends and how it
was answered. What must hold:

- a turn that can be no redelivery is pipelined, and its step lands right behind its start, with
  many sessions' turns at once under group commit too;
- a duplicate request (the same run asked for again) is never pipelined: the model is not asked
  again;
- a start that stops (the session had ended) or is refused while its step is on its way leaves
  nothing of the step: no record, no tool call, no text streamed;
- a plain turn (its first answer closes the run) sends its terminal behind its start the same
  way (RecordRunTerminal `follows`), and a stopped start leaves nothing of that answer either.

A child run (an agent called as a tool) is pipelined the same way: its start and first step in one
round trip; a parent closed or a session ended leaves nothing of the child's step, and the parent
still hears that its child did not run; a redelivered or repeated child request is never pipelined.
A resume's start carries its context, its predecessor's transcript and the answer, and is pipelined
too: a second answer to the same question is refused at the start and leaves nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel, ValidationError

from quipu.contracts.commands import (
    AppendRunRecords,
    RecordRunTerminal,
    StartChildRun,
    StartOneShotChildRun,
    StartOneShotRun,
    StartRootRun,
    StoreOperation,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import encode_run_started
from quipu.contracts.runs import ParentToolCall, RunKind, RunRequested, TurnCompleted
from quipu.contracts.store import LifecycleType, RunStart, RunStatus
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.contracts.wire import to_millisecond, utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.models.port import ModelError, ModelRequest, ModelResponse, TextDelta
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.adapters import load_records
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.logic.keys import STARTED_KEY
from quipu.services.planner.logic.starts import start_plan
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.storage_owner.settings import OwnerSettings
from quipu.services.tool_executor.app import create_app as create_executor
from tests.owner_support import RawPublisher, TopicReader
from tests.support.announced import publish_built_in_agents
from tests.timing import eventually

pytestmark = pytest.mark.slow

M = TypeVar("M", bound=BaseModel)


@dataclass
class Sent:
    """One command the planner sent, and how it was answered (None: not yet, or by a result)."""

    command: StoreOperation
    refused: ErrorCode | None = None


class NotingStore(KafkaStore):
    """The planner's store client, noting each command it sends and each refusal it gets."""

    def __init__(self, settings: KafkaSettings) -> None:
        super().__init__(settings)
        self.noted: list[Sent] = []

    async def call(self, command: StoreOperation) -> Any:
        noted = Sent(command)
        self.noted.append(noted)
        try:
            return await super().call(command)
        except StoreError as error:
            noted.refused = error.code
            raise

    def steps_of(self, run_id: str) -> list[Sent]:
        """The steps (AppendRunRecords) sent for a run."""
        return [
            sent
            for sent in self.noted
            if isinstance(sent.command, AppendRunRecords) and sent.command.records[0].run_id == run_id
        ]

    def terminals_of(self, run_id: str) -> list[Sent]:
        """The terminals (RecordRunTerminal) sent for a run."""
        return [
            sent
            for sent in self.noted
            if isinstance(sent.command, RecordRunTerminal) and sent.command.record.run_id == run_id
        ]

    def starts_of(self, run_id: str) -> list[Sent]:
        return [
            sent
            for sent in self.noted
            if isinstance(sent.command, StartRootRun | StartOneShotRun | StartChildRun | StartOneShotChildRun)
            and sent.command.run.run_id == run_id
        ]


class FailingOnce(ScriptedModel):
    """The scripted model, failing the first call of the runs named in `fail_once` (retryably)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_once: set[str] = set()
        self.failed: list[str] = []

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        run_id = request.call_key.split("/")[0]
        if run_id in self.fail_once:
            self.fail_once.discard(run_id)
            self.failed.append(run_id)
            raise ModelError("briefly overloaded", kind="overloaded", retryable=True)
        return await super().complete(request, on_text)


@dataclass
class System:
    settings: KafkaSettings
    store: KafkaStore
    planner_store: NotingStore
    model: FailingOnce
    events: TopicReader
    turns: TopicReader
    calls: TopicReader
    results: TopicReader
    publisher: RawPublisher

    async def session(self) -> str:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        return session_id

    async def request(self, request: RunRequested) -> RunRequested:
        topic = self.settings.topic_prefix + Topic.RUNS_REQUESTED.value
        key = request.partition_key().encode()
        await self.publisher.send(topic, request.model_dump_json().encode(), key=key)
        return request

    def run_events(self, run_id: str) -> list[RunEvent]:
        return [event for event in _parsed(self.events, RunEvent) if event.run_id == run_id]

    async def until_closed(self, run_id: str) -> list[RunEvent]:
        await self.events.wait_for(
            lambda _: any(event.type is StreamEventType.RUN_STREAM_END for event in self.run_events(run_id))
        )
        return self.run_events(run_id)

    def finished_turns(self, run_id: str) -> list[TurnCompleted]:
        parsed = [TurnCompleted.model_validate_json(record.value or b"") for record in self.turns.records]
        return [turn for turn in parsed if turn.run_id == run_id]

    def calls_of(self, run_id: str) -> list[ToolCallRequested]:
        return [call for call in _parsed(self.calls, ToolCallRequested) if call.run_id == run_id]

    def results_of(self, run_id: str) -> list[ToolCallCompleted]:
        return [result for result in _parsed(self.results, ToolCallCompleted) if result.run_id == run_id]

    async def running_parent(self, session_id: str) -> str:
        """A root run of the session started in the store and left running (a parent for children
        published by hand: it never made their tool calls, so their results are ignored)."""
        run = RunStart(
            run_id="r-" + uuid.uuid4().hex,
            agent_id="assistant",
            session_id=session_id,
            started_at=utc_now_ms(),
        )
        plan = start_plan(run)
        await self.store.start_root_run(run, plan.started, plan.stopped)
        return run.run_id

    async def child(self, session_id: str, parent_run_id: str, run_id: str = "") -> RunRequested:
        """Ask math_agent to calculate 6*7 in a child run of `parent_run_id`, as the planner does
        for an agent-tool call."""
        parent = ParentToolCall(
            parent_run_id=parent_run_id,
            parent_agent_id="assistant",
            tool_call_id="tu-" + uuid.uuid4().hex[:12],
            tool_name="math_agent",
        )
        return await self.request(
            RunRequested(
                kind=RunKind.CHILD,
                run_id=run_id or "r-" + uuid.uuid4().hex,
                session_id=session_id,
                agent_id="math_agent",
                text="calculate 6*7",
                parent=parent,
            )
        )

    async def step_refused(self, run_id: str, terminal: bool = False) -> None:
        """Wait until the run's first step (or its `terminal`) is answered with a refusal."""
        sent_of = self.planner_store.terminals_of if terminal else self.planner_store.steps_of

        async def refused() -> bool:
            sent = sent_of(run_id)
            return bool(sent) and sent[0].refused is not None

        what = "terminal" if terminal else "first step"
        await eventually(refused, within=20.0, what=f"the refusal of {run_id}'s {what}")

    async def read_past(self, reader: TopicReader, key: str) -> None:
        """Wait until `reader` has read a marker published now with `key`: whatever was published
        with that key before (on its partition) has been read too."""
        marker = f'{{"marker":"{uuid.uuid4().hex}"}}'.encode()
        await self.publisher.send(reader.topic, marker, key=key.encode())
        await reader.wait_for(lambda records: any(record.value == marker for record in records))

    def model_calls(self, run_id: str) -> int:
        return sum(request.call_key.startswith(f"{run_id}/") for request in self.model.requests)


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    prefix = f"pp{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix)
    settings = stack.kafka_settings(topic_prefix=prefix)
    await publish_built_in_agents(settings)
    model = FailingOnce()
    owner = create_owner(
        settings, stack.mongo_settings(database=prefix.rstrip(".")), OwnerSettings(group_commit_max=16)
    )
    planner_store = NotingStore(settings)
    planner = create_planner(settings, deps=PlannerDeps(model=model, store=planner_store))
    executor = create_executor(settings)
    started = time.monotonic()
    await owner.start()
    store = KafkaStore(settings)
    await store.start()
    await planner_store.start()
    await executor.start()
    await planner.start()
    readers = [
        TopicReader(stack.bootstrap, prefix + name.value)
        for name in (Topic.RUNS_EVENTS, Topic.HISTORY_TURNS, Topic.TOOLS_CALLS, Topic.TOOLS_RESULTS)
    ]
    for reader in readers:
        await reader.start()
    print(f"system up in {time.monotonic() - started:.1f} s")
    try:
        async with RawPublisher(stack.bootstrap) as publisher:
            events, turns, calls, results = readers
            yield System(settings, store, planner_store, model, events, turns, calls, results, publisher)
    finally:
        for reader in readers:
            await reader.stop()
        await planner.stop()
        await executor.stop()
        await planner_store.stop()
        await store.stop()
        await owner.stop()
        await delete_topics(stack.bootstrap, prefix)


def _parsed(reader: TopicReader, model: type[M]) -> list[M]:
    """The records of `reader` that are `model`s (the markers of `read_past` are not)."""
    parsed: list[M] = []
    for record in reader.records:
        try:
            parsed.append(model.model_validate_json(record.value or b""))
        except ValidationError:
            continue
    return parsed


def turn(session_id: str, text: str = "calculate 6*7", run_id: str | None = None) -> RunRequested:
    return RunRequested(
        run_id=run_id or "r-" + uuid.uuid4().hex, session_id=session_id, agent_id="assistant", text=text
    )


def assert_pipelined_and_appended(
    system: System, run_id: str, start_type: type[StartRootRun | StartChildRun] = StartRootRun
) -> None:
    """The run's first step was sent behind its start, following the start's records, and landed."""
    [start] = system.planner_store.starts_of(run_id)
    assert isinstance(start.command, start_type) and start.refused is None
    first = system.planner_store.steps_of(run_id)[0]
    assert isinstance(first.command, AppendRunRecords) and first.refused is None
    follows = first.command.follows
    assert follows is not None, "the first step was not pipelined"
    assert follows.keys == [STARTED_KEY, *(record.event_key for record in start.command.records)]
    assert [call.call.tool_name for call in first.command.calls] == ["calculator"]


async def test_a_new_turn_is_pipelined_and_runs_as_before(system: System) -> None:
    request = await system.request(turn(await system.session()))
    events = await system.until_closed(request.run_id)
    phases = [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]
    assert phases == ["planning", "executing_tools", "synthesizing", "completed"]
    assert_pipelined_and_appended(system, request.run_id)
    assert system.model_calls(request.run_id) == 2
    assert len(system.calls_of(request.run_id)) == 1


def assert_closed_behind_its_start(system: System, run_id: str) -> None:
    """The run's only write after its start was its terminal, sent behind the start, following the
    start's records, and it landed."""
    [start] = system.planner_store.starts_of(run_id)
    assert isinstance(start.command, StartRootRun) and start.refused is None
    assert system.planner_store.steps_of(run_id) == []
    [closing] = system.planner_store.terminals_of(run_id)
    assert isinstance(closing.command, RecordRunTerminal) and closing.refused is None
    follows = closing.command.follows
    assert follows is not None, "the terminal was not pipelined"
    assert follows.keys == [STARTED_KEY, *(record.event_key for record in start.command.records)]


async def test_a_plain_turn_is_closed_right_behind_its_start(system: System) -> None:
    request = await system.request(turn(await system.session(), "hello"))
    events = await system.until_closed(request.run_id)
    phases = [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]
    assert phases == ["planning", "completed"]
    assert_closed_behind_its_start(system, request.run_id)
    assert system.model_calls(request.run_id) == 1
    assert any(event.type is StreamEventType.ASSISTANT_REPLY for event in events)


async def test_a_plain_turn_whose_session_had_ended_leaves_nothing_of_its_answer(system: System) -> None:
    session_id = await system.session()
    await system.store.end_session(session_id, utc_now_ms())
    request = await system.request(turn(session_id, "hello"))
    events = await system.until_closed(request.run_id)
    [workflow] = [event for event in events if event.type is StreamEventType.WORKFLOW]
    assert workflow.payload["cancellation"] == {"reason": "session_ended"}
    await system.step_refused(request.run_id, terminal=True)
    [closing] = system.planner_store.terminals_of(request.run_id)
    assert isinstance(closing.command, RecordRunTerminal) and closing.command.follows is not None
    assert closing.refused is ErrorCode.RUN_LOG_MOVED
    assert system.model_calls(request.run_id) == 1
    types = [record.type for record in await load_records(system.store, request.run_id)]
    assert types == [LifecycleType.RUN_STARTED.value, LifecycleType.RUN_COMPLETED.value]
    await assert_said_and_called_nothing(system, request.run_id, session_id)


async def test_turns_of_many_sessions_at_once_keep_each_start_before_its_step(system: System) -> None:
    # Under group commit the owner applies different sessions' commands in shared transactions;
    # one session's are applied in the order sent, so each step still finds its start's log.
    sessions = [await system.session() for _ in range(8)]
    requests = [turn(session_id) for session_id in sessions]
    await asyncio.gather(*(system.request(request) for request in requests))
    for request in requests:
        await system.until_closed(request.run_id)
    for request in requests:
        assert_pipelined_and_appended(system, request.run_id)
        assert (await system.store.load_run(request.run_id)).status is RunStatus.COMPLETED
        assert system.model_calls(request.run_id) == 2


async def test_a_duplicate_request_asks_the_model_no_more(system: System) -> None:
    request = await system.request(turn(await system.session()))
    await system.until_closed(request.run_id)
    await system.turns.wait_for(lambda _: len(system.finished_turns(request.run_id)) == 1)
    records = await load_records(system.store, request.run_id)
    steps = len(system.planner_store.steps_of(request.run_id))
    # The same request again, after this planner started the run: a first delivery of its message,
    # but of a run it started, so its start is answered before anything else is done.
    await system.request(request)
    await system.turns.wait_for(lambda _: len(system.finished_turns(request.run_id)) == 2)
    assert system.model_calls(request.run_id) == 2
    assert await load_records(system.store, request.run_id) == records
    assert len(system.planner_store.steps_of(request.run_id)) == steps  # no step sent again


async def test_a_turn_whose_session_had_ended_leaves_nothing_of_its_step(system: System) -> None:
    session_id = await system.session()
    await system.store.end_session(session_id, utc_now_ms())
    request = await system.request(turn(session_id))
    events = await system.until_closed(request.run_id)
    [workflow] = [event for event in events if event.type is StreamEventType.WORKFLOW]
    assert workflow.payload["cancellation"] == {"reason": "session_ended"}
    # The model was asked while the start was on its way (the pipelined path ran) ...
    await system.step_refused(request.run_id)
    [step] = system.planner_store.steps_of(request.run_id)
    assert isinstance(step.command, AppendRunRecords) and step.command.follows is not None
    assert step.refused is ErrorCode.RUN_LOG_MOVED
    assert system.model_calls(request.run_id) == 1
    # ... and nothing it said was kept or sent: the stop's two records, no call, no text.
    types = [record.type for record in await load_records(system.store, request.run_id)]
    assert types == [LifecycleType.RUN_STARTED.value, LifecycleType.RUN_COMPLETED.value]
    # Text deltas are published before the step is sent, calls by the owner before its reply.
    await system.read_past(system.events, session_id)
    await system.read_past(system.calls, request.run_id)
    assert system.calls_of(request.run_id) == []
    spoken = {StreamEventType.ASSISTANT_REPLY, StreamEventType.ASSISTANT_TURN}
    assert not [event for event in system.run_events(request.run_id) if event.type in spoken]


async def test_a_refused_start_leaves_nothing_of_its_step(system: System) -> None:
    # A sessionless run already holds this id, started at another time: the turn's start is refused
    # (RUN_CONFLICT), and the step sent behind it must not land on that other run.
    run_id = "r-" + uuid.uuid4().hex
    earlier = RunStart(
        run_id=run_id, agent_id="assistant", started_at=to_millisecond(utc_now_ms() - timedelta(seconds=5))
    )
    started = earlier.record(STARTED_KEY, LifecycleType.RUN_STARTED.value, encode_run_started(earlier))
    await system.store.start_one_shot_run(earlier, started)
    await system.request(RunRequested(run_id=run_id, agent_id="assistant", text="calculate 6*7"))
    await system.step_refused(run_id)
    # Refused, then sent again without the first records (the run's other start may have had
    # others), refused again: the request goes to the dead-letter topic.
    starts = system.planner_store.starts_of(run_id)
    assert starts[0].refused is ErrorCode.RUN_CONFLICT
    [step] = system.planner_store.steps_of(run_id)
    assert isinstance(step.command, AppendRunRecords) and step.command.follows is not None
    assert step.refused is ErrorCode.RUN_LOG_MOVED
    assert [record.event_key for record in await load_records(system.store, run_id)] == [STARTED_KEY]
    await system.read_past(system.events, run_id)
    await system.read_past(system.calls, run_id)
    assert system.calls_of(run_id) == []
    spoken = {StreamEventType.ASSISTANT_REPLY, StreamEventType.ASSISTANT_TURN}
    assert not [event for event in system.run_events(run_id) if event.type in spoken]
    assert (await system.store.load_run(run_id)).status is RunStatus.RUNNING  # the earlier run's


# --- children ---------------------------------------------------------------------------------------


def assert_left_nothing_of_its_step(system: System, run_id: str) -> Sent:
    """The run's one step was sent behind its start, naming the log it assumed, and refused."""
    [step] = system.planner_store.steps_of(run_id)
    assert isinstance(step.command, AppendRunRecords) and step.command.follows is not None
    assert step.refused is not None
    return step


async def assert_said_and_called_nothing(system: System, run_id: str, session_id: str) -> None:
    # Text deltas are published before the step is sent, calls by the owner before its reply.
    await system.read_past(system.events, session_id)
    await system.read_past(system.calls, run_id)
    assert system.calls_of(run_id) == []
    spoken = {StreamEventType.ASSISTANT_REPLY, StreamEventType.ASSISTANT_TURN}
    assert not [event for event in system.run_events(run_id) if event.type in spoken]


async def test_an_agent_tools_child_is_pipelined_and_answers_its_parent(system: System) -> None:
    request = await system.request(turn(await system.session(), "ask the math_agent to calculate 6*7"))
    events = await system.until_closed(request.run_id)
    [link] = [event for event in events if event.type is StreamEventType.CHILD_RUN_LINKED]
    child = link.payload["child_run_id"]
    assert_pipelined_and_appended(system, child, StartChildRun)
    assert (await system.store.load_run(child)).status is RunStatus.COMPLETED
    assert system.model_calls(child) == 2
    [answer] = system.results_of(request.run_id)  # the child's answer, the parent's tool result
    assert not answer.is_error and "42" in str(answer.content)
    assert (await system.store.load_run(request.run_id)).status is RunStatus.COMPLETED


async def test_a_child_whose_parent_closed_leaves_nothing_of_its_step(system: System) -> None:
    session_id = await system.session()
    parent = await system.request(turn(session_id, "hello"))
    await system.until_closed(parent.run_id)
    request = await system.child(session_id, parent.run_id)
    # The parent hears that its child did not run; the child's start was refused ...
    await system.results.wait_for(lambda _: bool(system.results_of(parent.run_id)))
    [result] = system.results_of(parent.run_id)
    assert request.parent is not None
    assert result.is_error and result.tool_use_id == request.parent.tool_call_id
    [start] = system.planner_store.starts_of(request.run_id)
    assert start.refused is ErrorCode.RUN_NOT_ACTIVE
    # ... while its model was asked (the pipelined path ran), and nothing it said was kept or sent.
    await system.step_refused(request.run_id)
    assert_left_nothing_of_its_step(system, request.run_id)
    assert system.model_calls(request.run_id) == 1
    with pytest.raises(StoreError) as missing:
        await system.store.load_run(request.run_id)
    assert missing.value.code is ErrorCode.RUN_NOT_FOUND
    await assert_said_and_called_nothing(system, request.run_id, session_id)


async def test_a_child_whose_session_ended_leaves_nothing_of_its_step(system: System) -> None:
    session_id = await system.session()
    parent_run_id = await system.running_parent(session_id)
    await system.store.end_session(session_id, utc_now_ms())
    request = await system.child(session_id, parent_run_id)
    await system.results.wait_for(lambda _: bool(system.results_of(parent_run_id)))
    [result] = system.results_of(parent_run_id)
    assert result.is_error and "did not run" in str(result.content)
    await system.step_refused(request.run_id)
    step = assert_left_nothing_of_its_step(system, request.run_id)
    assert step.refused is ErrorCode.RUN_LOG_MOVED
    assert system.model_calls(request.run_id) == 1
    types = [record.type for record in await load_records(system.store, request.run_id)]
    assert types == [LifecycleType.RUN_STARTED.value, LifecycleType.RUN_COMPLETED.value]
    await assert_said_and_called_nothing(system, request.run_id, session_id)


async def test_a_redelivered_child_request_is_never_pipelined(system: System) -> None:
    session_id = await system.session()
    parent_run_id = await system.running_parent(session_id)
    run_id = "r-" + uuid.uuid4().hex
    # The child's first model call fails (retryably): the request is handled again, in process,
    # and that second handling is no first delivery, so its start is answered before the model.
    system.model.fail_once.add(run_id)
    await system.child(session_id, parent_run_id, run_id)
    await system.results.wait_for(lambda _: bool(system.results_of(parent_run_id)))
    assert system.model.failed.count(run_id) == 1
    assert (await system.store.load_run(run_id)).status is RunStatus.COMPLETED
    steps = [sent.command for sent in system.planner_store.steps_of(run_id) if sent.refused is None]
    assert len(steps) == len(system.planner_store.steps_of(run_id)) > 0
    assert all(isinstance(step, AppendRunRecords) and step.follows is None for step in steps)
    [result] = system.results_of(parent_run_id)
    assert "42" in str(result.content)


async def test_a_repeated_child_request_asks_the_model_no_more(system: System) -> None:
    session_id = await system.session()
    parent_run_id = await system.running_parent(session_id)
    request = await system.child(session_id, parent_run_id)
    await system.results.wait_for(lambda _: len(system.results_of(parent_run_id)) == 1)
    assert_pipelined_and_appended(system, request.run_id, StartChildRun)
    records = await load_records(system.store, request.run_id)
    steps = len(system.planner_store.steps_of(request.run_id))
    await system.request(request)  # the same request again: a run this planner started
    await system.results.wait_for(lambda _: len(system.results_of(parent_run_id)) == 2)
    assert system.model_calls(request.run_id) == 2
    assert await load_records(system.store, request.run_id) == records
    assert len(system.planner_store.steps_of(request.run_id)) == steps


# --- resumes ----------------------------------------------------------------------------------------


async def suspended_turn(system: System, session_id: str) -> str:
    """A turn of the session suspended on its question (the calling ask_user tool)."""
    request = await system.request(turn(session_id, "confirm the booking"))
    events = await system.until_closed(request.run_id)
    assert [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW][-1] == (
        "suspended"
    )
    return request.run_id


def resume(session_id: str, predecessor_run_id: str, answer: str = "yes, book it") -> RunRequested:
    return RunRequested(
        kind=RunKind.RESUME,
        run_id="r-" + uuid.uuid4().hex,
        session_id=session_id,
        agent_id="assistant",
        predecessor_run_id=predecessor_run_id,
        answer=answer,
    )


async def test_a_resume_starts_with_its_answer_and_continues_the_turn(system: System) -> None:
    session_id = await system.session()
    request = await system.request(resume(session_id, await suspended_turn(system, session_id)))
    events = await system.until_closed(request.run_id)
    phases = [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]
    assert phases == ["synthesizing", "completed"]
    # The start carries the continuation's context, its predecessor's transcript and the answer.
    [start] = system.planner_store.starts_of(request.run_id)
    assert isinstance(start.command, StartRootRun) and start.refused is None
    assert [record.event_key for record in start.command.records][:3] == ["context", "seed", "input"]
    assert system.model_calls(request.run_id) == 1
    assert_closed_behind_its_start(system, request.run_id)  # its first step is the answer
    await system.turns.wait_for(lambda _: bool(system.finished_turns(request.run_id)))
    [finished] = system.finished_turns(request.run_id)
    assert "yes, book it" in finished.assistant_text


async def test_a_second_answer_to_a_resumed_run_leaves_nothing(system: System) -> None:
    session_id = await system.session()
    predecessor = await suspended_turn(system, session_id)
    first = await system.request(resume(session_id, predecessor))
    await system.until_closed(first.run_id)
    # Another answer to the same question: its start is refused (the run has its successor). Its
    # model was asked while the start was on its way (the pipelined path ran); nothing it said is
    # kept or streamed, and its stream hears the refusal.
    second = await system.request(resume(session_id, predecessor, "no, cancel it"))
    await system.until_closed(second.run_id)
    # Refused, then sent again without its first records (as an earlier attempt may have started
    # it), refused again: the request goes to the dead-letter topic.
    assert system.model_calls(second.run_id) == 1
    starts = system.planner_store.starts_of(second.run_id)
    assert [start.refused for start in starts] == [ErrorCode.RUN_CONFLICT, ErrorCode.RUN_CONFLICT]
    with pytest.raises(StoreError) as missing:
        await system.store.load_run(second.run_id)
    assert missing.value.code is ErrorCode.RUN_NOT_FOUND
    await assert_said_and_called_nothing(system, second.run_id, session_id)
