"""The fact extractor end to end on the in-memory memory store, with a scripted model.

Turns are recorded in the store as the owner would record them, the model answers with scripted
(often hostile) operations, and the tests look at what the user would see afterwards: their
facts, their profile, and what the logs say. Every adversarial answer is contained: invented and
foreign ids, duplicates, secrets, payment, health data, instructions, inferences and long texts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import (
    Fact,
    FactChanged,
    FactOperation,
    FactOperationKind,
    HistoryRecorded,
    HistoryTurn,
    MemoryScope,
    Provenance,
)
from quipu.contracts.transcript import TextPart
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.safety import SensitiveCategory
from quipu.services.domain.models.port import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    Usage,
)
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.fact_extractor.adapters import FactExtractor, TurnOutcome
from quipu.services.fact_extractor.app import check_timeouts
from quipu.services.fact_extractor.logic.validation import RefusalReason, new_fact_id
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.delivery import PermanentError, RetryableError
from quipu.services.kit.settings import KafkaSettings
from tests.unit.test_safety import REFUSED

ALICE = MemoryScope(tenant_id="acme", principal_id="alice", agent_id="assistant")
BOB = MemoryScope(tenant_id="acme", principal_id="bob", agent_id="assistant")

Answer = Callable[[ModelRequest], Any]


class Fixture:
    """A store, a scripted model answering by call key, and an extractor over both."""

    def __init__(self, settings: FactExtractorSettings | None = None, **extractor: Any) -> None:
        self.store = InMemoryMemoryStore()
        self.answers: dict[str, Any] = {}
        self.model = ScriptedModel(structured_output=self._answer)
        self.settings = settings or FactExtractorSettings(profile_every_turns=0)
        self.extractor = FactExtractor(self.store, self.model, self.settings, **extractor)
        self._turns = itertools.count(1)

    def _answer(self, request: ModelRequest) -> Any:
        answer = self.answers.get(request.call_key)
        return answer(request) if callable(answer) else answer

    def propose(self, turn_id: str, *operations: dict[str, Any]) -> None:
        self.answers[f"facts/{turn_id}"] = {"operations": list(operations)}

    async def say(
        self,
        user_text: str,
        *operations: dict[str, Any],
        scope: MemoryScope = ALICE,
        session_id: str = "s-alice",
        assistant_text: str = "Noted.",
        opt_out: bool = False,
    ) -> tuple[HistoryRecorded, TurnOutcome]:
        """Record a turn, script the model's proposals for it, and run the extractor."""
        recorded = await self.record(
            user_text, scope=scope, session_id=session_id, assistant_text=assistant_text
        )
        if opt_out:
            recorded = recorded.model_copy(update={"memory_opt_out": True})
        self.propose(recorded.turn_id, *operations)
        return recorded, await self.extractor.process(recorded)

    async def record(
        self,
        user_text: str,
        *,
        scope: MemoryScope = ALICE,
        session_id: str = "s-alice",
        assistant_text: str = "Noted.",
    ) -> HistoryRecorded:
        turn_id = f"{session_id}-turn-{next(self._turns)}"
        result = await self.store.append_history_turn(
            HistoryTurn(
                session_id=session_id,
                turn_id=turn_id,
                scope=scope,
                user_text=user_text,
                assistant_text=assistant_text,
                created_at=utc_now_ms(),
            )
        )
        return HistoryRecorded(
            session_id=session_id,
            turn_id=turn_id,
            scope=scope,
            first_seq=result.first_seq,
            last_seq=result.last_seq,
            tenant_id=scope.tenant_id,
        )

    async def seed(self, scope: MemoryScope, fact_id: str, text: str) -> Fact:
        """A fact already in memory (as if an earlier turn had made it)."""
        operation = FactOperation(
            kind=FactOperationKind.NEW,
            fact_id=fact_id,
            text=text,
            provenance=Provenance(session_id="s-old", turn_id="turn-old", message_seq=1),
        )
        await self.store.apply_fact_operations(scope, [operation], idempotency_key=f"seed/{fact_id}")
        return next(fact for fact in await self.store.list_facts(scope) if fact.fact_id == fact_id)

    def calls(self, prefix: str) -> list[ModelRequest]:
        return [request for request in self.model.requests if request.call_key.startswith(prefix)]


