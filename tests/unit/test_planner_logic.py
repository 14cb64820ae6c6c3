"""The planner's pure decisions: records in, the next step out (no store, no broker, no model)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quipu.assistant import app as assistant_app
from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import RunPhase
from quipu.contracts.lifecycle import decode_run_completed, encode_run_started
from quipu.contracts.runs import ParentToolCall, RunRequested
from quipu.contracts.store import Record, RunStart
from quipu.contracts.tools import AwaitInput, AwaitKind
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_APPENDED,
    Message,
    TextPart,
    ToolUsePart,
    encode_messages,
)
from quipu.contracts.wire import to_millisecond
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import ContextBlocks
from quipu.services.domain.models.port import ToolSpec
from quipu.services.planner.logic.actions import Append, CallModel, Closed, Dispatch, Finish, Trigger, Wait
from quipu.services.planner.logic.context import history_window, seed_messages
from quipu.services.planner.logic.decide import decide
from quipu.services.planner.logic.dispatch import ToolInfo, task_text
from quipu.services.planner.logic.keys import CONTEXT_TYPE, TOOL_RESULT_TYPE
from quipu.services.planner.logic.model_call import model_request
from quipu.services.planner.logic.payloads import PendingInput, RunContext, SuspensionCheckpoint, ToolResult
from quipu.services.planner.logic.run_end import closed_outputs
from quipu.services.planner.logic.starts import run_context, start_plan
from quipu.services.planner.logic.tool_results import result_part
from quipu.services.planner.logic.view import RunView

AT = datetime(2025, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
LATER = datetime(2025, 5, 1, 12, 0, 5, tzinfo=UTC)


def say(role: str, text: str) -> Message:
    return Message(role=role, parts=(TextPart(text=text),))


def uses(*ids: str) -> Message:
    return Message(
        role="assistant",
        parts=(TextPart(text="calling"), *(ToolUsePart(id=i, name="calculator", input={}) for i in ids)),
    )


class Log:
    """Builds a run's records the way the planner and the store write them."""

    def __init__(self, session_id: str = "s1") -> None:
        self.run = RunStart(run_id="r1", agent_id="assistant", session_id=session_id, started_at=AT)
        plan = start_plan(self.run)
        self.records: list[Record] = [plan.started]
        self.view_of = RunView.of(self.records)

    def add(self, key: str, type_: str, payload: bytes) -> Log:
        self.records.append(
            Record(
                event_key=key,
                run_id="r1",
                agent_id="assistant",
                session_id=self.run.session_id,
                type=type_,
                payload=payload,
                timestamp=AT,
            )
        )
        return self

    def context(self, max_steps: int = 8, max_tokens: int = 1000) -> Log:
        return self.add("context", CONTEXT_TYPE, RunContext("ana", max_steps, max_tokens).encode())

    def messages(self, key: str, *messages: Message) -> Log:
        return self.add(key, TRANSCRIPT_MESSAGES_APPENDED, encode_messages(list(messages)))

    def result(self, tool_use_id: str, content: Any = 1, awaiting: AwaitInput | None = None) -> Log:
        result = ToolResult(tool_use_id, "calculator", content, awaiting=awaiting)
        return self.add(f"tool-result/{tool_use_id}", TOOL_RESULT_TYPE, result.encode())

    def view(self) -> RunView:
        view = RunView.of(self.records)
        assert view is not None
        return view


def trigger(result_for: str = "") -> Trigger:
    return Trigger(at=LATER, event_id="e1", result_for=result_for)


def test_no_run_started_is_no_run() -> None:
    assert RunView.of([]) is None


def test_nothing_happens_before_the_input_is_recorded() -> None:
    assert isinstance(decide(Log().context().view(), trigger()), Wait)


def test_first_step_records_planning_then_calls_the_model() -> None:
    log = Log().context().messages("input", say("user", "hi"))
    action = decide(log.view(), trigger())
    assert isinstance(action, Append)
    assert action.record.event_key == "phase/1/planning"
    assert action.record.timestamp == LATER
    assert action.record.payload == b'{"phase":"planning"}'
    log.add("phase/1/planning", "run_phase_changed", action.record.payload)
    assert decide(log.view(), trigger()) == CallModel(1)


