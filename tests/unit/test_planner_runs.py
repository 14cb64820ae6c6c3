"""The agent loop on the in-memory store, with a fake model and a recording bus.

Each test drives `Planner` through its triggers (RunRequested, ToolCallCompleted, CancelRun) the
way the topics would, and asserts what a user would see: the run's records and transcript, the
messages published, how often the model was asked. Redelivery tests replay every trigger of a
finished run and show that nothing changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import StreamEventType
from quipu.contracts.lifecycle import decode_run_completed
from quipu.contracts.runs import CancelRun, RunKind, RunRequested, TurnCompleted
from quipu.contracts.store import LogBasis, Record, RunStatus, SessionOwner
from quipu.contracts.tools import DEFAULT_TOOLSET, AwaitInput, AwaitKind, ToolCallCompleted, ToolCallRequested
from quipu.contracts.transcript import Message, TextPart, ToolResultPart, ToolUsePart, encode_messages
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.agents import AgentRegistry, defined, removed
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.port import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    Usage,
)
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.shipped_tools import default_catalog
from quipu.services.domain.store.memory import InMemoryStore
from quipu.services.domain.toolset_registry import ToolsetRegistry, announce
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.kit.delivery import PermanentError, RetryableError
from quipu.services.kit.settings import KafkaSettings
from quipu.services.planner.adapters import SessionHistoryContext, SessionOwners, load_records
from quipu.services.planner.app import check_timeouts
from quipu.services.planner.logic.actions import Output
from quipu.services.planner.logic.keys import child_run_id
from quipu.services.planner.logic.payloads import SuspensionCheckpoint
from quipu.services.planner.logic.starts import (
    first_records,
    run_context,
    run_start,
    start_plan,
    user_message,
)
from quipu.services.planner.orchestrator import Planner, ReadyDeps
from quipu.services.planner.settings import PlannerSettings
from tests.support.announced import announced
from tests.support.planner_bus import Bus
from tests.timing import eventually, scaled

# --- a fake model -------------------------------------------------------------------------------

Answer = Callable[[ModelRequest], ModelResponse]


def use_id(request: ModelRequest, position: int) -> str:
    return "tu_" + hashlib.sha256(f"{request.call_key}#{position}".encode()).hexdigest()[:16]


def says(text: str, output_tokens: int = 5) -> ModelResponse:
    return ModelResponse(
        parts=[TextPart(text=text)],
        stop_reason=StopReason.END_TURN,
        usage=Usage(input_tokens=10, output_tokens=output_tokens),
        model="fake",
    )


def calls(request: ModelRequest, *uses: tuple[str, dict[str, Any]], output_tokens: int = 5) -> ModelResponse:
    return ModelResponse(
        parts=[
            TextPart(text="Let me check."),
            *(
                ToolUsePart(id=use_id(request, i), name=name, input=args)
                for i, (name, args) in enumerate(uses)
            ),
        ],
        stop_reason=StopReason.TOOL_USE,
        usage=Usage(input_tokens=10, output_tokens=output_tokens),
        model="fake",
    )


def last_results(request: ModelRequest) -> list[ToolResultPart]:
    last = request.messages[-1]
    return [part for part in last.parts if isinstance(part, ToolResultPart)]


def tool_then_answer(*uses: tuple[str, dict[str, Any]]) -> Answer:
    """Asks for `uses` on a user's text; answers with the results' contents after them."""

    def answer(request: ModelRequest) -> ModelResponse:
        results = last_results(request)
        if results:
            return says("Results: " + ", ".join(json.dumps(part.content) for part in results))
        return calls(request, *uses)

    return answer


class FakeModel:
    """A `ModelClient` answering by a function of the request; counts its calls."""

    name = "fake-provider"

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        self.requests.append(request)
        response = self.answer(request)
        if on_text is not None:
            for part in response.parts:
                if isinstance(part, TextPart):
                    for piece in (part.text[: len(part.text) // 2], part.text[len(part.text) // 2 :]):
                        await on_text(piece)
        return response

    async def count_tokens(self, request: ModelRequest) -> int:
        return 0


def failing(error: ModelError) -> Answer:
    def answer(request: ModelRequest) -> ModelResponse:
        raise error

    return answer


# --- the harness --------------------------------------------------------------------------------


AGENTS = AgentRegistry(
    [
        AgentDefinition(
            id="assistant",
            description="General assistant.",
            instructions="Be brief.",
            tools=["calculator", "current_time", "ask_user", "math_agent"],
        ),
        AgentDefinition(
            id="math_agent",
            description="Does maths.",
            instructions="Compute.",
            tools=["calculator"],
            max_steps=3,
        ),
    ]
)


@dataclass
class Harness:
    store: InMemoryStore
    model: FakeModel
    bus: Bus
    planner: Planner

    async def session(self, owner: SessionOwner | None = None) -> str:
        session_id = (
            "s-" + hashlib.sha256(str(id(self)).encode() + utc_now_ms().isoformat().encode()).hexdigest()[:8]
        )
        await self.store.create_session(session_id, utc_now_ms(), owner)
        return session_id

    async def start(self, text: str, **fields: Any) -> RunRequested:
        """A turn of `text` (`fields` as for `turn`) in a new session, delivered."""
        request = turn(text, await self.session(), **fields)
        await self.deliver(request)
        return request

    async def deliver(self, message: Output) -> None:
        if isinstance(message, RunRequested):
            await self.planner.on_run_requested(message)
        elif isinstance(message, ToolCallCompleted):
            await self.planner.on_tool_result(message)
        elif isinstance(message, CancelRun):
            await self.planner.on_cancel(message)
        else:
            raise AssertionError(f"nobody consumes {type(message).__name__} here")

    async def records(self, run_id: str) -> list[Record]:
        return await load_records(self.store, run_id)

    async def keys(self, run_id: str) -> list[str]:
        return [record.event_key for record in await self.records(run_id)]

    async def status(self, run_id: str) -> RunStatus:
        return (await self.store.load_run(run_id)).status

    async def terminal(self, run_id: str) -> Any:
        records = [r for r in await self.records(run_id) if r.type == "run_completed"]
        assert len(records) == 1
        return decode_run_completed(records[0].payload)


def make_harness(
    answer: Answer | FakeModel,
    settings: PlannerSettings | None = None,
    history: MemoryStore | None = None,
    agents: AgentRegistry | None = None,
    registry: ToolsetRegistry | None = None,
    store: InMemoryStore | None = None,
) -> Harness:
    """A planner over in-memory parts (`store`, or a fresh one), asking a `FakeModel` that answers
    by `answer` (or `answer` itself, a model of the test's own), offered the shipped tools as their
    executor announces them (or what `registry` holds); with `history`, its sessions' owners are
    claimed there."""
    store = store if store is not None else InMemoryStore()
    model = answer if isinstance(answer, FakeModel) else FakeModel(answer)
    bus = Bus()
    deps = ReadyDeps(
        store=store,
        model=model,
        registry=registry if registry is not None else announced(),
        agents=agents if agents is not None else AGENTS,
        context=SessionHistoryContext(store, 12),
        owners=SessionOwners.over(store, history) if history is not None else None,
    )
    return Harness(store, model, bus, Planner(deps, bus, settings or PlannerSettings()))


def turn(text: str, session_id: str = "", **fields: Any) -> RunRequested:
    run = "run-" + hashlib.sha256(f"{text}{session_id}{utc_now_ms()}{fields}".encode()).hexdigest()[:10]
    return RunRequested(run_id=run, session_id=session_id, agent_id="assistant", text=text, **fields)


def result_for(call: ToolCallRequested, content: Any, **fields: Any) -> ToolCallCompleted:
    return ToolCallCompleted(
        run_id=call.run_id,
        session_id=call.session_id,
        agent_id=call.agent_id,
        tool_use_id=call.tool_use_id,
        tool_name=call.tool_name,
        content=content,
        **fields,
    )


# --- the paths ----------------------------------------------------------------------------------


async def test_plain_answer_completes_the_turn_and_streams_the_reply() -> None:
    h = make_harness(lambda request: says("Hello there."))
    request = await h.start("hi")

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert await h.keys(request.run_id) == [
        "started",
        "context",
        "input",
        "phase/1/planning",
        "step/1/assistant",
        "completed",
    ]
    assert len(h.model.requests) == 1
    assert h.model.requests[0].call_key == f"{request.run_id}/step/1"
    assert h.model.requests[0].system == "Be brief."
    deltas = h.bus.events(StreamEventType.ASSISTANT_REPLY)
    assert "".join(event.payload["text"] for event in deltas) == "Hello there."
    assert [event.event_key for event in deltas] == ["step/1/delta/0", "step/1/delta/1"]
    [finished] = h.bus.of(TurnCompleted)
    assert (finished.user_text, finished.assistant_text, finished.session_id) == (
        "hi",
        "Hello there.",
        request.session_id,
    )
    # Every record written for the request carries the request's time: retries are exact.
    for record in await h.records(request.run_id):
        assert record.timestamp == request.occurred_at


async def test_a_replys_deltas_are_queued_at_once_and_taken_before_the_answer_is_written() -> None:
    # The stream reads on while the broker takes each delta; the owner's events of the run (its
    # terminal) follow the answer's record, so that is written only once every delta is taken.
    h = make_harness(lambda request: says("Hello there."))
    h.bus.holding = True
    session_id = await h.session()
    request = turn("hi", session_id)
    handling = asyncio.create_task(h.deliver(request))
    for _ in range(1000):
        if len(h.bus.events(StreamEventType.ASSISTANT_REPLY)) == 2:
            break
        await asyncio.sleep(0)
    assert len(h.bus.events(StreamEventType.ASSISTANT_REPLY)) == 2  # both queued, none taken yet
    for _ in range(100):
        await asyncio.sleep(0)
    assert not handling.done()
    assert "step/1/assistant" not in await h.keys(request.run_id)

    h.bus.release()
    await handling
    assert await h.status(request.run_id) is RunStatus.COMPLETED


async def test_tool_round_trip_records_the_results_and_answers() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"})))
    request = await h.start("calculate 6*7")

    [call] = h.bus.of(ToolCallRequested)
    assert (call.tool_name, call.input, call.run_id) == ("calculator", {"expression": "6*7"}, request.run_id)
    assert call.timeout_s == default_catalog().get("calculator").timeout_s
    assert await h.status(request.run_id) is RunStatus.RUNNING
    assert (await h.keys(request.run_id))[-1] == "phase/1/executing_tools"

    await h.deliver(result_for(call, 42))

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert len(h.model.requests) == 2
    assert h.model.requests[1].call_key == f"{request.run_id}/step/2"
    messages = await build_messages_from_run_log(h.store, request.run_id)
    validate_planner_transcript(messages)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2].parts == (ToolResultPart(tool_use_id=call.tool_use_id, content=42),)
    keys = await h.keys(request.run_id)
    assert keys[-5:] == [
        f"tool-result/{call.tool_use_id}",
        "step/1/tool-results",
        "phase/2/synthesizing",
        "step/2/assistant",
        "completed",
    ]
    [finished] = h.bus.of(TurnCompleted)
    assert finished.assistant_text == "Results: 42"


async def test_parallel_tool_uses_answer_in_tool_use_order_whatever_the_arrival_order() -> None:
    uses = [("calculator", {"expression": f"{n}+{n}"}) for n in (1, 2, 3)]
    h = make_harness(tool_then_answer(*uses))
    request = await h.start("three sums")
    sent = h.bus.of(ToolCallRequested)
    assert [call.input["expression"] for call in sent] == ["1+1", "2+2", "3+3"]

    for call in reversed(sent):
        await h.deliver(result_for(call, int(call.input["expression"][0]) * 2))

    assert len(h.model.requests) == 2
    assert len(h.bus.of(ToolCallRequested)) == 3  # no result re-dispatched the calls still pending
    results = last_results(h.model.requests[1])
    assert [part.tool_use_id for part in results] == [call.tool_use_id for call in sent]
    assert [part.content for part in results] == [2, 4, 6]
    assert await h.status(request.run_id) is RunStatus.COMPLETED


async def test_an_agent_removed_while_its_run_waits_fails_the_run_instead_of_leaving_it_waiting() -> None:
    agents = AgentRegistry()
    agents.apply(
        defined(AgentDefinition(id="courier", instructions="Add.", tools=["calculator"]), at=utc_now_ms())
    )
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"})), agents=agents)
    request = turn("add", await h.session()).model_copy(update={"agent_id": "courier"})
    await h.deliver(request)
    [call] = h.bus.of(ToolCallRequested)

    agents.apply(removed("courier", at=utc_now_ms() + timedelta(seconds=1)))
    await h.deliver(result_for(call, 2))

    assert await h.status(request.run_id) is RunStatus.FAILED
    terminal = await h.terminal(request.run_id)
    assert terminal.failure.kind == "agent_removed" and "courier" in terminal.failure.message
    assert len(h.model.requests) == 1


SHIPPED = announce(DEFAULT_TOOLSET, "1", default_catalog(), at=utc_now_ms())


async def test_a_shipped_tool_no_executor_announced_is_not_offered_and_the_run_fails_at_its_start() -> None:
    nothing_announced = ToolsetRegistry()
    h = make_harness(lambda _: says("never"), PlannerSettings(tools_wait_s=0), registry=nothing_announced)
    request = await h.start("calculate 6*7")

    assert await h.status(request.run_id) is RunStatus.FAILED
    failure = (await h.terminal(request.run_id)).failure
    assert failure.kind == "missing_tool"
    for name in ("calculator", "current_time", "ask_user"):
        assert name in failure.message
    assert "math_agent" not in failure.message  # an agent-tool: another registered agent
    assert h.model.requests == []


class WatchedRegistry(ToolsetRegistry):
    """A toolset registry that counts who waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    async def offered_within(self, names: Iterable[str], seconds: float) -> bool:
        self.waits += 1
        return await super().offered_within(names, seconds)


async def test_a_run_whose_tools_are_not_announced_yet_waits_for_the_announcement() -> None:
    registry = WatchedRegistry()
    settings = PlannerSettings(tools_wait_s=scaled(60))
    h = make_harness(lambda request: says("Hello."), settings, registry=registry)
    request = turn("hi", await h.session())

    delivered = asyncio.ensure_future(h.deliver(request))

    async def waiting() -> bool:
        return registry.waits == 1

    await eventually(waiting, within=30, what="the run waiting for its tools")
    assert not delivered.done() and h.model.requests == []
    registry.apply(SHIPPED)
    await delivered

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    [model_request] = h.model.requests
    offered = [tool.name for tool in model_request.tools]
    assert offered == ["calculator", "current_time", "ask_user", "math_agent"]


async def test_a_run_whose_tools_nobody_announces_fails_after_the_bounded_wait() -> None:
    settings = PlannerSettings(tools_wait_s=0.05)
    h = make_harness(lambda request: says("never"), settings, registry=ToolsetRegistry())
    request = await h.start("hi")

    failure = (await h.terminal(request.run_id)).failure
    assert failure.kind == "missing_tool" and "no executor announced them" in failure.message
    assert h.model.requests == []


async def test_step_budget_exhausted_fails_the_run_without_another_model_call() -> None:
    h = make_harness(lambda request: calls(request, ("current_time", {})))
    request = await h.start("loop forever", max_steps=2)
    await h.deliver(result_for(h.bus.of(ToolCallRequested)[-1], "12:00"))
    await h.deliver(result_for(h.bus.of(ToolCallRequested)[-1], "12:01"))

    assert len(h.model.requests) == 2
    assert await h.status(request.run_id) is RunStatus.FAILED
    terminal = await h.terminal(request.run_id)
    assert terminal.failure.kind == "budget_exhausted"
    assert "step budget" in terminal.failure.message
    assert not h.bus.of(TurnCompleted)


async def test_output_token_budget_exhausted_fails_the_run() -> None:
    h = make_harness(lambda request: calls(request, ("current_time", {}), output_tokens=600))
    request = await h.start("spend", max_tokens=1000)
    assert h.model.requests[0].max_tokens == 1000  # the run's budget bounds the call
    await h.deliver(result_for(h.bus.of(ToolCallRequested)[-1], "now"))
    assert h.model.requests[1].max_tokens == 400
    await h.deliver(result_for(h.bus.of(ToolCallRequested)[-1], "now"))

    assert len(h.model.requests) == 2
    terminal = await h.terminal(request.run_id)
    assert terminal.failure.kind == "budget_exhausted"
    assert "1200 of 1000" in terminal.failure.message


async def test_permanent_model_error_fails_the_run_with_provider_details() -> None:
    error = ModelError(
        "invalid request: bad schema", kind="invalid_request", retryable=False, http_status=400
    )
    h = make_harness(failing(error))
    request = await h.start("hi")

    terminal = await h.terminal(request.run_id)
    assert terminal.status == "failed"
    assert terminal.failure.kind == "model_error"
    assert (terminal.failure.provider, terminal.failure.code, terminal.failure.http_status) == (
        "fake-provider",
        "invalid_request",
        400,
    )
    assert terminal.failure.message == "invalid request: bad schema"
    assert terminal.failure.retryable is False


async def test_retryable_model_error_is_retried_by_delivery_and_leaves_no_step() -> None:
    error = ModelError("overloaded", kind="overloaded", retryable=True, http_status=529)
    h = make_harness(failing(error))
    session = await h.session()
    request = turn("hi", session)

    with pytest.raises(RetryableError):
        await h.deliver(request)
    assert await h.status(request.run_id) is RunStatus.RUNNING
    assert "step/1/assistant" not in await h.keys(request.run_id)

    h.model.answer = lambda request: says("Back again.")
    await h.deliver(request)  # the redelivery
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert (await h.keys(request.run_id)).count("phase/1/planning") == 1


async def test_cancel_at_a_boundary_ends_the_run_with_the_requested_reason() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"})))
    request = await h.start("calculate 1+1")
    [call] = h.bus.of(ToolCallRequested)

    await h.deliver(CancelRun(run_id=request.run_id, session_id=request.session_id))

    meta = await h.store.load_run(request.run_id)
    assert meta.status is RunStatus.CANCELED
    assert meta.cancellation_reason == "user_requested"
    terminal = await h.terminal(request.run_id)
    assert terminal.cancellation_reason == "user_requested"
    keys = await h.keys(request.run_id)
    assert keys[-2:] == ["cancel", "canceled"]

    await h.deliver(result_for(call, 2))  # the abandoned call answers late: ignored
    assert await h.keys(request.run_id) == keys
    assert len(h.model.requests) == 1


async def test_engine_reason_is_kept_when_the_session_ends() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"})))
    request = await h.start("calculate")
    await h.deliver(CancelRun(run_id=request.run_id, session_id=request.session_id, reason="session_ended"))
    await h.deliver(CancelRun(run_id=request.run_id, session_id=request.session_id, reason="user_requested"))

    terminal = await h.terminal(request.run_id)
    assert terminal.cancellation_reason == "session_ended"  # the first reason is permanent


async def test_suspension_then_resume_continues_in_the_same_session() -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        results = last_results(request)
        if results:
            return says(f"You said {results[0].content} and the time is {results[1].content}.")
        return calls(request, ("ask_user", {"question": "Which colour?"}), ("current_time", {}))

    h = make_harness(answer)
    first = await h.start("ask me a colour", principal_id="ana")
    ask, clock = h.bus.of(ToolCallRequested)
    awaiting = AwaitInput(kind=AwaitKind.CLARIFICATION, prompt="Which colour?")
    await h.deliver(result_for(ask, None, awaiting=awaiting))
    assert await h.status(first.run_id) is RunStatus.RUNNING  # one result still missing
    await h.deliver(result_for(clock, "09:30"))

    assert await h.status(first.run_id) is RunStatus.SUSPENDED
    assert (await h.keys(first.run_id))[-1] == f"suspend/{ask.tool_use_id}"
    checkpoint = SuspensionCheckpoint.decode((await h.store.load_run_suspension(first.run_id)).data)
    assert checkpoint.step == 1
    assert [(p.tool_use_id, p.tool_name, p.prompt) for p in checkpoint.pending] == [
        (ask.tool_use_id, "ask_user", "Which colour?")
    ]
    [event] = h.bus.events(StreamEventType.AWAIT_CLARIFICATION)
    assert (event.run_id, event.payload["prompt"], event.event_key) == (
        first.run_id,
        "Which colour?",
        f"suspend/{ask.tool_use_id}",
    )
    assert len(h.model.requests) == 1

    resume = RunRequested(
        kind=RunKind.RESUME,
        run_id=first.run_id + "-2",
        session_id=first.session_id,
        agent_id="assistant",
        predecessor_run_id=first.run_id,
        answer="blue",
    )
    await h.deliver(resume)

    assert await h.status(resume.run_id) is RunStatus.COMPLETED
    assert len(h.model.requests) == 2
    assert len(h.bus.of(ToolCallRequested)) == 2  # current_time was not run again
    assert [part.content for part in last_results(h.model.requests[1])] == ["blue", "09:30"]
    keys = await h.keys(resume.run_id)
    assert keys[:4] == ["started", "context", "seed", "input"]
    messages = await build_messages_from_run_log(h.store, resume.run_id)
    validate_planner_transcript(messages)
    [finished] = h.bus.of(TurnCompleted)
    assert finished.run_id == resume.run_id
    assert finished.user_text == "ask me a colour"
    assert finished.principal_id == "ana"
    assert (await h.store.load_run(first.run_id)).successor_run_id == resume.run_id


async def test_one_shot_run_cannot_wait_for_input_and_fails() -> None:
    h = make_harness(lambda request: calls(request, ("ask_user", {"question": "?"})))
    request = turn("ask me", "")
    await h.deliver(request)
    [ask] = h.bus.of(ToolCallRequested)
    await h.deliver(result_for(ask, None, awaiting=AwaitInput(kind=AwaitKind.CONFIRMATION, prompt="?")))

    terminal = await h.terminal(request.run_id)
    assert terminal.failure.kind == "input_required"


async def test_child_run_is_linked_to_its_parent_and_answers_its_tool_use() -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        results = last_results(request)
        if request.system == "Compute.":  # the math agent
            if results:
                return says(f"The answer is {results[0].content}.")
            return calls(request, ("calculator", {"expression": "6*7"}))
        if results:
            return says(f"The math agent says: {results[0].content}")
        return calls(request, ("math_agent", {"task": "what is 6*7?"}))

    h = make_harness(answer)
    parent = await h.start("ask the math_agent", principal_id="ana")

    [child_request] = h.bus.of(RunRequested)
    assert child_request.kind is RunKind.CHILD
    assert child_request.text == "what is 6*7?"
    assert child_request.agent_id == "math_agent"
    tool_call_id = child_request.parent.tool_call_id if child_request.parent else ""
    assert child_request.run_id == child_run_id(parent.run_id, tool_call_id)
    assert not h.bus.of(ToolCallRequested)

    await h.deliver(child_request)
    parent_records = await h.records(parent.run_id)
    [link] = [r for r in parent_records if r.type == "child_run_linked"]
    assert link.event_key == f"child/{tool_call_id}"
    assert json.loads(link.payload)["child_run_id"] == child_request.run_id
    assert (await h.store.load_run(child_request.run_id)).parent_run_id == parent.run_id

    [calc] = h.bus.of(ToolCallRequested)
    assert calc.run_id == child_request.run_id
    assert calc.principal_id == "ana"
    await h.deliver(result_for(calc, 42))

    assert await h.status(child_request.run_id) is RunStatus.COMPLETED
    [to_parent] = h.bus.of(ToolCallCompleted)
    assert (to_parent.run_id, to_parent.tool_use_id, to_parent.content, to_parent.is_error) == (
        parent.run_id,
        tool_call_id,
        "The answer is 42.",
        False,
    )
    assert not h.bus.of(TurnCompleted)  # a child is not a user's turn

    await h.deliver(to_parent)
    assert await h.status(parent.run_id) is RunStatus.COMPLETED
    [finished] = h.bus.of(TurnCompleted)
    assert finished.assistant_text == "The math agent says: The answer is 42."


async def test_canceling_a_parent_cancels_its_running_child_and_the_child_reports_an_error() -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        if request.system == "Compute.":
            return calls(request, ("calculator", {"expression": "1/3"}))
        return calls(request, ("math_agent", {"task": "1/3"}))

    h = make_harness(answer)
    parent = await h.start("delegate")
    [child_request] = h.bus.of(RunRequested)
    await h.deliver(child_request)

    await h.deliver(CancelRun(run_id=parent.run_id, session_id=parent.session_id))

    [cancel_child] = h.bus.of(CancelRun)
    assert cancel_child.run_id == child_request.run_id
    await h.deliver(cancel_child)
    assert await h.status(child_request.run_id) is RunStatus.CANCELED
    [to_parent] = h.bus.of(ToolCallCompleted)
    assert to_parent.is_error
    await h.deliver(to_parent)  # the parent is closed: ignored
    assert await h.status(parent.run_id) is RunStatus.CANCELED


async def test_start_in_an_ended_session_stops_without_a_model_call() -> None:
    h = make_harness(lambda request: says("never"))
    session = await h.session()
    await h.store.end_session(session, utc_now_ms())
    request = turn("hello?", session)

    await h.deliver(request)
    await h.deliver(request)

    assert h.model.requests == []
    meta = await h.store.load_run(request.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "session_ended")
    assert await h.keys(request.run_id) == ["started", "stopped"]
    assert h.bus.messages == []


async def test_unknown_tool_gets_an_error_result_and_the_model_goes_on() -> None:
    h = make_harness(tool_then_answer(("teleport", {"to": "Mars"})))
    request = await h.start("go")

    assert not h.bus.of(ToolCallRequested)
    assert len(h.model.requests) == 2
    [result] = last_results(h.model.requests[1])
    assert result.is_error and "unknown tool" in result.content
    assert await h.status(request.run_id) is RunStatus.COMPLETED


async def test_a_new_turn_is_seeded_with_the_sessions_earlier_turns() -> None:
    h = make_harness(lambda request: says(f"echo {len(request.messages)}"))
    session = await h.session()
    for n in range(8):
        await h.deliver(turn(f"message {n}", session))

    last = h.model.requests[-1]
    texts = [(m.role, m.parts[0].text) for m in last.messages]  # type: ignore[union-attr]
    assert len(texts) == 13  # 12 messages of history (six whole turns), then the new one
    assert texts[0] == ("user", "message 1")
    assert texts[-2:] == [("assistant", "echo 13"), ("user", "message 7")]  # turn 6 saw 13 too


async def test_one_shot_run_has_no_history_and_no_finished_turn() -> None:
    h = make_harness(lambda request: says("ok"))
    request = turn("hi", "")
    await h.deliver(request)
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert "seed" not in await h.keys(request.run_id)
    assert not h.bus.of(TurnCompleted)


# --- redelivery ---------------------------------------------------------------------------------


async def test_replaying_every_trigger_of_a_finished_run_changes_nothing() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"}), ("current_time", {})))
    request = await h.start("calculate 6*7 and time")
    first, second = h.bus.of(ToolCallRequested)
    results = [result_for(first, 42), result_for(second, "10:00")]
    for result in results:
        await h.deliver(result)
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    records = await h.records(request.run_id)
    model_calls = len(h.model.requests)
    published = list(h.bus.messages)

    cancel = CancelRun(run_id=request.run_id, session_id=request.session_id)
    triggers: list[Output] = [request, *results, request, *reversed(results), cancel]
    for trigger in triggers:
        await h.deliver(trigger)

    assert len(h.model.requests) == model_calls == 2
    assert await h.records(request.run_id) == records
    replayed = h.bus.messages[len(published) :]
    assert not [m for m in replayed if isinstance(m, ToolCallRequested)]  # answered uses never again
    # What the end published is published again, identical (consumers de-duplicate on ids).
    assert {m.event_id for m in replayed} <= {m.event_id for m in published}


async def test_a_tool_result_delivered_twice_is_recorded_once() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"}), ("current_time", {})))
    request = await h.start("two tools")
    first, second = h.bus.of(ToolCallRequested)
    once = result_for(first, 2)
    again_later = result_for(first, 3)  # a second execution's different answer: the first one wins

    await h.deliver(once)
    await h.deliver(once)
    await h.deliver(again_later)
    await h.deliver(result_for(second, "noon"))

    keys = await h.keys(request.run_id)
    assert keys.count(f"tool-result/{first.tool_use_id}") == 1
    assert len(h.model.requests) == 2
    assert [part.content for part in last_results(h.model.requests[1])] == [2, "noon"]


async def test_replaying_a_run_request_mid_run_republishes_pending_calls_only() -> None:
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"}), ("current_time", {})))
    request = await h.start("two tools")
    first, second = h.bus.of(ToolCallRequested)
    await h.deliver(result_for(first, 2))

    await h.deliver(request)  # e.g. the planner crashed before committing the request's offset

    again = h.bus.of(ToolCallRequested)[2:]
    assert [(call.tool_use_id, call.event_id) for call in again] == [(second.tool_use_id, second.event_id)]
    assert len(h.model.requests) == 1


async def test_replayed_child_request_and_result_change_nothing() -> None:
    def answer(request: ModelRequest) -> ModelResponse:
        if request.system == "Compute.":
            return says("7")
        if last_results(request):
            return says("done")
        return calls(request, ("math_agent", {"task": "3+4"}))

    h = make_harness(answer)
    parent = await h.start("delegate 3+4")
    [child_request] = h.bus.of(RunRequested)
    await h.deliver(child_request)
    [to_parent] = h.bus.of(ToolCallCompleted)
    await h.deliver(to_parent)
    parent_records, child_records = await h.records(parent.run_id), await h.records(child_request.run_id)
    model_calls = len(h.model.requests)

    for message in (child_request, to_parent, parent, child_request, to_parent):
        await h.deliver(message)

    assert len(h.model.requests) == model_calls == 3
    assert await h.records(parent.run_id) == parent_records
    assert await h.records(child_request.run_id) == child_records


class RacingStore(InMemoryStore):
    """Another planner writes `step/1/assistant` first, with its own answer, just before ours
    (whichever command carries ours: a step's records or the terminal closing with them)."""

    async def _race(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.event_key == "step/1/assistant" and not getattr(self, "raced", False):
                self.raced = True
                theirs = Message(role="assistant", parts=(TextPart(text="Their answer."),))
                await super().append_run_record(
                    record.model_copy(
                        update={"payload": encode_messages([theirs]), "timestamp": utc_now_ms()}
                    )
                )

    async def append_run_records(self, records: Sequence[Record], *, follows: LogBasis | None = None) -> Any:
        await self._race(records)
        return await super().append_run_records(records, follows=follows)

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> Any:
        await self._race(records)
        return await super().record_run_terminal(record, records, follows=follows)


async def test_a_step_another_writer_recorded_first_is_reused() -> None:
    store = RacingStore()
    h = make_harness(lambda request: says("Mine."), store=store)
    request = await h.start("hi")

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    messages = await build_messages_from_run_log(store, request.run_id)
    assert [m.parts[0].text for m in messages] == ["hi", "Their answer."]  # type: ignore[union-attr]
    [finished] = h.bus.of(TurnCompleted)
    assert finished.assistant_text == "Their answer."


async def test_a_session_ended_under_a_running_run_stops_it_at_the_next_write_where_no_tool_runs() -> None:
    """The result rides in the next step's command, so the model is asked (nothing was recorded
    before it: no recorded call is repeated) and the step is written in the ended session. What
    the step justifies is withheld, a tool call and a child run alike, and the run is canceled."""

    def answer(request: ModelRequest) -> ModelResponse:
        if request.call_key.endswith("/step/1"):
            return calls(request, ("calculator", {"expression": "1+1"}))
        return calls(request, ("calculator", {"expression": "2+2"}), ("math_agent", {"task": "3+3"}))

    h = make_harness(answer)
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    await h.store.end_session(request.session_id, utc_now_ms())

    await h.deliver(result_for(call, 2))

    assert len(h.model.requests) == 2
    meta = await h.store.load_run(request.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "session_ended")
    # The next write is the step the result opens, with the result in it; then the end.
    assert (await h.keys(request.run_id))[-7:] == [
        f"tool-result/{call.tool_use_id}",
        "step/1/tool-results",
        "phase/2/synthesizing",
        "step/2/assistant",
        "phase/2/executing_tools",
        "cancel",
        "canceled",
    ]
    assert h.bus.of(ToolCallRequested) == [call]
    assert h.bus.of(RunRequested) == []
    assert not h.bus.of(TurnCompleted)


async def test_an_answer_written_in_an_ended_session_closes_the_run_as_given() -> None:
    """A result whose answer is the terminal: the session's end is seen by that very write, which
    the store takes (a running run may close in an ended session), so the turn is answered."""
    h = make_harness(tool_then_answer(("calculator", {"expression": "1+1"})))
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    await h.store.end_session(request.session_id, utc_now_ms())

    await h.deliver(result_for(call, 2))

    assert len(h.model.requests) == 2
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert (await h.keys(request.run_id))[-5:] == [
        f"tool-result/{call.tool_use_id}",
        "step/1/tool-results",
        "phase/2/synthesizing",
        "step/2/assistant",
        "completed",
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"agent_id": "nobody", "text": "hi"}, "not registered"),
        ({"agent_id": "assistant", "text": ""}, "needs the user's text"),
        ({"agent_id": "math_agent", "kind": RunKind.CHILD, "text": "x"}, "names no parent"),
        ({"agent_id": "assistant", "kind": RunKind.RESUME, "predecessor_run_id": "ghost"}, "not suspended"),
    ],
)
async def test_requests_that_can_never_run_are_permanent_errors(fields: dict[str, Any], message: str) -> None:
    h = make_harness(lambda request: says("never"))
    session = await h.session()
    with pytest.raises(PermanentError, match=message):
        await h.deliver(RunRequested(run_id="r-bad", session_id=session, **fields))
    assert h.model.requests == []


