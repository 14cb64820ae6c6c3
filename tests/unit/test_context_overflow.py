"""The planner with conversation memory: the `memory_context` record, and one turn over its budget.

A request over `request_budget_tokens` drops the oldest history first, whole turns, and compacts
them (with the session's summary) into the request's summary block through the model port; the
run records `history_compacted` and streams it. A turn that cannot fit even with no history
fails with `context_overflow` before any model call. Everything runs on the in-memory stores
with a model whose token counter is the local estimate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import StreamEventType
from quipu.contracts.lifecycle import decode_run_completed
from quipu.contracts.memory import (
    FactOperation,
    FactOperationKind,
    HistoryTurn,
    MemoryScope,
    Provenance,
    SessionSummary,
)
from quipu.contracts.runs import RunRequested, TurnCompleted
from quipu.contracts.store import RunStatus
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.transcript import Message, TextPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import MemoryContextSource
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.ranking import build_index_entry
from quipu.services.domain.memory.summary import SUMMARY_HEADER, read_summarizer_request, summary_of_block
from quipu.services.domain.models.estimate import estimate_request_tokens, estimate_text_tokens
from quipu.services.domain.models.port import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    Usage,
)
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.kit.delivery import RetryableError
from quipu.services.planner.adapters import PublishedTurns, load_records
from quipu.services.planner.orchestrator import Planner, ReadyDeps
from quipu.services.planner.settings import PlannerSettings
from tests.support.announced import announced
from tests.support.planner_bus import Bus

AT = datetime(2026, 2, 1, tzinfo=UTC)
AGENTS = AgentRegistry(
    [
        AgentDefinition(id="assistant", instructions="Be brief.", tools=["calculator"]),
        AgentDefinition(id="private", instructions="Be brief.", memory_opt_out=True),
    ]
)
_TURN = re.compile(r"old question (\d+)")


class Model:
    """Answers planner calls with text (or a calculator call first); summarises by listing turns."""

    name = "test-model"

    def __init__(self, *, use_calculator: bool = False) -> None:
        self.use_calculator = use_calculator
        self.planner_requests: list[ModelRequest] = []
        self.summary_requests: list[ModelRequest] = []
        self.counted = 0
        self.fail_next: list[ModelError] = []

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        fold = read_summarizer_request(request)
        if fold is not None:
            self.summary_requests.append(request)
            if self.fail_next:
                raise self.fail_next.pop(0)
            turns = ", ".join(number for said in fold.new for number in _TURN.findall(said.text))
            summary = f"{fold.existing} Compacted old turns {turns}.".strip()
            return self._say(json.dumps({"summary": summary}), request)
        self.planner_requests.append(request)
        if self.fail_next:
            raise self.fail_next.pop(0)
        last = request.messages[-1]
        if self.use_calculator and not any(p.kind == "tool_result" for p in last.parts):
            use = ToolUsePart(
                id=f"tu-{len(self.planner_requests)}", name="calculator", input={"expression": "1+1"}
            )
            return ModelResponse([use], StopReason.TOOL_USE, Usage(1, 1), self.name)
        return self._say("Done.", request)

    def _say(self, text: str, request: ModelRequest) -> ModelResponse:
        return ModelResponse([TextPart(text=text)], StopReason.END_TURN, Usage(1, 1), self.name)

    async def count_tokens(self, request: ModelRequest) -> int:
        self.counted += 1
        return estimate_request_tokens(request)


@dataclass
class Harness:
    store: InMemoryStore
    memory: InMemoryMemoryStore
    model: Model
    bus: Bus
    planner: Planner
    session_id: str = "s-overflow"

    async def turn(self, text: str, run_id: str = "run-now", agent_id: str = "assistant") -> RunRequested:
        request = RunRequested(
            run_id=run_id,
            session_id=self.session_id,
            agent_id=agent_id,
            principal_id="ana",
            text=text,
            occurred_at=AT,
        )
        await self.planner.on_run_requested(request)
        return request

    async def keys(self, run_id: str = "run-now") -> list[str]:
        return [record.event_key for record in await load_records(self.store, run_id)]

    async def record(self, key: str, run_id: str = "run-now") -> Any:
        [found] = [r for r in await load_records(self.store, run_id) if r.event_key == key]
        return json.loads(found.payload)

    async def terminal(self, run_id: str = "run-now") -> Any:
        [found] = [r for r in await load_records(self.store, run_id) if r.type == "run_completed"]
        return decode_run_completed(found.payload)


async def harness(
    budget: int = 150_000, *, turns: int = 6, words: int = 80, language: Any = None, **model: Any
) -> Harness:
    """A planner over in-memory stores and `language` (default: `Model(**model)`), with `turns`
    old turns of `words` words on each side already recorded."""
    store, memory, bus = InMemoryStore(), InMemoryMemoryStore(), Bus()
    language = language if language is not None else Model(**model)
    published = PublishedTurns(bus)
    context = MemoryContextSource(memory, recent_turns=published)
    settings = PlannerSettings(request_budget_tokens=budget, compaction_summary_tokens=100)
    planner = Planner(ReadyDeps(store, language, announced(), AGENTS, context), published, settings)
    h = Harness(store, memory, language, bus, planner)
    await store.create_session(h.session_id, utc_now_ms())
    for number in range(1, turns + 1):
        await memory.append_history_turn(
            HistoryTurn(
                session_id=h.session_id,
                turn_id=f"run-{number}",
                scope=MemoryScope(principal_id="ana", agent_id="assistant"),
                user_text=f"old question {number}: " + "tell me more " * words,
                assistant_text=f"old answer {number}: " + "here is more " * words,
                created_at=AT,
            )
        )
    return h


def texts(request: ModelRequest) -> list[str]:
    return ["".join(p.text for p in m.parts if isinstance(p, TextPart)) for m in request.messages]


def summary_in(request: ModelRequest) -> str | None:
    start = request.system.find(SUMMARY_HEADER)
    return summary_of_block(request.system[start:]) if start >= 0 else None


# --- the memory context record ------------------------------------------------------------------


async def remember_that_ana_prefers_green_tea(h: Harness) -> None:
    """Ana's fact `f-tea`, learnt in an earlier session."""
    await h.memory.apply_fact_operations(
        MemoryScope(principal_id="ana"),
        [
            FactOperation(
                kind=FactOperationKind.NEW,
                fact_id="f-tea",
                text="Ana prefers green tea.",
                provenance=Provenance(session_id="old", turn_id="old"),
            )
        ],
        "k1",
    )


