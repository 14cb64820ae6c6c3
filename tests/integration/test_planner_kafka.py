"""The agent loop on the real embedded broker and database, every service in this process.

The storage owner (on SecantusDB), the planner (its store is the Kafka client to that owner) and
the tool executor run as in-process FastStream apps on one topic prefix; the model is the
offline `ScriptedModel`. Tests talk only through topics, as a gateway would: publish a
`RunRequested`, watch `runs.events` until the run's terminal `workflow`, then read the run back.

Redelivery is shown end to end: every message that drove a finished run is published again,
byte for byte, and the run's records stay identical and the model is not asked again. "Every
replayed message was handled" is observed, not slept on: a closed run answers each replayed
trigger by publishing its end again (the finished turn on `history.turns`), so the test waits
until one more copy per replayed message has arrived.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunKind
from quipu.contracts.store import Record, RunStatus
from quipu.contracts.tools import ToolCallCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import ToolResultPart, ToolUsePart
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.adapters import load_records
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import create_app as create_executor
from tests.owner_support import RawPublisher, TopicReader
from tests.support.conversing import Conversing
from tests.support.deployment import deployed, unique_prefix

pytestmark = pytest.mark.slow

Records = list[ConsumerRecord[bytes, bytes]]


@dataclass
class System(Conversing):
    """The three services on one prefix, a store client, topic readers and a raw publisher."""

    settings: KafkaSettings
    store: KafkaStore
    model: ScriptedModel
    events: TopicReader
    turns: TopicReader
    results: TopicReader
    publisher: RawPublisher
    prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.prefix = self.settings.topic_prefix

    def topic(self, name: Topic) -> str:
        return self.prefix + name.value


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("pl"))
    model = ScriptedModel()
    planner = create_planner(settings, deps=PlannerDeps(model=model))
    executor = create_executor(settings)
    async with deployed(
        stack,
        settings,
        [executor],  # announced before the planner starts, as `quipu up` orders them
        [planner],
        agents=True,
        store=True,
        readers=[name.value for name in _READ],
        publisher=True,
    ) as up:
        events, turns, results = up.readers
        yield System(settings, up.store, model, events, turns, results, up.publisher)


_READ = (Topic.RUNS_EVENTS, Topic.HISTORY_TURNS, Topic.TOOLS_RESULTS)


def workflow_phases(events: list[RunEvent]) -> list[str]:
    return [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]


async def test_calculate_runs_the_tool_round_trip_and_completes(system: System) -> None:
    session = await system.session()
    started = time.monotonic()
    request = await system.turn(session, "calculate 6*7")

    events = await system.until_closed(request.run_id)
    elapsed = time.monotonic() - started

    assert workflow_phases(events) == ["planning", "executing_tools", "synthesizing", "completed"]
    # The result rode in the terminal with the answer: the owner streams what it returned with
    # that command's commit, before the phase it opened.
    shown = [
        (event.type.value, event.payload.get("phase") or event.payload.get("tool_name"))
        for event in events
        if event.type in (StreamEventType.WORKFLOW, StreamEventType.TOOL_END)
    ]
    assert shown[2:] == [("tool_end", "calculator"), ("workflow", "synthesizing"), ("workflow", "completed")]
    replies = "".join(e.payload["text"] for e in events if e.type is StreamEventType.ASSISTANT_REPLY)
    assert "42" in replies
    assert (await system.store.load_run(request.run_id)).status is RunStatus.COMPLETED
    messages = await build_messages_from_run_log(system.store, request.run_id)
    validate_planner_transcript(messages)
    [use] = [part for part in messages[1].parts if isinstance(part, ToolUsePart)]
    assert (use.name, use.input) == ("calculator", {"expression": "6*7"})
    [result] = messages[2].parts
    assert isinstance(result, ToolResultPart) and result.tool_use_id == use.id and not result.is_error
    assert "42" in str(result.content)
    await system.turns.wait_for(lambda _: bool(system.finished_turns(request.run_id)))
    [turn] = system.finished_turns(request.run_id)
    assert turn.user_text == "calculate 6*7" and "42" in turn.assistant_text
    print(f"calculate 6*7: terminal workflow after {elapsed * 1000:.0f} ms")


async def test_a_sessions_owner_is_checked_by_one_command_beside_the_memory_read(system: System) -> None:
    """A session's first turn: the owner check is one command, which the owner applies over its own
    two stores, sent with the memory read before the start (not a status read, then a claim); the
    next turn is checked by the planner's cache of known owners, with no command at all."""
    session = await system.session()

    def ops(records: Records) -> list[str]:
        return [json.loads(record.value or b"")["op"] for record in records if record.key == session.encode()]

    async with TopicReader(system.settings.bootstrap, system.topic(Topic.STORAGE_COMMANDS)) as commands:
        for text in ("calculate 6*7", "calculate 2*3"):
            request = await system.turn(session, text)
            await system.until_closed(request.run_id)
        sent = ops(await commands.wait_for(lambda records: ops(records).count("RecordRunTerminal") == 2))
    checks = [op for op in sent if op in ("LoadSessionStatus", "ClaimSession", "ClaimSessionForTurn")]
    assert checks == ["ClaimSessionForTurn"]
    assert sent.index("ClaimSessionForTurn") < sent.index("StartRootRun")