async def test_a_child_that_cannot_start_answers_its_parent_with_an_error() -> None:
    h = make_harness(lambda request: calls(request, ("math_agent", {"task": "2+2"})))
    parent = await h.start("delegate")
    [child_request] = h.bus.of(RunRequested)
    await h.store.end_session(parent.session_id, utc_now_ms())

    await h.deliver(child_request)  # the child's start takes the stop decision

    assert (await h.store.load_run(child_request.run_id)).status is RunStatus.CANCELED
    [answer] = h.bus.of(ToolCallCompleted)
    assert (answer.run_id, answer.is_error) == (parent.run_id, True)
    await h.deliver(answer)  # the parent is not left waiting: the ended session stops it
    meta = await h.store.load_run(parent.run_id)
    assert (meta.status, meta.cancellation_reason) == (RunStatus.CANCELED, "session_ended")
    # The answer rode in the parent's next step, written in the ended session: it asks for the
    # agent again, and that child is never requested.
    assert len(h.model.requests) == 2
    assert h.bus.of(RunRequested) == [child_request]


class SlowModel(FakeModel):
    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        self.requests.append(request)
        await asyncio.sleep(5)
        return says("too late")


async def test_a_model_call_that_outlives_its_timeout_is_retried_later() -> None:
    h = make_harness(SlowModel(lambda request: says("unused")), PlannerSettings(model_timeout_s=0.05))
    session = await h.session()
    request = turn("hi", session)
    with pytest.raises(RetryableError, match="timed out"):
        await h.deliver(request)
    assert await h.status(request.run_id) is RunStatus.RUNNING