def test_tool_uses_record_executing_tools_then_dispatch_only_the_missing_ones() -> None:
    log = Log().context().messages("input", say("user", "hi")).messages("step/1/assistant", uses("a", "b"))
    action = decide(log.view(), trigger())
    assert isinstance(action, Append)
    assert action.record.event_key == f"phase/1/{RunPhase.EXECUTING_TOOLS.value}"
    log.add(action.record.event_key, action.record.type, action.record.payload).result("a")
    dispatch = decide(log.view(), trigger())
    assert isinstance(dispatch, Dispatch)
    assert [use.id for use in dispatch.uses] == ["b"]
    # A result of this very group, or a pass that has dispatched it already, sends nothing again.
    assert isinstance(decide(log.view(), trigger(result_for="a")), Wait)
    assert isinstance(decide(log.view(), trigger(), dispatched_step=1), Wait)


def test_complete_group_becomes_one_user_message_in_tool_use_order() -> None:
    log = Log().context().messages("input", say("user", "hi")).messages("step/1/assistant", uses("a", "b"))
    log.add("phase/1/executing_tools", "run_phase_changed", b'{"phase":"executing_tools"}')
    log.result("b", "B").result("a", "A")
    action = decide(log.view(), trigger(result_for="a"))
    assert isinstance(action, Append)
    assert action.record.event_key == "step/1/tool-results"
    assert b'"tool_use_id":"a","content":"A"' in action.record.payload
    assert action.record.payload.index(b'"a"') < action.record.payload.index(b'"b"')


def test_waiting_result_suspends_only_when_the_group_is_complete() -> None:
    ask = AwaitInput(kind=AwaitKind.CONFIRMATION, prompt="Sure?")
    log = Log().context().messages("input", say("user", "hi")).messages("step/1/assistant", uses("a", "b"))
    log.add("phase/1/executing_tools", "run_phase_changed", b'{"phase":"executing_tools"}')
    log.result("a", None, awaiting=ask)
    assert isinstance(decide(log.view(), trigger(result_for="a")), Wait)
    log.result("b", 2)
    action = decide(log.view(), trigger(result_for="b"))
    assert action.__class__.__name__ == "Suspend"
    checkpoint = SuspensionCheckpoint.decode(action.checkpoint.data)  # type: ignore[union-attr]
    assert checkpoint.pending == (PendingInput("a", "calculator", AwaitKind.CONFIRMATION, "Sure?"),)
    assert action.record.event_key == "suspend/a"  # type: ignore[union-attr]


def test_budget_is_checked_before_the_model_call() -> None:
    log = Log().context(max_steps=1).messages("input", say("user", "hi"))
    log.messages("step/1/assistant", uses("a")).result("a").messages(
        "step/1/tool-results", say("user", "placeholder")
    )
    action = decide(log.view(), trigger())
    assert isinstance(action, Finish)
    payload = decode_run_completed(action.record.payload)
    assert (payload.status, payload.failure.kind if payload.failure else "") == ("failed", "budget_exhausted")


def test_cancel_intent_ends_the_run_with_the_same_reason() -> None:
    log = Log().context().messages("input", say("user", "hi"))
    log.add("cancel", "runtime.cancellation_intent", b'{"reason":"user_requested"}')
    action = decide(log.view(), trigger())
    assert isinstance(action, Finish)
    assert action.record.event_key == "canceled"
    assert decode_run_completed(action.record.payload).cancellation_reason == "user_requested"


def test_closed_run_publishes_nothing_new_when_it_was_stopped_at_start() -> None:
    log = Log()
    plan = start_plan(log.run)
    log.records.append(plan.stopped)
    view = log.view()
    assert view.closed
    assert closed_outputs(view) == []
    assert isinstance(decide(view, trigger()), Closed)


def test_history_window_keeps_whole_turns_only() -> None:
    turns = [(f"u{n}", f"a{n}") for n in range(10)]
    assert [m.parts[0].text for m in history_window(turns, 5)] == ["u8", "a8", "u9", "a9"]  # type: ignore[union-attr]
    assert len(history_window(turns, 12)) == 12
    assert history_window(turns, 1) == []
    assert history_window(turns, 0) == []