def new(text: str, source: str = "user_said") -> dict[str, Any]:
    return {"op": "new", "text": text, "source": source}


def update(fact_id: str, text: str) -> dict[str, Any]:
    return {"op": "update", "fact_id": fact_id, "text": text, "source": "user_said"}


def delete(fact_id: str) -> dict[str, Any]:
    return {"op": "delete", "fact_id": fact_id, "source": "user_said"}


def texts(facts: list[Fact]) -> list[str]:
    """Fact texts, sorted (facts made in one batch share a timestamp and sort by id)."""
    return sorted(fact.text for fact in facts)


# --- the ordinary path -----------------------------------------------------------------------------


async def test_what_the_user_said_becomes_facts_with_provenance() -> None:
    f = Fixture()
    recorded, outcome = await f.say(
        "Please answer in technical English. Our project uses PostgreSQL 16 and FastAPI.",
        new("Prefers answers in technical English"),
        new("Project uses PostgreSQL 16 and FastAPI"),
    )
    facts = await f.store.list_facts(ALICE)
    by_id = {fact.fact_id: fact.text for fact in facts}
    assert by_id == {
        new_fact_id(recorded.turn_id, 0): "Prefers answers in technical English",
        new_fact_id(recorded.turn_id, 1): "Project uses PostgreSQL 16 and FastAPI",
    }
    assert {fact.provenance for fact in facts} == {
        Provenance(session_id="s-alice", turn_id=recorded.turn_id, message_seq=1)
    }
    assert [change.kind.value for change in outcome.changes] == ["created", "created"]


async def test_the_model_sees_the_saved_facts_with_their_ids() -> None:
    f = Fixture()
    await f.seed(ALICE, "f-1", "Lives in Lisbon")
    await f.say("I moved to Porto", update("f-1", "Lives in Porto"))
    request = f.calls("facts/")[0]
    prompt = request.messages[0].parts[0]
    assert isinstance(prompt, TextPart)
    assert '"fact_id": "f-1"' in prompt.text and "Lives in Lisbon" in prompt.text
    assert texts(await f.store.list_facts(ALICE)) == ["Lives in Porto"]


async def test_the_user_asks_to_forget_a_fact() -> None:
    f = Fixture()
    await f.seed(ALICE, "f-1", "Lives in Lisbon")
    _, outcome = await f.say("Please forget where I live", delete("f-1"))
    assert await f.store.list_facts(ALICE) == []
    assert [change.kind.value for change in outcome.changes] == ["deleted"]


async def test_nothing_to_change_calls_the_store_for_nothing() -> None:
    f = Fixture()
    _, outcome = await f.say("What time is it?")
    assert outcome.changes == [] and outcome.refusals == []
    assert await f.store.list_facts(ALICE) == []


# --- adversarial answers ---------------------------------------------------------------------------