def test_model_timeout_with_its_retries_must_fit_the_poll_interval() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9", max_poll_interval_ms=300_000)
    check_timeouts(kafka, PlannerSettings(model_timeout_s=200, retry_attempts=1))
    with pytest.raises(ValueError, match="max_poll_interval"):
        check_timeouts(kafka, PlannerSettings(model_timeout_s=200, retry_attempts=2))


class YieldingStore(InMemoryStore):
    """Gives other tasks a turn around every read and write, as a store across a network would."""

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Any:
        await asyncio.sleep(0)
        page = await super().list_run_records(run_id, cursor, limit)
        await asyncio.sleep(0)
        return page

    async def append_run_records(self, records: Sequence[Record], *, follows: LogBasis | None = None) -> Any:
        await asyncio.sleep(0)
        result = await super().append_run_records(records, follows=follows)
        await asyncio.sleep(0)
        return result


async def test_results_arriving_together_are_handled_one_at_a_time_per_run() -> None:
    uses = [("calculator", {"expression": f"{n}*2"}) for n in range(4)]
    h = make_harness(tool_then_answer(*uses), store=YieldingStore())
    request = await h.start("four at once")
    sent = h.bus.of(ToolCallRequested)

    await asyncio.gather(*(h.deliver(result_for(call, n)) for n, call in enumerate(sent)))

    assert len(h.model.requests) == 2
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert [part.content for part in last_results(h.model.requests[1])] == [0, 1, 2, 3]
    assert len(h.planner.locks) == 0  # no lock outlives its users


