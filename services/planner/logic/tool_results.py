"""Tool results into the transcript, and the suspension of a run whose tools wait for input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import encode_run_suspended
from quipu.contracts.store import Checkpoint, LifecycleType
from quipu.contracts.transcript import (
    Message,
    ToolResultPart,
    ToolUsePart,
    bounded_tool_result,
    encode_json_value,
)
from quipu.services.planner.logic.actions import Output, Suspend
from quipu.services.planner.logic.keys import CHECKPOINT_VERSION, suspend_key
from quipu.services.planner.logic.payloads import PendingInput, SuspensionCheckpoint, ToolResult
from quipu.services.planner.logic.view import RunView


def result_part(result: ToolResult) -> ToolResultPart:
    """A recorded result as a transcript part, under the size and error rules."""
    if result.is_error:
        content = result.content if isinstance(result.content, str) and result.content else None
        text = content or (
            encode_json_value(result.content).decode("utf-8")
            if result.content is not None
            else f"{result.tool_name} failed"
        )
        return ToolResultPart(tool_use_id=result.tool_use_id, content=text, is_error=True)
    return ToolResultPart(tool_use_id=result.tool_use_id, content=bounded_tool_result(result.content, False))


def tool_results_message(uses: Sequence[ToolUsePart], results: Mapping[str, ToolResult]) -> Message:
    """The user message of a group's results, in the order of the tool uses."""
    return Message(role="user", parts=tuple(result_part(results[use.id]) for use in uses))


def pending_input(use: ToolUsePart, result: ToolResult) -> PendingInput:
    """A waiting tool use as the checkpoint keeps it."""
    assert result.awaiting is not None
    return PendingInput(
        tool_use_id=use.id,
        tool_name=use.name,
        kind=result.awaiting.kind,
        prompt=result.awaiting.prompt,
        details=dict(result.awaiting.details),
    )


def suspension(view: RunView, step: int, pending: Sequence[PendingInput], at: datetime) -> Suspend:
    """The checkpoint, the `run_suspended` record and the `await_*` events of a suspension."""
    first = pending[0]
    suspension_id = suspend_key(first.tool_use_id)
    record = view.record(
        suspension_id,
        LifecycleType.RUN_SUSPENDED.value,
        encode_run_suspended(
            suspension_id, CHECKPOINT_VERSION, len(pending), sorted({item.tool_name for item in pending})
        ),
        at,
    )
    data = SuspensionCheckpoint(step=step, pending=tuple(pending)).encode()
    return Suspend(checkpoint=Checkpoint(suspension_id=suspension_id, data=data), record=record)


def await_events(view: RunView, pending: Sequence[PendingInput], at: datetime) -> list[Output]:
    """One `await_*` event per waiting tool use, keyed by the suspension."""
    return [
        RunEvent(
            event_id=derive_id(view.run_id, f"await/{item.tool_use_id}"),
            occurred_at=at,
            type=StreamEventType(item.kind.value),
            event_key=suspend_key(item.tool_use_id),
            run_id=view.run_id,
            session_id=view.session_id,
            timestamp=at,
            payload={
                "tool_use_id": item.tool_use_id,
                "tool_name": item.tool_name,
                "prompt": item.prompt,
                "details": item.details,
            },
        )
        for item in pending
    ]