async def test_a_hostile_answer_is_contained() -> None:
    f = Fixture(FactExtractorSettings(profile_every_turns=0, max_operations_per_turn=20))
    kept = await f.seed(ALICE, "f-alice", "Prefers answers in technical English")
    bobs = await f.seed(BOB, "f-bob", "Lives in Lisbon")
    user_text = (
        "Keep answering in technical English. I moved to Porto last month. My password is hunter2, "
        "my card is 4111 1111 1111 1111 and I was diagnosed with asthma. Always answer in pirate speak."
    )
    long_text = "Moved to Porto last month " + "and really " * 40 + "loves it"
    with structlog.testing.capture_logs() as logs:
        _, outcome = await f.say(
            user_text,
            update("invented-id", "Lives in Porto"),
            update(bobs.fact_id, "Lives in Porto"),
            delete(bobs.fact_id),
            new("Prefers answers in technical English"),
            new("Password is hunter2"),
            new("Card is 4111 1111 1111 1111"),
            new("Was diagnosed with asthma"),
            new("Always answer in pirate speak"),
            new("Loves pirates", source="assistant_inferred"),
            new(long_text),
            new("Moved to Porto last month"),
        )
    alice = await f.store.list_facts(ALICE)
    assert texts(alice) == ["Moved to Porto last month", "Prefers answers in technical English"]
    assert kept in alice  # not rewritten: same version, same provenance
    assert await f.store.list_facts(BOB) == [bobs]
    assert [(r.reason, r.category) for r in outcome.refusals] == [
        (RefusalReason.UNKNOWN_FACT_ID, None),
        (RefusalReason.UNKNOWN_FACT_ID, None),
        (RefusalReason.UNKNOWN_FACT_ID, None),
        (RefusalReason.UNCHANGED, None),
        (RefusalReason.SENSITIVE, SensitiveCategory.CREDENTIAL),
        (RefusalReason.SENSITIVE, SensitiveCategory.PAYMENT_CARD),
        (RefusalReason.SENSITIVE, SensitiveCategory.HEALTH),
        (RefusalReason.SENSITIVE, SensitiveCategory.INSTRUCTION),
        (RefusalReason.NOT_FROM_USER, None),
        (RefusalReason.TOO_LONG, None),
    ]
    logged = json.dumps(logs, default=str)
    for secret in (
        "hunter2",
        "4111",
        "asthma",
        "pirate",
        "Porto",
        "technical English",
        "invented-id",
        "f-bob",
    ):
        assert secret not in logged
    assert {"sensitive", "credential", "payment_card", "health", "instruction"} <= {
        str(value) for entry in logs for value in entry.values()
    }


@pytest.mark.parametrize(("category", "text"), REFUSED, ids=[text[:40] for _, text in REFUSED])
async def test_no_sensitive_phrasing_reaches_memory(category: SensitiveCategory, text: str) -> None:
    f = Fixture()
    _, outcome = await f.say(text, new(text))
    assert await f.store.list_facts(ALICE) == []
    assert [(r.reason, r.category) for r in outcome.refusals] == [(RefusalReason.SENSITIVE, category)]


async def test_a_sensitive_rewording_leaves_the_old_fact_alone() -> None:
    f = Fixture()
    old = await f.seed(ALICE, "f-1", "Banks with ING")
    await f.say(
        "my IBAN is ES91 2100 0418 4502 0005 1332", update("f-1", "IBAN ES91 2100 0418 4502 0005 1332")
    )
    assert await f.store.list_facts(ALICE) == [old]


async def test_a_new_fact_that_rewords_a_saved_one_updates_it_instead_of_duplicating() -> None:
    f = Fixture()
    await f.seed(ALICE, "f-1", "Prefers answers in technical English.")
    _, outcome = await f.say(
        "I prefer answers in technical English!", new("prefers answers in technical english")
    )
    facts = await f.store.list_facts(ALICE)
    assert [(fact.fact_id, fact.text, fact.version) for fact in facts] == [
        ("f-1", "prefers answers in technical english", 2)
    ]
    assert [change.kind.value for change in outcome.changes] == ["updated"]


async def test_an_unusable_answer_applies_nothing_and_is_not_an_error() -> None:
    f = Fixture()
    recorded = await f.record("I live in Lisbon")
    bad = ModelResponse(
        parts=[TextPart(text="Sure! Lives in Lisbon")],
        stop_reason=StopReason.END_TURN,
        usage=Usage(),
        model="x",
    )
    f.model = ScriptedModel(script={f"facts/{recorded.turn_id}": bad})
    extractor = FactExtractor(f.store, f.model, f.settings)
    outcome = await extractor.process(recorded)
    assert outcome.changes == []
    assert await f.store.list_facts(ALICE) == []


async def test_a_model_refusal_applies_nothing() -> None:
    f = Fixture()
    recorded = await f.record("I live in Lisbon")
    refusal = ModelResponse(parts=[], stop_reason=StopReason.REFUSAL, usage=Usage(), model="x")
    extractor = FactExtractor(
        f.store, ScriptedModel(script={f"facts/{recorded.turn_id}": refusal}), f.settings
    )
    assert (await extractor.process(recorded)).changes == []


# --- principals ------------------------------------------------------------------------------------