async def test_two_planner_processes_racing_on_one_run_finish_it_once() -> None:
    """No lock is shared across processes (a rebalance): keys and reloads still give one outcome."""
    uses = [("calculator", {"expression": f"{n}*2"}) for n in range(4)]
    store = YieldingStore()
    h = make_harness(tool_then_answer(*uses), store=store)
    other = Planner(h.planner.deps, h.bus, PlannerSettings())
    request = await h.start("four at once")
    sent = h.bus.of(ToolCallRequested)

    await asyncio.gather(
        *((h.planner if n % 2 else other).on_tool_result(result_for(call, n)) for n, call in enumerate(sent))
    )

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    keys = await h.keys(request.run_id)
    assert keys.count("step/2/assistant") == 1 and keys.count("completed") == 1
    messages = await build_messages_from_run_log(store, request.run_id)
    validate_planner_transcript(messages)
    assert [part.content for part in messages[2].parts] == [0, 1, 2, 3]  # type: ignore[union-attr]


async def test_a_huge_prompt_never_makes_a_run_spend_more_than_its_output_budget() -> None:
    """A 120 KB prompt echoed back by the offline model: the step may spend what the run's budget
    leaves (`max_tokens`), and the answer stops there, as a real model's does, instead of running
    to twice the budget."""
    h = make_harness(ScriptedModel().respond)
    prompt = " ".join(f"word{index}" for index in range(20_000))[:120_000]
    request = await h.start(prompt, max_tokens=16_000)
    [call] = h.model.requests
    assert call.max_tokens <= 16_000
    messages = await build_messages_from_run_log(h.store, request.run_id)
    usage = (messages[-1].meta or {})["usage"]
    assert usage["output_tokens"] <= 16_000 and usage["stop_reason"] == "max_tokens"
    assert await h.status(request.run_id) is RunStatus.COMPLETED