async def test_a_turn_records_which_memory_its_context_used() -> None:
    h = await harness(turns=8, words=2)
    await h.memory.save_summary(
        SessionSummary(
            session_id=h.session_id, text="Early talk.", cursor=4, version=1, model="m", updated_at=AT
        )
    )
    await remember_that_ana_prefers_green_tea(h)
    [fact] = await h.memory.list_facts(MemoryScope(principal_id="ana"))
    await h.memory.upsert_index_entry(build_index_entry(fact, AT))

    await h.turn("Which tea do I like?")

    keys = await h.keys()
    assert keys.index("memory-context") < keys.index("seed") < keys.index("input")
    recorded = await h.record("memory-context")
    assert recorded["facts"] == [{"fact_id": "f-tea", "version": 1, "source": "index"}]
    assert recorded["summary"] == {"version": 1, "cursor": 4}
    assert recorded["window"] == {"first_seq": 5, "last_seq": 16}
    [request] = h.model.planner_requests
    assert request.system.index("Ana prefers green tea.") < request.system.index(SUMMARY_HEADER)
    assert texts(request)[-1] == "Which tea do I like?"
    assert h.bus.events(StreamEventType.HISTORY_COMPACTED) == []


async def test_an_opt_out_agent_is_given_no_facts_and_its_turn_is_still_published() -> None:
    h = await harness(turns=1, words=2)
    await remember_that_ana_prefers_green_tea(h)
    await h.turn("Which tea do I like?", agent_id="private")
    assert (await h.record("memory-context"))["facts"] == []
    assert "green tea" not in h.model.planner_requests[0].system
    assert [m.run_id for m in h.bus.messages if isinstance(m, TurnCompleted)] == ["run-now"]