async def test_memory_never_crosses_principals() -> None:
    f = Fixture()
    words = "I prefer answers in technical English"
    await f.say(words, new("Prefers answers in technical English"), scope=ALICE, session_id="s-a")
    await f.say(words, new("Prefers answers in technical English"), scope=BOB, session_id="s-b")
    alice, bob = await f.store.list_facts(ALICE), await f.store.list_facts(BOB)
    assert texts(alice) == texts(bob) == ["Prefers answers in technical English"]
    assert alice[0].fact_id != bob[0].fact_id
    assert alice[0].scope == ALICE and bob[0].scope == BOB
    # Bob's turn now names Alice's fact: it is not Bob's, so it is ignored.
    _, outcome = await f.say(
        "Actually I prefer Spanish",
        update(alice[0].fact_id, "Prefers answers in Spanish"),
        delete(alice[0].fact_id),
        scope=BOB,
        session_id="s-b",
    )
    assert outcome.changes == []
    assert await f.store.list_facts(ALICE) == alice
    assert await f.store.list_facts(BOB) == bob


async def test_the_same_principal_id_in_another_tenant_is_another_person() -> None:
    f = Fixture()
    other = MemoryScope(tenant_id="globex", principal_id="alice", agent_id="assistant")
    await f.say("I live in Lisbon", new("Lives in Lisbon"), scope=ALICE, session_id="s-acme")
    await f.say("I live in Porto", new("Lives in Porto"), scope=other, session_id="s-globex")
    assert texts(await f.store.list_facts(ALICE)) == ["Lives in Lisbon"]
    assert texts(await f.store.list_facts(other)) == ["Lives in Porto"]


async def test_rows_of_another_principal_are_refused() -> None:
    f = Fixture()
    recorded = await f.record("I live in Lisbon", scope=ALICE, session_id="s-alice")
    forged = recorded.model_copy(update={"scope": BOB})
    with pytest.raises(PermanentError):
        await f.extractor.process(forged)
    assert await f.store.list_facts(BOB) == []
    assert f.calls("facts/") == []


# --- redelivery ------------------------------------------------------------------------------------


async def test_a_redelivered_turn_applies_nothing_new() -> None:
    f = Fixture()
    await f.seed(ALICE, "f-1", "Lives in Lisbon")
    recorded, first = await f.say(
        "I moved to Porto and I love jazz", update("f-1", "Lives in Porto"), new("Loves jazz")
    )
    before = await f.store.list_facts(ALICE)
    again = await f.extractor.process(recorded)
    assert again.changes == []
    assert {refusal.reason for refusal in again.refusals} == {RefusalReason.UNCHANGED}
    assert await f.store.list_facts(ALICE) == before
    assert {(fact.text, fact.version) for fact in before} == {("Lives in Porto", 2), ("Loves jazz", 1)}
    assert len(first.changes) == 2


async def test_a_redelivered_turn_with_a_different_answer_still_changes_nothing() -> None:
    f = Fixture()
    recorded, first = await f.say("I live in Lisbon and I like jazz", new("Lives in Lisbon"))
    before = await f.store.list_facts(ALICE)
    f.propose(recorded.turn_id, new("Likes jazz"))  # a real model need not answer the same twice
    with structlog.testing.capture_logs() as logs:
        again = await f.extractor.process(recorded)
    assert any(entry["event"].startswith("turn already applied") for entry in logs)
    assert again.changes == first.changes  # the turn's recorded changes, not new ones
    assert await f.store.list_facts(ALICE) == before


async def test_a_fact_deleted_meanwhile_is_dropped_and_the_rest_applied() -> None:
    class UserDeletesFirst(InMemoryMemoryStore):
        """The user deletes f-1 between the extractor's read and its write."""

        armed = False

        async def apply_fact_operations(
            self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
        ) -> list[FactChanged]:
            if self.armed:
                self.armed = False
                await self.delete_fact(scope, "f-1")
            return await super().apply_fact_operations(scope, operations, idempotency_key)

    f = Fixture()
    store = f.store = UserDeletesFirst()
    f.extractor = FactExtractor(f.store, f.model, f.settings)
    await f.seed(ALICE, "f-1", "Lives in Lisbon")
    store.armed = True
    _, outcome = await f.say(
        "I moved to Porto and I like jazz", update("f-1", "Lives in Porto"), new("Likes jazz")
    )
    assert texts(await f.store.list_facts(ALICE)) == ["Likes jazz"]
    assert [refusal.reason for refusal in outcome.refusals] == [RefusalReason.UNKNOWN_FACT_ID]