class ReadCountingStore(InMemoryStore):
    """Counts the reads of a run's log."""

    reads = 0

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Any:
        self.reads += 1
        return await super().list_run_records(run_id, cursor, limit)


def counting_harness(answer: Answer) -> tuple[Harness, ReadCountingStore]:
    store = ReadCountingStore()
    return make_harness(answer, store=store), store


async def test_the_result_of_a_call_this_planner_sent_is_folded_in_without_reading_the_log() -> None:
    h, store = counting_harness(tool_then_answer(("calculator", {"expression": "6*7"})))
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    before = store.reads

    await h.deliver(result_for(call, 42))

    assert store.reads == before
    assert await h.status(request.run_id) is RunStatus.COMPLETED
    [finished] = h.bus.of(TurnCompleted)
    assert finished.assistant_text == "Results: 42"


async def test_a_kept_view_another_process_wrote_past_is_read_again_and_nothing_is_done_twice() -> None:
    """Another copy takes a run's results only after a rebalance of the results group, which has
    every copy drop the views it kept: the result redelivered here is taken on what the store holds."""
    h, _ = counting_harness(tool_then_answer(("calculator", {"expression": "6*7"})))
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    h.planner.forget_kept_views()  # the rebalance that gives the results partition to another copy
    other = Planner(h.planner.deps, h.bus, PlannerSettings())
    await other.on_tool_result(result_for(call, 42))  # which finishes the run
    model_calls = len(h.model.requests)

    await h.deliver(result_for(call, 42))  # redelivered to the copy that kept its view

    assert len(h.model.requests) == model_calls
    keys = await h.keys(request.run_id)
    assert keys.count("step/2/assistant") == 1 and keys.count("completed") == 1
    assert len(h.bus.of(TurnCompleted)) >= 1


