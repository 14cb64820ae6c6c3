"""`decide`: a run's view and its trigger in, the one next step out."""

from __future__ import annotations

from datetime import datetime

from quipu.contracts.events import RUN_PHASE_CHANGED, RunPhase
from quipu.contracts.lifecycle import (
    Failure,
    canonical_json,
    encode_cancellation_intent,
    encode_run_completed,
)
from quipu.contracts.store import CancellationReason, LifecycleType, Record, RunStatus
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED, Message, ToolResultPart, encode_messages
from quipu.services.planner.logic.actions import (
    Action,
    Append,
    CallModel,
    Closed,
    Dispatch,
    Finish,
    Intend,
    Trigger,
    Wait,
)
from quipu.services.planner.logic.keys import (
    BUDGET_EXHAUSTED,
    CANCEL_KEY,
    CANCELED_KEY,
    COMPLETED_KEY,
    FAILED_KEY,
    INPUT_REQUIRED,
    phase_key,
    tool_results_key,
)
from quipu.services.planner.logic.run_end import closed_outputs
from quipu.services.planner.logic.tool_results import pending_input, suspension, tool_results_message
from quipu.services.planner.logic.view import RunView


def decide(view: RunView, trigger: Trigger, dispatched_step: int = 0) -> Action:
    """The next step of the run `view` describes.

    `dispatched_step` is a step whose tool uses this pass has already sent; a tool result's
    trigger marks its own group as sent, so pending calls are republished only by a redelivered
    request or cancel, never by every arriving result.
    """
    if view.closed:
        return Closed(closed_outputs(view))
    if view.cancel_reason:
        return _finish(view, trigger, canceled=view.cancel_reason)
    if view.session_ended:
        reason = CancellationReason.SESSION_ENDED
        return Intend(
            view.record(
                CANCEL_KEY,
                LifecycleType.CANCELLATION_INTENT.value,
                encode_cancellation_intent(reason),
                trigger.at,
            )
        )
    if view.context is None or not view.has_input or not view.messages:
        return Wait("the run's input is not recorded yet")
    last = view.messages[-1]
    if last.role == "assistant":
        return _after_assistant(view, trigger, dispatched_step)
    return _before_model(view, trigger)


def _after_assistant(view: RunView, trigger: Trigger, dispatched_step: int) -> Action:
    uses = view.last_tool_uses()
    if not uses:
        return _finish(view, trigger)
    step = view.step
    if phase_key(step, RunPhase.EXECUTING_TOOLS) not in view.keys:
        return Append(phase_record(view, step, RunPhase.EXECUTING_TOOLS, trigger.at))
    missing = [use for use in uses if use.id not in view.results]
    if missing:
        if dispatched_step == step or trigger.result_for in {use.id for use in uses}:
            return Wait(f"{len(missing)} tool result(s) pending")
        return Dispatch(step, missing)
    pending = [
        pending_input(use, view.results[use.id]) for use in uses if view.results[use.id].awaiting is not None
    ]
    if pending:
        if not view.session_id:
            names = ", ".join(item.tool_name for item in pending)
            return _finish(
                view,
                trigger,
                failure=Failure(
                    message=f"{names} needs outside input, but a run without a session cannot be continued",
                    kind=INPUT_REQUIRED,
                    retryable=False,
                ),
            )
        return suspension(view, step, pending, trigger.at)
    return Append(
        view.record(
            tool_results_key(step),
            TRANSCRIPT_MESSAGES_APPENDED,
            encode_messages([tool_results_message(uses, view.results)]),
            trigger.at,
        )
    )


def _before_model(view: RunView, trigger: Trigger) -> Action:
    assert view.context is not None
    step = view.step + 1
    if step > view.context.max_steps:
        return _finish(
            view,
            trigger,
            failure=Failure(
                message=f"step budget exhausted: {view.context.max_steps} model calls",
                kind=BUDGET_EXHAUSTED,
                retryable=False,
            ),
        )
    if view.output_tokens >= view.context.max_output_tokens:
        return _finish(
            view,
            trigger,
            failure=Failure(
                message=(
                    f"output-token budget exhausted: {view.output_tokens} of "
                    f"{view.context.max_output_tokens} tokens used"
                ),
                kind=BUDGET_EXHAUSTED,
                retryable=False,
            ),
        )
    phase = RunPhase.SYNTHESIZING if _has_tool_results(view.messages[-1]) else RunPhase.PLANNING
    if phase_key(step, phase) not in view.keys:
        return Append(phase_record(view, step, phase, trigger.at))
    return CallModel(step)


def _has_tool_results(message: Message) -> bool:
    return any(isinstance(part, ToolResultPart) for part in message.parts)


def phase_record(view: RunView, step: int, phase: RunPhase, at: datetime) -> Record:
    """`run_phase_changed {phase}` around model call `step`."""
    return view.record(phase_key(step, phase), RUN_PHASE_CHANGED, canonical_json({"phase": phase.value}), at)


def _finish(view: RunView, trigger: Trigger, *, failure: Failure | None = None, canceled: str = "") -> Finish:
    if canceled:
        key, payload = CANCELED_KEY, encode_run_completed(RunStatus.CANCELED, view.labels, None, canceled)
    elif failure is not None:
        key, payload = FAILED_KEY, encode_run_completed(RunStatus.FAILED, view.labels, failure)
    else:
        key, payload = COMPLETED_KEY, encode_run_completed(RunStatus.COMPLETED, view.labels)
    return Finish(view.record(key, LifecycleType.RUN_COMPLETED.value, payload, trigger.at))


def failure_finish(view: RunView, trigger: Trigger, failure: Failure) -> Finish:
    """Close the run as failed."""
    return _finish(view, trigger, failure=failure)


def before_first_call(started: Record, first: list[Record], trigger: Trigger) -> list[Record]:
    """`first` and what a new run's pass appends to it before its first model call (its phase):
    a start carries them all, so the start and the run's first step are one write."""
    view = RunView.of([started, *first])
    assert view is not None  # `started` is the run_started record
    records = list(first)
    for _ in range(_APPENDS_BEFORE_A_CALL):
        action = decide(view, trigger)
        if not isinstance(action, Append):
            break
        view.add(action.record)
        records.append(action.record)
    return records


_APPENDS_BEFORE_A_CALL = 4
"""More than a new run's pass appends before its first model call (one phase today)."""