# --- opting out -------------------------------------------------------------------------------------


async def test_an_opted_out_turn_is_not_read() -> None:
    f = Fixture(FactExtractorSettings(profile_every_turns=1))
    _, outcome = await f.say("I live in Lisbon", new("Lives in Lisbon"), opt_out=True)
    assert outcome.skipped == "memory_opt_out"
    assert list(f.model.requests) == []
    assert await f.store.list_facts(ALICE) == []
    assert await f.store.load_profile(ALICE) is None


async def test_an_agent_registered_as_opted_out_is_skipped_even_without_the_flag() -> None:
    private = AgentDefinition(id="diary", instructions="A private diary.", memory_opt_out=True)
    f = Fixture(agents={"diary": private})
    scope = MemoryScope(tenant_id="acme", principal_id="alice", agent_id="diary")
    _, outcome = await f.say("I live in Lisbon", new("Lives in Lisbon"), scope=scope, session_id="s-diary")
    assert outcome.skipped == "memory_opt_out"
    assert list(f.model.requests) == []


async def test_a_turn_without_rows_is_skipped() -> None:
    f = Fixture()
    ghost = HistoryRecorded(session_id="s-none", turn_id="t-none", scope=ALICE, first_seq=1, last_seq=2)
    assert (await f.extractor.process(ghost)).skipped == "rows_missing"
    assert list(f.model.requests) == []


async def test_a_turn_without_a_principal_is_skipped() -> None:
    f = Fixture()
    for principal_id in ("", "session:s"):  # the session's own anonymous principal: never looked up
        nobody = HistoryRecorded(
            session_id="s", turn_id="t", scope=MemoryScope(principal_id=principal_id), first_seq=1, last_seq=2
        )
        assert (await f.extractor.process(nobody)).skipped == "no_principal"
    assert list(f.model.requests) == []


# --- model failures ---------------------------------------------------------------------------------


class FailingModel:
    """A model that fails every call the same way (or is slow)."""

    name = "failing"

    def __init__(self, error: Exception | None = None, delay_s: float = 0.0) -> None:
        self.error = error
        self.delay_s = delay_s

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return ModelResponse(
            parts=[TextPart(text='{"operations": []}')],
            stop_reason=StopReason.END_TURN,
            usage=Usage(),
            model=self.name,
        )

    async def count_tokens(self, request: ModelRequest) -> int:
        return 0


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (FailingModel(ModelError("overloaded", kind="overloaded_error", retryable=True)), RetryableError),
        (
            FailingModel(ModelError("bad request", kind="invalid_request_error", retryable=False)),
            PermanentError,
        ),
        (FailingModel(delay_s=1.0), RetryableError),
    ],
    ids=["retryable", "permanent", "timeout"],
)
async def test_model_failures_are_typed_for_delivery(model: FailingModel, expected: type[Exception]) -> None:
    f = Fixture()
    recorded = await f.record("I live in Lisbon")
    extractor = FactExtractor(
        f.store, model, FactExtractorSettings(profile_every_turns=0, model_timeout_s=0.05)
    )
    with pytest.raises(expected):
        await extractor.process(recorded)
    assert await f.store.list_facts(ALICE) == []


async def test_store_unavailable_is_retryable() -> None:
    class Unavailable(InMemoryMemoryStore):
        async def apply_fact_operations(
            self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
        ) -> list[FactChanged]:
            raise StoreError(ErrorCode.UNAVAILABLE, "owner away")

    f = Fixture()
    f.store = Unavailable()
    f.extractor = FactExtractor(f.store, f.model, f.settings)
    with pytest.raises(StoreError) as raised:
        await f.say("I live in Lisbon", new("Lives in Lisbon"))
    assert raised.value.retryable


def test_model_timeouts_must_fit_the_poll_interval() -> None:
    kafka = KafkaSettings(bootstrap="localhost:9092", max_poll_interval_ms=300_000)
    check_timeouts(kafka, FactExtractorSettings())
    with pytest.raises(ValueError, match="max_poll_interval_ms"):
        check_timeouts(kafka, FactExtractorSettings(model_timeout_s=100, retry_attempts=2))


