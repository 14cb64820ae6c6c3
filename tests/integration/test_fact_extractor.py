"""The fact extractor on the real embedded broker and database, with the real storage owner.

The owner (MongoDB memory store on SecantusDB) and the extractor run as in-process FastStream apps
on one topic prefix; the extractor's memory store is the Kafka client to that owner and its
model is the offline `ScriptedModel`, answering by call key. The test talks through the owner
only, as the transcript recorder would: it records turns, the owner publishes
`history.recorded`, the extractor proposes, validates and applies, and the owner publishes each
committed change on `memory.changes`.

"Every earlier message of a session was handled" is observed, not slept on: `history.recorded`
is keyed by session, so a sentinel turn recorded after them in the same session is handled after
them; once its fact is announced, everything before it is done.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import quipu
from quipu.assistant import assistant
from quipu.contracts.agents import AgentDefinition
from quipu.contracts.memory import FactChanged, HistoryRecorded, HistoryTurn, MemoryScope
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.agent_publisher import publish_agents
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.models.port import ModelRequest
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.fact_extractor.app import FactExtractorDeps
from quipu.services.fact_extractor.app import create_app as create_extractor
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from tests.owner_support import RawPublisher, TopicReader
from tests.support.deployment import deployed, unique_prefix
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow

DIARY = AgentDefinition(id="diary", instructions="A private diary.", memory_opt_out=True)


@dataclass
class System:
    """Owner and extractor on one prefix, a memory client, topic readers and a raw publisher."""

    settings: KafkaSettings
    memory: KafkaMemoryStore
    model: ScriptedModel
    changes: TopicReader
    recorded: TopicReader
    dead_letters: TopicReader
    publisher: RawPublisher
    agents: AgentRegistry
    answers: dict[str, Any] = field(default_factory=dict)

    def topic(self, name: Topic | str) -> str:
        return self.settings.topic_prefix + str(name)

    async def say(
        self, scope: MemoryScope, session_id: str, user_text: str, *operations: dict[str, Any]
    ) -> HistoryTurn:
        """Script the model's proposals for a new turn, then record the turn through the owner."""
        turn = HistoryTurn(
            session_id=session_id,
            turn_id="t-" + uuid.uuid4().hex[:12],
            scope=scope,
            user_text=user_text,
            assistant_text="Noted.",
            created_at=utc_now_ms(),
        )
        self.answers[f"facts/{turn.turn_id}"] = {"operations": list(operations)}
        await self.memory.append_history_turn(turn)
        return turn

    def announced(self, principal_id: str) -> list[FactChanged]:
        parsed = [FactChanged.model_validate_json(record.value or b"") for record in self.changes.records]
        return [change for change in parsed if change.scope.principal_id == principal_id]

    async def until_announced(self, principal_id: str, count: int, within: float = 30.0) -> list[FactChanged]:
        await self.changes.wait_for(lambda _: len(self.announced(principal_id)) >= count, within)
        return self.announced(principal_id)

    def recorded_event(self, turn_id: str) -> bytes | None:
        for record in self.recorded.records:
            if HistoryRecorded.model_validate_json(record.value or b"").turn_id == turn_id:
                return record.value or b""
        return None

    def model_calls(self, call_key: str) -> int:
        return sum(1 for request in self.model.requests if request.call_key == call_key)


@pytest.fixture(scope="module")
async def system(stack: EmbeddedStack) -> AsyncIterator[System]:
    settings = stack.kafka_settings(topic_prefix=unique_prefix("fx"))
    answers: dict[str, Any] = {}

    def answer(request: ModelRequest) -> Any:
        return answers.get(request.call_key)

    model = ScriptedModel(structured_output=answer)
    agents = AgentRegistry([assistant, DIARY])
    extractor = create_extractor(
        settings,
        FactExtractorSettings(profile_every_turns=2, store_reply_timeout_s=scaled(10.0)),
        FactExtractorDeps(model=model, agents=agents),
    )
    async with deployed(
        stack,
        settings,
        [extractor],
        memory=True,
        readers=[Topic.MEMORY_CHANGES.value, Topic.HISTORY_RECORDED.value, Topic.HISTORY_RECORDED.dlq],
        publisher=True,
    ) as up:
        changes, recorded, dead_letters = up.readers
        yield System(
            settings, up.memory, model, changes, recorded, dead_letters, up.publisher, agents, answers
        )


