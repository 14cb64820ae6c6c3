"""What the end of a run publishes, and the end a request refused before its run started sends."""

from __future__ import annotations

import json
from datetime import datetime

from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.lifecycle import RunCompletedPayload
from quipu.contracts.runs import CancelRun, ParentToolCall, RunRequested, TurnCompleted
from quipu.contracts.store import CancellationReason, RunStatus
from quipu.contracts.tools import ToolCallCompleted
from quipu.services.planner.logic.actions import Output
from quipu.services.planner.logic.keys import STOPPED_KEY
from quipu.services.planner.logic.tool_results import await_events, pending_input
from quipu.services.planner.logic.view import RunView, final_text, user_text


def closed_outputs(view: RunView) -> list[Output]:
    """What the close of a run published, rebuilt from its records (for redelivery)."""
    if view.terminal is not None and view.terminal_time is not None:
        if STOPPED_KEY in view.keys:
            return []  # a stop start: the owner streamed its end; nothing ran, nobody waits
        return end_outputs(view, view.terminal, view.terminal_time)
    if view.suspended_time is not None:
        uses = view.last_tool_uses()
        pending = [
            pending_input(use, view.results[use.id])
            for use in uses
            if use.id in view.results and view.results[use.id].awaiting is not None
        ]
        return await_events(view, pending, view.suspended_time)
    return []


def end_outputs(view: RunView, terminal: RunCompletedPayload, at: datetime) -> list[Output]:
    """What the end of a run tells others: the parent's tool result, the finished turn, child cancels."""
    outputs: list[Output] = []
    if terminal.run_status is RunStatus.CANCELED:
        outputs += cancel_children(view, terminal.cancellation_reason, at)
    parent = view.context.parent if view.context is not None else None
    if parent is not None:
        outputs.append(parent_result(view, parent, terminal, at))
    elif terminal.run_status is RunStatus.COMPLETED and view.session_id and not view.parent_run_id:
        outputs.append(
            TurnCompleted(
                event_id=derive_id(view.run_id, "turn"),
                occurred_at=at,
                tenant_id=view.context.tenant_id if view.context is not None else "",
                correlation_id=view.run_id,
                session_id=view.session_id,
                run_id=view.run_id,
                agent_id=view.agent_id,
                principal_id=view.context.principal_id if view.context is not None else "",
                user_text=user_text(view.messages),
                assistant_text=final_text(view.messages),
            )
        )
    return outputs


def cancel_children(view: RunView, reason: str, at: datetime) -> list[Output]:
    """CancelRun for every child whose result has not arrived (a finished child ignores it)."""
    return [
        CancelRun(
            event_id=derive_id(view.run_id, f"cancel/{child}"),
            occurred_at=at,
            causation_id=view.run_id,
            run_id=child,
            session_id=view.session_id,
            reason=CancellationReason(reason),
        )
        for tool_call_id, children in view.children.items()
        if tool_call_id not in view.results
        for child in children
    ]


def parent_result(
    view: RunView, parent: ParentToolCall, terminal: RunCompletedPayload, at: datetime
) -> ToolCallCompleted:
    """The child's end as the result of the parent's tool use."""
    if terminal.run_status is RunStatus.COMPLETED:
        content, is_error = final_text(view.messages), False
    elif terminal.run_status is RunStatus.FAILED:
        message = terminal.failure.message if terminal.failure is not None else "failed"
        content, is_error = f"{view.agent_id} failed: {message}", True
    else:
        content, is_error = f"{view.agent_id} was canceled ({terminal.cancellation_reason})", True
    return ToolCallCompleted(
        event_id=derive_id(view.run_id, "parent-result"),
        occurred_at=at,
        correlation_id=parent.parent_run_id,
        causation_id=view.run_id,
        run_id=parent.parent_run_id,
        session_id=view.session_id,
        agent_id=parent.parent_agent_id,
        tool_use_id=parent.tool_call_id,
        tool_name=parent.tool_name,
        content=content,
        is_error=is_error,
    )


def child_not_started(request: RunRequested, why: str) -> ToolCallCompleted | None:
    """The parent's tool result when its child could not run (session ended, parent closed)."""
    parent = request.parent
    if parent is None:
        return None
    return ToolCallCompleted(
        event_id=derive_id(request.run_id, "parent-result"),
        occurred_at=request.occurred_at,
        correlation_id=parent.parent_run_id,
        causation_id=request.event_id,
        run_id=parent.parent_run_id,
        session_id=request.session_id,
        agent_id=parent.parent_agent_id,
        tool_use_id=parent.tool_call_id,
        tool_name=parent.tool_name,
        content=f"{request.agent_id} did not run: {why}",
        is_error=True,
    )


REFUSED_KEY = "refused"
"""Event key of the terminal events of a request refused before its run could start."""


def refusal_events(run_id: str, session_id: str, code: str, message: str, at: datetime) -> list[RunEvent]:
    """The end a request refused before any run started sends its stream: a failed `workflow`
    with the typed reason (`failure.kind` is the code), then `run_stream_end`, as a run that failed
    would. Ids derive from the run, so a refused redelivery repeats them."""
    workflow = {
        "phase": RunPhase.FAILED.value,
        "status": "failed",
        "failure": {"message": message, "kind": code, "retryable": False},
    }
    return [
        RunEvent(
            event_id=derive_id(run_id, f"{type_.value}/{key}"),
            occurred_at=at,
            type=type_,
            event_key=key,
            run_id=run_id,
            session_id=session_id,
            timestamp=at,
            payload=payload,
        )
        for type_, key, payload in (
            (StreamEventType.WORKFLOW, REFUSED_KEY, workflow),
            (StreamEventType.RUN_STREAM_END, f"{REFUSED_KEY}/end", {}),
        )
    ]


def refused_target(body: bytes) -> tuple[str, str] | None:
    """(run id, session id) of a request that does not validate, when its JSON names a run."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    run_id, session_id = value.get("run_id"), value.get("session_id", "")
    if not isinstance(run_id, str) or not run_id or not isinstance(session_id, str):
        return None
    return run_id, session_id
