"""Pure logic of the storage owner: which stream events follow a committed store command.

Events are derived from the command and its result, so an exact retry (inserted=false) yields the
same events with the same keys again; consumers de-duplicate on (run_id, type, event_key).
"""

from __future__ import annotations

import json
from typing import Any

from contracts.commands import (
    AppendRunRecord,
    RecordRunSuspension,
    RecordRunTerminal,
    StartChildRun,
    StartOneShotChildRun,
    StartOneShotRun,
    StartRootRun,
    StoreOperation,
    StoreReply,
    encode_result,
)
from contracts.errors import StoreError
from contracts.events import RUN_PHASE_CHANGED, RunEvent, RunPhase, StreamEventType
from contracts.lifecycle import decode_run_completed
from contracts.store import CancellationReason, Record, StartOutcome, StartResult
from contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from services.kit.store.protocol import Store


def _event(record: Record, type_: StreamEventType, payload: dict[str, Any], key: str = "") -> RunEvent:
    return RunEvent(
        type=type_,
        event_key=key or record.event_key,
        run_id=record.run_id,
        session_id=record.session_id,
        timestamp=record.timestamp,
        payload=payload,
        occurred_at=record.timestamp,
    )


def _closing(record: Record, workflow: dict[str, Any]) -> list[RunEvent]:
    """A terminal `workflow` followed by `run_stream_end`."""
    return [
        _event(record, StreamEventType.WORKFLOW, workflow),
        _event(record, StreamEventType.RUN_STREAM_END, {}, key=f"{record.event_key}/end"),
    ]


def _terminal_events(record: Record) -> list[RunEvent]:
    payload = decode_run_completed(record.payload)
    workflow: dict[str, Any] = {"phase": payload.phase, "status": payload.status}
    if payload.failure is not None:
        workflow["failure"] = {
            "message": payload.failure.message,
            "kind": payload.failure.kind,
            "retryable": payload.failure.retryable,
        }
    if payload.cancellation_reason:
        workflow["cancellation"] = {"reason": payload.cancellation_reason}
    return _closing(record, workflow)


def _start_events(
    command: StartRootRun | StartChildRun | StartOneShotRun | StartOneShotChildRun,
    result: StartResult,
) -> list[RunEvent]:
    events: list[RunEvent] = []
    parent_link = getattr(command, "parent_link", None)
    if isinstance(parent_link, Record):
        events.append(_event(parent_link, StreamEventType.CHILD_RUN_LINKED, json.loads(parent_link.payload)))
    stopped = getattr(command, "stopped", None)
    if result.decision is StartOutcome.STOP and isinstance(stopped, Record):
        events += _closing(
            stopped,
            {
                "phase": RunPhase.CANCELED.value,
                "status": "canceled",
                "cancellation": {"reason": CancellationReason.SESSION_ENDED.value},
            },
        )
    return events


def _append_events(record: Record) -> list[RunEvent]:
    if record.type == RUN_PHASE_CHANGED:
        phase = json.loads(record.payload).get("phase", "")
        if phase in RunPhase.__members__.values() and not RunPhase(phase).terminal:
            return [_event(record, StreamEventType.WORKFLOW, {"phase": phase})]
    if record.type == TRANSCRIPT_MESSAGES_APPENDED:
        return [
            _event(
                record,
                StreamEventType.ASSISTANT_TURN,
                {"message": message},
                key=f"{record.event_key}/{index}",
            )
            for index, message in enumerate(json.loads(record.payload))
            if isinstance(message, dict) and message.get("role") == "assistant"
        ]
    return []


def events_after_commit(command: StoreOperation, result: object) -> list[RunEvent]:
    """The stream events that a committed command (or its exact retry) makes visible."""
    if isinstance(command, StartRootRun | StartChildRun | StartOneShotRun | StartOneShotChildRun):
        assert isinstance(result, StartResult)
        return _start_events(command, result)
    if isinstance(command, RecordRunTerminal):
        return _terminal_events(command.record)
    if isinstance(command, RecordRunSuspension):
        return _closing(command.record, {"phase": RunPhase.SUSPENDED.value, "status": "suspended"})
    if isinstance(command, AppendRunRecord):
        try:
            return _append_events(command.record)
        except ValueError:
            # Ordinary payloads are not parsed by the store; a payload the UI cannot read gets no event.
            return []
    return []


async def apply_command(store: Store, command: StoreOperation) -> tuple[StoreReply, list[RunEvent]]:
    """Apply one command; a contract error becomes the reply, UNAVAILABLE propagates for a retry."""
    try:
        result = await getattr(store, command.method)(**command.arguments())
    except StoreError as error:
        if error.retryable:
            raise
        return StoreReply(correlation_id=command.correlation_id, op=command.op, error=error.to_body()), []
    reply = StoreReply(correlation_id=command.correlation_id, op=command.op, result=encode_result(result))
    return reply, events_after_commit(command, result)


def correlation_of(body: bytes) -> str:
    """The correlation id of a command that failed validation, when it can be read at all."""
    try:
        value = json.loads(body)
    except ValueError:
        return ""
    correlation_id = value.get("correlation_id") if isinstance(value, dict) else None
    return correlation_id if isinstance(correlation_id, str) else ""