# --- one turn over its budget -------------------------------------------------------------------


async def test_the_oldest_turns_are_compacted_into_the_summary_block_to_fit_the_budget() -> None:
    h = await harness(budget=900)

    await h.turn("What was the first thing I asked?")

    assert (await h.terminal()).run_status is RunStatus.COMPLETED
    [compaction] = [await h.record("step/1/compacted")]
    dropped = compaction["dropped_turns"]
    assert 1 <= dropped < 6
    assert compaction["tokens_before"] > 900 >= compaction["tokens_after"]
    [request] = h.model.planner_requests
    assert estimate_request_tokens(request) == compaction["tokens_after"]
    # The oldest turns left the request whole; the newest stayed word for word.
    shown = texts(request)
    assert shown[0].startswith(f"old question {dropped + 1}:")
    assert shown[-2].startswith("old answer 6:")
    assert [m.role for m in request.messages] == ["user", "assistant"] * (6 - dropped) + ["user"]
    # ... and what they said is in the request's summary block, not lost.
    summary = summary_in(request)
    assert summary == compaction["summary"]
    assert summary is not None
    assert f"Compacted old turns {', '.join(str(n) for n in range(1, dropped + 1))}." in summary
    assert f"the {dropped} oldest turns of the history, compacted to fit this request" in request.system
    [event] = h.bus.events(StreamEventType.HISTORY_COMPACTED)
    assert event.event_key == "step/1/compacted"
    assert event.payload == {
        "step": 1,
        "dropped_turns": dropped,
        "tokens_before": compaction["tokens_before"],
        "tokens_after": compaction["tokens_after"],
    }
    assert len(h.model.summary_requests) == 1
    assert h.model.counted >= 2  # the provider's counter, not only the estimate


async def test_the_session_summary_is_compacted_together_with_the_dropped_turns() -> None:
    h = await harness(budget=900)
    await h.memory.save_summary(
        SessionSummary(
            session_id=h.session_id,
            text="Ana introduced herself.",
            cursor=2,
            version=1,
            model="m",
            updated_at=AT,
        )
    )

    await h.turn("Go on.")

    summary = summary_in(h.model.planner_requests[0])
    assert summary is not None
    assert summary.startswith("Ana introduced herself. Compacted old turns 1")
    assert h.model.planner_requests[0].system.count(SUMMARY_HEADER) == 1


async def test_the_offline_model_compacts_the_dropped_turns_into_what_they_said() -> None:
    h = await harness(budget=900, turns=0, language=ScriptedModel())
    for number in range(1, 7):
        await h.memory.append_history_turn(
            HistoryTurn(
                session_id=h.session_id,
                turn_id=f"run-{number}",
                scope=MemoryScope(principal_id="ana", agent_id="assistant"),
                user_text=f"My locker {number} is in hall H{number}0. " + "tell me more " * 80,
                assistant_text=f"Locker {number} noted. " + "here is more " * 80,
                created_at=AT,
            )
        )

    await h.turn("Where is my locker 1?")

    compaction = await h.record("step/1/compacted")
    assert compaction["dropped_turns"] >= 1
    assert compaction["tokens_after"] <= 900
    lost = [
        n for n in range(1, compaction["dropped_turns"] + 1) if f"hall H{n}0" not in compaction["summary"]
    ]
    assert lost == []
    assert estimate_text_tokens(compaction["summary"]) <= 100


async def test_a_redelivered_turn_reuses_the_compaction_and_the_stream_hears_it_again() -> None:
    h = await harness(budget=900)
    h.model.fail_next = []
    await h.turn("Go on.")
    compaction = await h.record("step/1/compacted")
    first = h.model.planner_requests[0]

    await h.turn("Go on.")  # the same request again: the run is closed, nothing is asked again
    assert len(h.model.summary_requests) == 1
    assert len(h.model.planner_requests) == 1
    assert await h.record("step/1/compacted") == compaction
    assert first.messages == h.model.planner_requests[0].messages