def scope(principal_id: str, agent_id: str = "assistant") -> MemoryScope:
    return MemoryScope(tenant_id="acme", principal_id=principal_id, agent_id=agent_id)


def new(text: str, source: str = "user_said") -> dict[str, Any]:
    return {"op": "new", "text": text, "source": source}


def update(fact_id: str, text: str) -> dict[str, Any]:
    return {"op": "update", "fact_id": fact_id, "text": text, "source": "user_said"}


async def test_a_recorded_turn_becomes_curated_facts_and_nothing_sensitive(system: System) -> None:
    alice = scope("alice-" + uuid.uuid4().hex[:6])
    turn = await system.say(
        alice,
        "s-" + uuid.uuid4().hex[:8],
        "I prefer answers in technical English. My password is hunter2. I was diagnosed with asthma.",
        new("Prefers answers in technical English"),
        new("Password is hunter2"),
        new("Was diagnosed with asthma"),
        new("Loves pirates", source="assistant_inferred"),
    )
    [change] = await system.until_announced(alice.principal_id, 1)
    assert (change.kind.value, change.text) == ("created", "Prefers answers in technical English")
    [fact] = await system.memory.list_facts(alice)
    assert fact.text == "Prefers answers in technical English"
    assert (fact.provenance.session_id, fact.provenance.turn_id, fact.provenance.message_seq) == (
        turn.session_id,
        turn.turn_id,
        1,
    )


async def test_two_principals_with_the_same_words_keep_separate_memories(system: System) -> None:
    alice, bob = scope("alice-" + uuid.uuid4().hex[:6]), scope("bob-" + uuid.uuid4().hex[:6])
    words = "We deploy everything on Kubernetes"
    await system.say(alice, "s-" + uuid.uuid4().hex[:8], words, new("Deploys everything on Kubernetes"))
    await system.say(bob, "s-" + uuid.uuid4().hex[:8], words, new("Deploys everything on Kubernetes"))
    [alice_change] = await system.until_announced(alice.principal_id, 1)
    [bob_change] = await system.until_announced(bob.principal_id, 1)
    assert alice_change.fact_id != bob_change.fact_id
    # Bob's next turn names Alice's fact: it is not in Bob's memory, so it is ignored.
    bob_session = "s-" + uuid.uuid4().hex[:8]
    await system.say(bob, bob_session, "we moved to Nomad", update(alice_change.fact_id, "Deploys on Nomad"))
    await system.say(bob, bob_session, "I also like jazz", new("Likes jazz"))  # the sentinel
    await system.until_announced(bob.principal_id, 2)
    [alice_fact] = await system.memory.list_facts(alice)
    assert (alice_fact.text, alice_fact.version) == ("Deploys everything on Kubernetes", 1)
    assert sorted(fact.text for fact in await system.memory.list_facts(bob)) == [
        "Deploys everything on Kubernetes",
        "Likes jazz",
    ]