# --- a run's first records ride on its start ----------------------------------------------------


class WritesSeen(InMemoryStore):
    """An in-memory store that names the runtime-store writes sent to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    async def start_root_run(self, *arguments: Any) -> Any:
        self.writes.append("start_root_run")
        return await super().start_root_run(*arguments)

    async def append_run_records(self, records: Sequence[Record], *, follows: LogBasis | None = None) -> Any:
        self.writes.append("append_run_records")
        return await super().append_run_records(records, follows=follows)

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> Any:
        self.writes.append("record_run_terminal")
        return await super().record_run_terminal(record, records, follows=follows)


async def test_a_turn_starts_with_its_context_and_input_so_a_one_tool_run_is_three_writes() -> None:
    store = WritesSeen()
    h = make_harness(tool_then_answer(("calculator", {"expression": "6*7"})), store=store)
    request = await h.start("calculate")
    [call] = h.bus.of(ToolCallRequested)
    await h.deliver(result_for(call, 42))

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert (await h.keys(request.run_id))[:3] == ["started", "context", "input"]
    # The start and the run's first records; the model's step with its call; the end, with the
    # result it answers.
    assert store.writes == ["start_root_run", "append_run_records", "record_run_terminal"]


@pytest.mark.parametrize("earlier", ["another input", "no input"])
async def test_a_turn_started_before_with_other_first_records_goes_on_from_what_the_run_holds(
    earlier: str,
) -> None:
    """A redelivery whose first records differ from the first attempt's (the memory read changed
    meanwhile) starts as that attempt did and writes only what the run lacks."""
    h = make_harness(lambda request: says("Hello."))
    session = await h.session()
    request = turn("hi", session)
    agent = AGENTS.get_agent("assistant")
    plan = start_plan(run_start(request, agent_id=agent.id, session_id=session))
    context = run_context(request, agent)
    opening = user_message("hi, as first read" if earlier == "another input" else "hi")
    first = first_records(plan, context, opening, request.occurred_at)
    written = first if earlier == "another input" else first[:1]
    await h.store.start_root_run(plan.run, plan.started, plan.stopped, written)

    await h.deliver(request)

    assert await h.status(request.run_id) is RunStatus.COMPLETED
    assert len(h.model.requests) == 1
    records = await h.records(request.run_id)
    assert [record.event_key for record in records][:3] == ["started", "context", "input"]
    (stored_input,) = [record for record in records if record.event_key == "input"]
    kept = opening if earlier == "another input" else user_message("hi")
    assert stored_input.payload == encode_messages([kept])
