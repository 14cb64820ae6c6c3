"""Conversation memory keeps its promises, seen from outside the real services.

The storage owner (MongoDB stores on SecantusDB), planner, transcript recorder, fact extractor and
enricher run as in-process FastStream apps on one topic prefix of the embedded broker, every
model the offline `ScriptedModel` (what runs wherever there is no key). The test is a user: it
publishes `RunRequested` turns, waits for each run to close on `runs.events`, and reads back what
a person could see: history, facts, their export and the session summary, through the owner.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.memory import FactChanged, FactChangeKind, HistoryRole, MemoryScope
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import Message, TextPart
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.memory.summary import SUMMARY_HEADER, neutralise
from quipu.services.domain.models.estimate import estimate_text_tokens
from quipu.services.domain.models.port import ModelRequest
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.enricher.app import create_app as create_enricher
from quipu.services.fact_extractor.app import FactExtractorDeps
from quipu.services.fact_extractor.app import create_app as create_extractor
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.adapters import load_records
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.services.transcript_recorder.app import RecorderDeps
from quipu.services.transcript_recorder.app import create_app as create_recorder
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings
from tests.owner_support import RawPublisher, TopicReader
from tests.support.deployment import deployed, unique_prefix
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow


@dataclass
class System:
    """The five services on one prefix, the owner's clients, and readers of what they announce."""

    settings: KafkaSettings
    memory: KafkaMemoryStore
    store: KafkaStore
    planner_model: ScriptedModel
    events: TopicReader
    changes: TopicReader
    publisher: RawPublisher

    async def turn(self, session_id: str, principal_id: str, text: str) -> str:
        """One user turn: publish it, wait for its run to close; returns the run id."""
        request = RunRequested(
            run_id=f"{session_id}-r{uuid.uuid4().hex[:8]}",
            session_id=session_id,
            agent_id="assistant",
            principal_id=principal_id,
            text=text,
        )
        topic = self.settings.topic_prefix + Topic.RUNS_REQUESTED.value
        await self.publisher.send(topic, request.model_dump_json().encode(), key=session_id.encode())

        def closed(_: object) -> bool:
            parsed = self.events.parsed(RunEvent)
            return any(
                e.run_id == request.run_id and e.type is StreamEventType.RUN_STREAM_END for e in parsed
            )

        await self.events.wait_for(closed, within=30.0)
        return request.run_id

    async def new_session(self) -> str:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        return session_id

    async def until_changed(self, principal_id: str, kind: FactChangeKind) -> FactChanged:
        def found() -> FactChanged | None:
            for record in self.changes.records:
                change = FactChanged.model_validate_json(record.value or b"")
                if change.scope.principal_id == principal_id and change.kind is kind:
                    return change
            return None

        await self.changes.wait_for(lambda _: found() is not None, within=30.0)
        change = found()
        assert change is not None
        return change

    async def answer(self, session_id: str, run_id: str) -> str:
        """What the agent answered in the run, read back from the session's history."""
        rows: list[str] = []

        async def recorded() -> bool:
            history = await self.memory.list_history(session_id, 0, 500)
            rows[:] = [
                row.text for row in history if row.turn_id == run_id and row.role is HistoryRole.ASSISTANT
            ]
            return bool(rows)

        await eventually(recorded, within=30.0, what=f"the answer of {run_id} in the history")
        return rows[0]


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("mp"))
    planner_model = ScriptedModel()
    planner = create_planner(settings, deps=PlannerDeps(model=planner_model))
    recorder = create_recorder(settings, deps=RecorderDeps(model=ScriptedModel()))
    extractor = create_extractor(settings, deps=FactExtractorDeps(model=ScriptedModel()))
    enricher = create_enricher(settings)
    executor = create_executor(settings)  # announces the shipped tools the assistant declares
    async with deployed(
        stack,
        settings,
        [executor],  # announced before the planner starts, as `quipu up` orders them
        [planner, recorder, extractor, enricher],
        agents=True,
        store=True,
        memory=True,
        readers=[Topic.RUNS_EVENTS.value, Topic.MEMORY_CHANGES.value],
        publisher=True,
    ) as up:
        events, changes = up.readers
        yield System(settings, up.memory, up.store, planner_model, events, changes, up.publisher)