async def test_republishing_every_message_of_a_finished_run_changes_nothing(system: System) -> None:
    session = await system.session()
    request = await system.turn(session, "calculate 2*21; what time is it")
    await system.until_closed(request.run_id)
    await system.turns.wait_for(lambda _: len(system.finished_turns(request.run_id)) == 1)
    records: list[Record] = await load_records(system.store, request.run_id)
    calls_before = len(system.model.requests)
    results = [
        record
        for record in system.results.records
        if ToolCallCompleted.model_validate_json(record.value or b"").run_id == request.run_id
    ]
    assert len(results) == 2

    replay = [(Topic.RUNS_REQUESTED, request.model_dump_json().encode(), session)]
    replay += [(Topic.TOOLS_RESULTS, record.value or b"", session) for record in results]
    for name, body, key in replay * 2:
        await system.publish(name, body, key)

    expected = 1 + 2 * len(replay)
    await system.turns.wait_for(lambda _: len(system.finished_turns(request.run_id)) == expected)
    assert await load_records(system.store, request.run_id) == records
    assert len(system.model.requests) == calls_before
    assert len({turn.event_id for turn in system.finished_turns(request.run_id)}) == 1


async def test_ask_user_suspends_and_the_answer_continues_the_turn(system: System) -> None:
    session = await system.session()
    first = await system.turn(session, "confirm the booking")
    events = await system.until_closed(first.run_id)
    assert workflow_phases(events)[-1] == "suspended"
    # The await event follows the suspension's commit (and so the owner's run_stream_end).
    await system.events.wait_for(
        lambda _: any(e.type is StreamEventType.AWAIT_CLARIFICATION for e in system.run_events(first.run_id))
    )
    [ask] = [e for e in system.run_events(first.run_id) if e.type is StreamEventType.AWAIT_CLARIFICATION]
    assert "booking" in ask.payload["prompt"]

    resume = await system.turn(
        session, kind=RunKind.RESUME, predecessor_run_id=first.run_id, answer="yes, book it"
    )
    events = await system.until_closed(resume.run_id)
    assert workflow_phases(events) == ["synthesizing", "completed"]
    await system.turns.wait_for(lambda _: bool(system.finished_turns(resume.run_id)))
    [turn] = system.finished_turns(resume.run_id)
    assert turn.user_text == "confirm the booking"
    assert "yes, book it" in turn.assistant_text
    validate_planner_transcript(await build_messages_from_run_log(system.store, resume.run_id))


async def test_agent_tool_runs_a_linked_child_and_answers_with_its_result(system: System) -> None:
    session = await system.session()
    request = await system.turn(session, "ask the math_agent to calculate 6*7")
    events = await system.until_closed(request.run_id, within=30.0)
    assert workflow_phases(events)[-1] == "completed"
    [link] = [e for e in events if e.type is StreamEventType.CHILD_RUN_LINKED]
    child = link.payload["child_run_id"]
    child_meta = await system.store.load_run(child)
    assert (child_meta.parent_run_id, child_meta.agent_id, child_meta.status) == (
        request.run_id,
        "math_agent",
        RunStatus.COMPLETED,
    )
    child_messages = await build_messages_from_run_log(system.store, child)
    assert any(isinstance(p, ToolUsePart) and p.name == "calculator" for p in child_messages[1].parts)
    parent_messages = await build_messages_from_run_log(system.store, request.run_id)
    [result] = parent_messages[2].parts
    assert isinstance(result, ToolResultPart) and "42" in str(result.content)


async def test_invalid_run_request_goes_to_the_dead_letter_topic(system: System) -> None:
    dlq = TopicReader(system.settings.bootstrap, system.topic(Topic.RUNS_REQUESTED) + ".dlq")
    await dlq.start()
    try:
        marker = uuid.uuid4().hex
        await system.publish(Topic.RUNS_REQUESTED, f'{{"not": "{marker}"}}'.encode(), marker)

        def arrived(records: Records) -> bool:
            return any(marker.encode() in (record.value or b"") for record in records)

        [letter] = [r for r in await dlq.wait_for(arrived) if marker.encode() in (r.value or b"")]
        headers: dict[str, Any] = {key: value.decode() for key, value in letter.headers}
        assert headers["x-dlq-reason"] == "invalid_payload"
    finally:
        await dlq.stop()