def test_seed_puts_system_blocks_first() -> None:
    seeded = seed_messages(ContextBlocks(system_blocks=["facts", ""], history=[say("user", "x")]))
    assert [(m.role, m.parts[0].text) for m in seeded] == [("system", "facts"), ("user", "x")]  # type: ignore[union-attr]


def test_model_request_joins_system_blocks_and_bounds_tokens() -> None:
    log = (
        Log()
        .context(max_tokens=700)
        .add("seed", "transcript_messages_seeded", encode_messages([say("system", "Ana likes tea.")]))
    )
    log.messages("input", say("user", "hi"))
    agent = AgentDefinition(id="assistant", instructions="Be kind.", tools=["calculator", "ghost"])
    tools = {"calculator": ToolInfo(ToolSpec("calculator", "adds", {"type": "object"}))}
    request = model_request(log.view(), agent, tools, 1, 4096)
    assert request.system == "Be kind.\n\nAna likes tea."
    assert [m.role for m in request.messages] == ["user"]
    assert [tool.name for tool in request.tools] == ["calculator"]
    assert request.max_tokens == 700
    assert request.call_key == "r1/step/1"
    assert request.model == ""  # the deployment's model
    own = model_request(log.view(), agent.model_copy(update={"model": "claude-own"}), tools, 1, 4096)
    assert own.model == "claude-own"


def test_task_text_of_agent_tool_inputs() -> None:
    assert task_text({"task": "add"}) == "add"
    assert task_text({"whatever": "lone string"}) == "lone string"
    assert task_text({"a": 1, "b": [2]}) == '{"a":1,"b":[2]}'


def test_failed_tool_results_are_text_and_huge_ones_are_omitted() -> None:
    failed = result_part(ToolResult("a", "calculator", {"code": 7}, is_error=True))
    assert (failed.content, failed.is_error) == ('{"code":7}', True)
    assert result_part(ToolResult("a", "calc", None, is_error=True)).content == "calc failed"
    huge = result_part(ToolResult("a", "calc", "x" * 70_000))
    assert huge.content == {"omitted": True, "reason": "size_limit"}


def test_context_and_checkpoint_round_trip() -> None:
    parent = ParentToolCall(parent_run_id="p", parent_agent_id="assistant", tool_call_id="t", tool_name="m")
    context = RunContext("ana", 3, 99, parent)
    assert RunContext.decode(context.encode()) == context
    checkpoint = SuspensionCheckpoint(2, (PendingInput("t", "ask_user", AwaitKind.QUESTIONS, "?", {"x": 1}),))
    assert SuspensionCheckpoint.decode(checkpoint.encode()) == checkpoint


def test_run_context_prefers_the_request_then_the_predecessor_then_the_agent() -> None:
    agent = AgentRegistry(assistant_app.agents).get_agent("assistant")
    request = RunRequested(run_id="r", agent_id="assistant", max_steps=2)
    assert run_context(request, agent) == RunContext("", 2, agent.max_output_tokens)
    inherited = RunContext("ana", 5, 77)
    assert run_context(RunRequested(run_id="r", agent_id="assistant"), agent, inherited) == inherited


def test_start_records_are_canonical_and_stamped_with_the_request_time() -> None:
    run = RunStart(
        run_id="r", agent_id="a", session_id="s", started_at=to_millisecond(LATER), labels={"b": "2"}
    )
    plan = start_plan(run)
    assert plan.started.payload == encode_run_started(run)
    assert plan.started.timestamp == plan.stopped.timestamp == run.started_at
    assert decode_run_completed(plan.stopped.payload).cancellation_reason == "session_ended"
    assert to_millisecond(datetime(2025, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)).microsecond == 123000


def test_the_built_in_assistant_app() -> None:
    agents = AgentRegistry(assistant_app.agents)
    assistant = agents.get_agent("assistant")
    assert set(assistant.tools) == {"current_time", "calculator", "notes", "ask_user", "math_agent"}
    assert assistant.max_steps == 8
    assert agents.is_agent_tool("math_agent")
    assert agents.get_agent("math_agent").tools == ["calculator"]
