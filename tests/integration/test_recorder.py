"""The transcript recorder on the real embedded broker and database, with the real storage owner.

The owner (MongoDB memory store on SecantusDB), the recorder (its memory store is the Kafka
client to that owner: the production wiring) and, for the last test, the planner run as
in-process FastStream apps on one topic prefix; models are the offline `ScriptedModel`. Turns go
in as `TurnCompleted` on `history.turns`, as the planner publishes them.

"A turn was recorded" is observed on `history.recorded` (the owner announces every committed
append, exact retries included); the recorder handles a session's turns in order, so once turn
N is announced, the fold that followed turn N-1 is done. Only the fold after the last turn is
waited for by reading the summary until its cursor arrives.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.memory import HistoryRecorded, HistoryRole
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.adapters import load_records
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.services.transcript_recorder.app import RecorderDeps
from quipu.services.transcript_recorder.app import create_app as create_recorder
from tests.owner_support import RawPublisher, TopicReader
from tests.support.deployment import deployed, unique_prefix
from tests.timing import scaled

pytestmark = pytest.mark.slow


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    """Wait until `check()` holds (state read back through the owner); fail after `scaled(within)` s."""
    deadline = time.monotonic() + scaled(within)
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {scaled(within):.1f} s")
        await asyncio.sleep(0.05)


@dataclass
class System:
    settings: KafkaSettings
    memory: KafkaMemoryStore
    store: KafkaStore
    recorded: TopicReader
    dead_letters: TopicReader
    events: TopicReader
    publisher: RawPublisher

    def topic(self, name: Topic | str) -> str:
        return self.settings.topic_prefix + str(name)

    async def finish(self, turn: TurnCompleted) -> None:
        """Publish a finished turn on history.turns, as the planner does."""
        await self.publisher.send(
            self.topic(Topic.HISTORY_TURNS), turn.model_dump_json().encode(), key=turn.session_id.encode()
        )

    def announcements(self, turn_id: str) -> int:
        parsed = [
            HistoryRecorded.model_validate_json(record.value or b"") for record in self.recorded.records
        ]
        return sum(1 for event in parsed if event.turn_id == turn_id)

    async def until_announced(self, turn_id: str, count: int = 1) -> None:
        await self.recorded.wait_for(lambda _: self.announcements(turn_id) >= count, within=30.0)

    async def until_cursor(self, session_id: str, cursor: int) -> None:
        async def arrived() -> bool:
            summary = await self.memory.load_summary(session_id)
            return summary is not None and summary.cursor >= cursor

        await eventually(arrived, within=30.0)


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("tr"))
    recorder = create_recorder(settings, deps=RecorderDeps(model=ScriptedModel()))
    planner = create_planner(settings, deps=PlannerDeps(model=ScriptedModel()))
    executor = create_executor(settings)  # announces the shipped tools the assistant declares
    async with deployed(
        stack,
        settings,
        [recorder, executor],
        [planner],  # once the tools are announced, as `quipu up` orders them
        agents=True,
        store=True,
        memory=True,
        readers=[Topic.HISTORY_RECORDED.value, Topic.HISTORY_TURNS.dlq, Topic.RUNS_EVENTS.value],
        publisher=True,
    ) as up:
        recorded, dead_letters, events = up.readers
        yield System(settings, up.memory, up.store, recorded, dead_letters, events, up.publisher)


def finished(session_id: str, number: int) -> TurnCompleted:
    return TurnCompleted(
        event_id=f"{session_id}-turn-{number}",
        session_id=session_id,
        run_id=f"{session_id}-run-{number}",
        agent_id="assistant",
        principal_id="ana",
        user_text=f"u{number}: my parcel {number} should go to Porto.",
        assistant_text=f"a{number}: parcel {number} will go to Porto.",
    )


async def test_turns_on_history_turns_are_recorded_as_two_rows_and_folded_behind_the_window(
    system: System,
) -> None:
    session = "s-" + uuid.uuid4().hex[:10]
    for number in range(1, 9):
        await system.finish(finished(session, number))

    await system.until_announced(f"{session}-run-8")
    await system.until_cursor(session, 4)

    rows = await system.memory.list_history(session, 0, 100)
    assert [(row.seq, row.role, row.text) for row in rows[:2]] == [
        (1, HistoryRole.USER, "u1: my parcel 1 should go to Porto."),
        (2, HistoryRole.ASSISTANT, "a1: parcel 1 will go to Porto."),
    ]
    assert len(rows) == 16
    summary = await system.memory.load_summary(session)
    assert summary is not None
    assert (summary.cursor, summary.version, summary.model) == (4, 2, "scripted")
    assert "u1" in summary.text  # the scripted summarizer's digest starts with what it folded


async def test_a_redelivered_turn_writes_nothing_new(system: System) -> None:
    session = "s-" + uuid.uuid4().hex[:10]
    for number in range(1, 8):
        await system.finish(finished(session, number))
    await system.until_announced(f"{session}-run-7")
    await system.until_cursor(session, 2)
    rows = await system.memory.list_history(session, 0, 100)
    summary = await system.memory.load_summary(session)

    await system.finish(finished(session, 7))
    await system.finish(finished(session, 2))
    await system.until_announced(f"{session}-run-7", count=2)  # the owner answers an exact retry
    await system.until_announced(f"{session}-run-2", count=2)

    assert await system.memory.list_history(session, 0, 100) == rows
    assert await system.memory.load_summary(session) == summary


async def test_a_message_that_is_not_a_turn_goes_to_the_dead_letter_topic(system: System) -> None:
    await system.publisher.send(system.topic(Topic.HISTORY_TURNS), b'{"session_id": 7}', key=b"s-bad")
    records = await system.dead_letters.wait_for(bool, within=30.0)
    headers = dict(records[-1].headers)
    assert headers["x-dlq-reason"] == b"invalid_payload"


async def test_the_planner_builds_each_turn_from_what_the_recorder_recorded(system: System) -> None:
    session = "s-" + uuid.uuid4().hex[:10]
    await system.store.create_session(session, utc_now_ms())
    run_ids = []
    for number in range(1, 9):
        request = RunRequested(
            run_id=f"{session}-r{number}",
            session_id=session,
            agent_id="assistant",
            principal_id="ana",
            text=f"Please remember that parcel {number} goes to Porto.",
        )
        run_ids.append(request.run_id)
        await system.publisher.send(
            system.topic(Topic.RUNS_REQUESTED), request.model_dump_json().encode(), key=session.encode()
        )

        def closed(_: object, run_id: str = request.run_id) -> bool:
            events = [RunEvent.model_validate_json(r.value or b"") for r in system.events.records]
            return any(e.run_id == run_id and e.type is StreamEventType.RUN_STREAM_END for e in events)

        await system.events.wait_for(closed, within=30.0)
        # The next turn waits for this one to be recorded and folded, as a person reading the
        # answer would (turns not recorded yet are covered by their own test).
        await system.until_announced(request.run_id)
        if number > 6:
            await system.until_cursor(session, 2 * (number - 6))

    await system.until_cursor(session, 4)
    records = await load_records(system.store, run_ids[-1])
    [memory_context] = [json.loads(r.payload) for r in records if r.type == "memory_context"]
    # Turn 8 saw turns 2-7 word for word and turn 1 in the summary (the fold after turn 7).
    assert memory_context["window"] == {"first_seq": 3, "last_seq": 14}
    assert memory_context["summary"] == {"version": 1, "cursor": 2}
    assert memory_context["unrecorded_turns"] == 0
    rows = await system.memory.list_history(session, 0, 100)
    assert [row.turn_id for row in rows[::2]] == run_ids