async def test_a_compaction_recorded_before_a_crash_is_the_decision_after_it() -> None:
    h = await harness(budget=900)
    h.model.fail_next = []

    original = h.model.complete

    async def planner_fails_once(request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        if request.output_schema is None and not h.model.planner_requests:
            h.model.planner_requests.append(request)
            raise ModelError("overloaded", kind="overloaded", retryable=True)
        return await original(request, on_text)

    h.model.complete = planner_fails_once  # type: ignore[method-assign]
    with pytest.raises(RetryableError):
        await h.turn("Go on.")
    assert "step/1/compacted" in await h.keys()

    await h.turn("Go on.")  # redelivered

    assert len(h.model.summary_requests) == 1  # compacted once
    failed, answered = h.model.planner_requests
    assert failed.messages == answered.messages and failed.system == answered.system
    events = h.bus.events(StreamEventType.HISTORY_COMPACTED)
    assert len(events) == 2 and events[0] == events[1]  # same id: consumers de-duplicate
    assert (await h.terminal()).run_status is RunStatus.COMPLETED


async def test_later_calls_of_the_run_keep_the_compaction() -> None:
    h = await harness(budget=900, use_calculator=True)
    await h.turn("Add one and one.")
    [call] = [m for m in h.bus.messages if isinstance(m, ToolCallRequested)]

    await h.planner.on_tool_result(
        ToolCallCompleted(
            run_id=call.run_id,
            session_id=call.session_id,
            agent_id=call.agent_id,
            tool_use_id=call.tool_use_id,
            tool_name=call.tool_name,
            content=2,
            occurred_at=AT,
        )
    )

    first, second = h.model.planner_requests
    dropped = (await h.record("step/1/compacted"))["dropped_turns"]
    assert texts(second)[0] == texts(first)[0] == texts(first)[0]
    assert texts(second)[0].startswith(f"old question {dropped + 1}:")
    assert summary_in(second) == summary_in(first)
    assert (await h.terminal()).run_status is RunStatus.COMPLETED


async def test_a_turn_too_big_on_its_own_fails_with_context_overflow_before_any_model_call() -> None:
    h = await harness(budget=900)

    await h.turn("Please read this. " * 400)

    terminal = await h.terminal()
    assert terminal.run_status is RunStatus.FAILED
    assert terminal.failure.kind == "context_overflow"
    assert "over the request budget of 900" in terminal.failure.message
    assert h.model.planner_requests == []
    assert h.model.summary_requests == []
    assert "step/1/compacted" not in await h.keys()


async def test_a_compaction_the_model_refuses_fails_the_turn_instead_of_dropping_history() -> None:
    h = await harness(budget=900)
    h.model.fail_next = [ModelError("bad request", kind="invalid_request", retryable=False)]

    await h.turn("Go on.")

    terminal = await h.terminal()
    assert (terminal.run_status, terminal.failure.kind) == (RunStatus.FAILED, "context_overflow")
    assert "could not be compacted" in terminal.failure.message
    assert h.model.planner_requests == []


async def test_within_budget_nothing_is_compacted_and_the_estimate_is_enough() -> None:
    h = await harness(budget=150_000)
    await h.turn("Go on.")
    assert "step/1/compacted" not in await h.keys()
    assert h.model.counted == 0  # far below the budget: no provider call to count
    assert len(h.model.planner_requests[0].messages) == 13


def test_a_message_of_tool_traffic_is_never_a_turn_boundary() -> None:
    from quipu.services.planner.logic.context import history_turns  # noqa: PLC0415

    messages = [
        Message(role="system", parts=(TextPart(text="facts"),)),
        Message(role="user", parts=(TextPart(text="q1"),)),
        Message(role="assistant", parts=(TextPart(text="a1"),)),
        Message(role="user", parts=(TextPart(text="q2"),)),
        Message(role="assistant", parts=(TextPart(text="a2"),)),
        Message(role="user", parts=(TextPart(text="now"),)),
        Message(role="assistant", parts=(ToolUsePart(id="t", name="calculator", input={}),)),
    ]
    assert history_turns(messages) == [(1, 3), (3, 5)]