async def test_a_redelivered_turn_changes_nothing(system: System) -> None:
    carol = scope("carol-" + uuid.uuid4().hex[:6])
    session = "s-" + uuid.uuid4().hex[:8]
    turn = await system.say(carol, session, "I live in Lisbon and I love jazz", new("Lives in Lisbon"))
    await system.until_announced(carol.principal_id, 1)
    before = await system.memory.list_facts(carol)
    await system.recorded.wait_for(lambda _: system.recorded_event(turn.turn_id) is not None)
    body = system.recorded_event(turn.turn_id)
    # The same answer again (folded into "unchanged" by code), then a different one (a real model
    # need not answer the same way twice): the owner holds the turn's operations under its id.
    await system.publisher.send(system.topic(Topic.HISTORY_RECORDED), body, key=session.encode())
    await system.say(carol, session, "I play the piano", new("Plays the piano"))  # a sentinel
    await system.until_announced(carol.principal_id, 2)
    system.answers[f"facts/{turn.turn_id}"] = {"operations": [new("Loves jazz")]}
    await system.publisher.send(system.topic(Topic.HISTORY_RECORDED), body, key=session.encode())
    await system.say(carol, session, "I read novels", new("Reads novels"))  # another sentinel
    await system.changes.wait_for(
        lambda _: "Reads novels" in {c.text for c in system.announced(carol.principal_id)}
    )
    assert system.model_calls(f"facts/{turn.turn_id}") == 3
    after = await system.memory.list_facts(carol)
    assert sorted(fact.text for fact in after) == ["Lives in Lisbon", "Plays the piano", "Reads novels"]
    assert [fact for fact in after if fact.text == "Lives in Lisbon"] == before
    distinct = {change.event_id: change.text for change in system.announced(carol.principal_id)}
    assert sorted(distinct.values()) == ["Lives in Lisbon", "Plays the piano", "Reads novels"]


async def test_an_opted_out_agent_feeds_no_memory(system: System) -> None:
    dave = scope("dave-" + uuid.uuid4().hex[:6])
    session = "s-" + uuid.uuid4().hex[:8]
    private = await system.say(
        scope(dave.principal_id, "diary"), session, "I live in Lisbon", new("Lives in Lisbon")
    )
    await system.say(dave, session, "I play the piano", new("Plays the piano"))  # the sentinel
    [change] = await system.until_announced(dave.principal_id, 1)
    assert change.text == "Plays the piano"
    assert system.model_calls(f"facts/{private.turn_id}") == 0


async def test_an_agent_registered_with_memory_opt_out_feeds_no_memory(system: System) -> None:
    """The opt-out of an agent published on agents.registry holds as a built-in one's does."""
    journal = quipu.Agent(id="journal", instructions="A private journal.", memory_opt_out=True)
    await publish_agents(system.settings, [journal])

    async def known() -> bool:
        return "journal" in system.agents.registered()

    await eventually(known, within=20.0, what="the extractor's view of agents.registry")
    erin = scope("erin-" + uuid.uuid4().hex[:6])
    session = "s-" + uuid.uuid4().hex[:8]
    private = await system.say(
        scope(erin.principal_id, "journal"), session, "I live in Porto", new("Lives in Porto")
    )
    await system.say(erin, session, "I play chess", new("Plays chess"))  # the sentinel
    [change] = await system.until_announced(erin.principal_id, 1)
    assert change.text == "Plays chess"
    assert system.model_calls(f"facts/{private.turn_id}") == 0


async def test_every_second_turn_rewrites_the_profile(system: System) -> None:
    erin = scope("erin-" + uuid.uuid4().hex[:6])
    session = "s-" + uuid.uuid4().hex[:8]
    await system.say(erin, session, "I work on the billing service", new("Works on the billing service"))
    second = await system.say(erin, session, "I prefer short answers", new("Prefers short answers"))
    system.answers[f"profile/{second.turn_id}"] = {
        "lines": ["Works on the billing service", "Prefers short answers", "PIN: 4821"]
    }
    await system.say(erin, session, "I live in Lisbon", new("Lives in Lisbon"))  # the sentinel
    await system.until_announced(erin.principal_id, 3)
    profile = await system.memory.load_profile(erin)
    assert profile is not None
    assert profile.text == "Works on the billing service\nPrefers short answers"
    assert profile.source_turns == 2


async def test_an_invalid_message_goes_to_the_dead_letter_topic(system: System) -> None:
    marker = uuid.uuid4().hex
    await system.publisher.send(
        system.topic(Topic.HISTORY_RECORDED), f'{{"nonsense": "{marker}"}}'.encode(), key=b"s-x"
    )
    await system.dead_letters.wait_for(
        lambda records: any(marker.encode() in (r.value or b"") for r in records)
    )
    [letter] = [record for record in system.dead_letters.records if marker.encode() in (record.value or b"")]
    headers = dict(letter.headers)
    assert headers["x-dlq-reason"] == b"invalid_payload"