async def test_a_fact_said_again_with_a_new_value_is_updated_not_duplicated(system: System) -> None:
    person = "ana-" + uuid.uuid4().hex[:6]
    scope = MemoryScope(principal_id=person, agent_id="assistant")

    await system.turn(await system.new_session(), person, "Hello! My favourite colour is blue.")
    created = await system.until_changed(person, FactChangeKind.CREATED)
    await system.turn(await system.new_session(), person, "News: my favourite colour is green now.")
    updated = await system.until_changed(person, FactChangeKind.UPDATED)

    assert updated.fact_id == created.fact_id
    [fact] = await system.memory.list_facts(scope)
    assert (fact.fact_id, fact.version, fact.text) == (created.fact_id, 2, "My favourite colour is green now")
    export = await system.memory.export_principal(scope)
    assert [(old.fact_id, old.version, old.text) for old in export.audit] == [
        (created.fact_id, 1, "My favourite colour is blue")
    ]
    assert export.audit[0].updated_at <= fact.updated_at

    asking = await system.new_session()
    run_id = await system.turn(asking, person, "What is my favourite colour?")
    records = await load_records(system.store, run_id)
    [context] = [json.loads(record.payload) for record in records if record.type == "memory_context"]
    assert [(used["fact_id"], used["version"]) for used in context["facts"]] == [(fact.fact_id, 2)]
    [request] = [r for r in system.planner_model.requests if r.call_key.startswith(f"{run_id}/")]
    assert "green" in request.system and "blue" not in request.system
    answer = await system.answer(asking, run_id)
    assert "green" in answer and "blue" not in answer


# A conversation nobody tuned the summary on: facts (each with a word found nowhere else) every
# third turn, in English and Spanish, among questions, commands and markup.
FACTS = {
    1: ("My sister Lucia lives in Valparaiso.", "Valparaiso"),
    4: ("Our team deploys with Argo on Fridays.", "Argo"),
    7: ("Mi hermano trabaja en Zaragoza desde 2019.", "Zaragoza"),
    10: ("The budget for the trip is 2400 euros & no more.", "2400"),
    13: ("I switched from vim to Helix last year.", "Helix"),
    16: ("Mi perro se llama Trufa.", "Trufa"),
    19: ("The review with Hugo is on the 14th of March.", "Hugo"),
    22: ("Prefiero el café sin azúcar.", "azúcar"),
    25: ("Our staging cluster is called <kestrel>.", "<kestrel>"),
    28: ("I keep my notes in Obsidian.", "Obsidian"),
    31: ("My flight lands in Osaka at 07:40.", "Osaka"),
    34: ("La contraseña del wifi no te la voy a decir, pero la red se llama Pampa.", "Pampa"),
    37: ("My bike is a green Brompton.", "Brompton"),
    40: ("I'm reading Middlemarch.", "Middlemarch"),
}
OTHERS = [
    "What is 17 < 20 & why?",
    "calculate 6*7",
    "Can you format <b>this</b> for me?",
    "thanks!",
    "¿Qué tal el día?",
    "what time is it?",
    "Tell me something about R&D teams.",
]
TURNS = 40
WINDOW_TURNS = 6
ESCAPES = ("&lt;", "&gt;", "&amp;")


def user_said(number: int) -> str:
    return FACTS[number][0] if number in FACTS else OTHERS[number % len(OTHERS)]


@pytest.mark.timeout(int(scaled(900)))
async def test_a_forty_turn_conversation_keeps_the_substance_of_what_it_folds(system: System) -> None:
    session = await system.new_session()
    person = ""  # a session without a known person: its summary is what is checked, not facts
    offline = ScriptedModel()
    for number in range(1, TURNS + 1):
        said = user_said(number)
        asked = ModelRequest(system="", messages=[Message(role="user", parts=(TextPart(text=said),))])
        answered = "".join(p.text for p in offline.respond(asked).parts if isinstance(p, TextPart))
        finished = TurnCompleted(
            event_id=f"{session}-turn-{number}",
            session_id=session,
            run_id=f"{session}-run-{number}",
            agent_id="assistant",
            principal_id=person,
            user_text=said,
            assistant_text=answered,
        )
        topic = system.settings.topic_prefix + Topic.HISTORY_TURNS.value
        await system.publisher.send(topic, finished.model_dump_json().encode(), key=session.encode())

    folded_to = 2 * (TURNS - WINDOW_TURNS)
    cursor = 0

    async def moved() -> bool:
        summary = await system.memory.load_summary(session)
        return summary is not None and summary.cursor > cursor

    # A busy machine folds slowly, a stuck recorder not at all: wait while the cursor moves.
    while cursor < folded_to:
        await eventually(moved, within=60.0, what=f"the summary cursor moving past {cursor}")
        summary = await system.memory.load_summary(session)
        assert summary is not None
        cursor = summary.cursor
    summary = await system.memory.load_summary(session)
    assert summary is not None
    missing = [
        word
        for number, (_, word) in FACTS.items()
        if number <= TURNS - WINDOW_TURNS and word not in summary.text
    ]
    assert missing == []
    assert estimate_text_tokens(summary.text) <= TranscriptRecorderSettings().summary_max_tokens
    assert [escape for escape in ESCAPES if escape in summary.text] == []

    # The next turn is given the summary escaped exactly once, above the history.
    run_id = await system.turn(session, person, "Where does my sister live?")
    [request] = [r for r in system.planner_model.requests if r.call_key.startswith(f"{run_id}/")]
    block = request.system[request.system.index(SUMMARY_HEADER) :]
    assert neutralise(summary.text) in block
    assert "&amp;lt;" not in block and "&amp;amp;" not in block