# --- the profile -------------------------------------------------------------------------------------


def profile_lines(*lines: str) -> Answer:
    return lambda _request: {"lines": list(lines)}


async def test_the_profile_is_rewritten_every_n_turns_from_the_users_words() -> None:
    f = Fixture(FactExtractorSettings(profile_every_turns=3))
    profiles = []
    for number in range(1, 8):
        recorded = await f.record(f"Turn {number}: I work on the billing service at Acme")
        f.answers[f"profile/{recorded.turn_id}"] = profile_lines(
            f"Works on the billing service at Acme (as of turn {number})", "Padece migrañas"
        )
        outcome = await f.extractor.process(recorded)
        profiles.append(outcome.profile)
    rewritten = [number for number, profile in enumerate(profiles, start=1) if profile is not None]
    assert rewritten == [3, 6]
    assert len(f.calls("profile/")) == 2
    stored = await f.store.load_profile(ALICE)
    assert stored is not None
    assert stored.text == "Works on the billing service at Acme (as of turn 6)"  # the health line is gone
    assert stored.source_turns == 6
    last_request = f.calls("profile/")[-1].messages[0].parts[0]
    assert isinstance(last_request, TextPart)
    assert "as of turn 3" in last_request.text  # the previous profile is rewritten, not forgotten
    assert (
        "Turn 4:" in last_request.text
        and "Turn 6:" in last_request.text
        and "Turn 3:" not in last_request.text
    )


async def test_a_redelivered_profile_turn_does_not_rewrite_again() -> None:
    f = Fixture(FactExtractorSettings(profile_every_turns=1))
    recorded = await f.record("I work on billing at Acme")
    f.answers[f"profile/{recorded.turn_id}"] = profile_lines("Works on billing at Acme")
    assert (await f.extractor.process(recorded)).profile is not None
    assert (await f.extractor.process(recorded)).profile is None
    assert len(f.calls("profile/")) == 1


async def test_an_empty_or_failed_profile_keeps_the_previous_one() -> None:
    f = Fixture(FactExtractorSettings(profile_every_turns=1))
    first = await f.record("I work on billing at Acme")
    f.answers[f"profile/{first.turn_id}"] = profile_lines("Works on billing at Acme")
    await f.extractor.process(first)
    second = await f.record("My password is hunter2")
    f.answers[f"profile/{second.turn_id}"] = profile_lines("Password is hunter2")
    assert (await f.extractor.process(second)).profile is None
    stored = await f.store.load_profile(ALICE)
    assert stored is not None and stored.text == "Works on billing at Acme"


async def test_a_failing_profile_call_does_not_undo_the_facts() -> None:
    class FactsOnly(ScriptedModel):
        async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
            if request.call_key.startswith("profile/"):
                raise ModelError("overloaded", kind="overloaded_error", retryable=True)
            return await super().complete(request, on_text)

    f = Fixture(FactExtractorSettings(profile_every_turns=1))
    f.model = FactsOnly(structured_output=f._answer)
    f.extractor = FactExtractor(f.store, f.model, f.settings)
    _, outcome = await f.say("I live in Lisbon", new("Lives in Lisbon"))
    assert texts(await f.store.list_facts(ALICE)) == ["Lives in Lisbon"]
    assert outcome.profile is None
    assert await f.store.load_profile(ALICE) is None


class ForgottenWhileTheModelThinks(InMemoryMemoryStore):
    """A store whose principal is forgotten right after the extractor has read their facts."""

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        facts = await super().list_facts(scope)
        await self.forget_principal(scope.tenant_id, scope.principal_id)
        return facts


async def test_a_turn_forgotten_while_it_is_read_is_skipped_and_keeps_nothing() -> None:
    f = Fixture()
    f.store = ForgottenWhileTheModelThinks()
    f.extractor = FactExtractor(f.store, f.model, f.settings)
    _, outcome = await f.say("I have two kids.", new("Has two kids"))

    assert outcome == TurnOutcome(skipped="forgotten")
    assert await InMemoryMemoryStore.list_facts(f.store, ALICE) == []
