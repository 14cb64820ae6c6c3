"""Pure logic of the storage owner: which messages follow a committed store or memory command.

Events are derived from the command and its result, so an exact retry (inserted=false) yields the
same events with the same keys again; consumers de-duplicate on (run_id, type, event_key), and
memory events on their `event_id` (derived from the turn, or recorded with the fact changes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from quipu.contracts.commands import (
    REPLY_PARTITION_HEADER,
    REPLY_TO_HEADER,
    AppendRunRecord,
    AppendRunRecords,
    DispatchedCall,
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
from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import ErrorCode, StoreError, StoreRefusedError
from quipu.contracts.events import RUN_PHASE_CHANGED, RunEvent, RunPhase, StreamEventType, capped_value
from quipu.contracts.lifecycle import decode_run_completed
from quipu.contracts.memory import FactChanged, HistoryAppendResult, HistoryRecorded
from quipu.contracts.memory_commands import AppendHistoryTurn, ApplyFactOperations, DeleteFact
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import (
    AppendResult,
    CancellationReason,
    Record,
    StartOutcome,
    StartResult,
)
from quipu.contracts.store_operation import Backend
from quipu.contracts.tools import TOOL_RESULT_RECORD
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.session_claims import SessionClaimRule
from quipu.services.domain.store.protocol import Store

Announcement = RunEvent | HistoryRecorded | FactChanged | DispatchedCall
"""A message published once the command's effect is committed (its topic and key: the registry; a
tool call's topic: its toolset's, by the deployment's naming)."""


def _event(record: Record, type_: StreamEventType, payload: dict[str, Any], key: str = "") -> RunEvent:
    event_key = key or record.event_key
    return RunEvent(
        # Derived, so a republished event (an exact retry) carries the same id as the first.
        event_id=derive_id(record.run_id, f"{type_.value}/{event_key}"),
        type=type_,
        event_key=event_key,
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
    if result.decision is StartOutcome.PROCEED:
        events += _step_events(command.records)  # the run's first records, written with its start
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


def _tool_end(record: Record) -> RunEvent:
    """What a tool returned, as the run recorded it: the result capped, with its duration."""
    value = json.loads(record.payload)
    if not isinstance(value, dict):
        raise ValueError("a tool result is a JSON object")
    payload: dict[str, Any] = {
        "tool_use_id": value.get("tool_use_id", ""),
        "tool_name": value.get("tool_name", ""),
        "is_error": bool(value.get("is_error", False)),
        "result": capped_value(value.get("content")),
        "duration_ms": value.get("duration_ms", 0),
    }
    if value.get("awaiting"):
        payload["awaiting"] = capped_value(value["awaiting"])
    return _event(record, StreamEventType.TOOL_END, payload)


def _append_events(record: Record) -> list[RunEvent]:
    if record.type == TOOL_RESULT_RECORD:
        return [_tool_end(record)]
    if record.type == RUN_PHASE_CHANGED:
        phase = json.loads(record.payload).get("phase", "")
        if phase in RunPhase.__members__.values() and not RunPhase(phase).terminal:
            return [_event(record, StreamEventType.WORKFLOW, {"phase": phase})]
    if record.type == TRANSCRIPT_MESSAGES_APPENDED:
        events: list[RunEvent] = []
        for index, message in enumerate(json.loads(record.payload)):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            key = f"{record.event_key}/{index}"
            events.append(_event(record, StreamEventType.ASSISTANT_TURN, {"message": message}, key=key))
            usage = (message.get("meta") or {}).get("usage")
            if isinstance(usage, dict):
                # The tokens of the model call that produced the message (the planner puts them there).
                events.append(_event(record, StreamEventType.USAGE, usage, key=key))
        return events
    return []


def events_after_commit(command: StoreOperation, result: object) -> list[RunEvent]:
    """The stream events that a committed command (or its exact retry) makes visible."""
    if isinstance(command, StartRootRun | StartChildRun | StartOneShotRun | StartOneShotChildRun):
        assert isinstance(result, StartResult)
        return _start_events(command, result)
    if isinstance(command, RecordRunTerminal):
        return _step_events(command.records) + _terminal_events(command.record)
    if isinstance(command, RecordRunSuspension):
        return _closing(command.record, {"phase": RunPhase.SUSPENDED.value, "status": "suspended"})
    if isinstance(command, AppendRunRecord):
        return _step_events([command.record])
    if isinstance(command, AppendRunRecords):
        return _step_events(command.records)
    return []


def _step_events(records: Sequence[Record]) -> list[RunEvent]:
    """The events of a step's ordinary records, in the records' order."""
    events: list[RunEvent] = []
    for record in records:
        try:
            events += _append_events(record)
        except ValueError:
            # Ordinary payloads are not parsed by the store; a payload the UI cannot read gets no event.
            continue
    return events


def memory_events_after_commit(command: StoreOperation, result: object) -> Sequence[Announcement]:
    """What a committed memory command (or its exact retry) announces.

    A recorded turn: `HistoryRecorded` on history.recorded, keyed by session, with an id derived
    from the turn (memory_opt_out stays false: the recorder, which knows the agent, decides it).
    Fact changes: each `FactChanged` on memory.changes, keyed by principal; a retry returns the
    recorded changes, so their ids repeat.
    """
    if isinstance(command, AppendHistoryTurn):
        assert isinstance(result, HistoryAppendResult)
        turn = command.turn
        recorded = HistoryRecorded(
            event_id=derive_id(f"{turn.session_id}/{turn.turn_id}", "history-recorded"),
            tenant_id=turn.scope.tenant_id,
            correlation_id=command.correlation_id,
            causation_id=command.event_id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            scope=turn.scope,
            first_seq=result.first_seq,
            last_seq=result.last_seq,
        )
        return [recorded]
    changes: list[FactChanged] = []
    if isinstance(command, ApplyFactOperations):
        assert isinstance(result, list)
        changes = result
    elif isinstance(command, DeleteFact):
        assert isinstance(result, FactChanged)
        changes = [result]
    return [change.model_copy(update=_sealed_for(change)) for change in changes]


def _sealed_for(change: FactChanged) -> dict[str, SealedFor]:
    """A fact's words are sealed under the key of the principal they are about."""
    return {"sealed_for": SealedFor(tenant_id=change.scope.tenant_id, principal_id=change.scope.principal_id)}


async def apply_command(
    store: Store, command: StoreOperation, memory: MemoryStore | None = None
) -> tuple[StoreReply, Sequence[Announcement]]:
    """Apply one command to its backend; a contract error becomes the reply, UNAVAILABLE propagates."""
    memory_command = command.backend is not Backend.RUNTIME
    try:
        _check_carried_calls(command)
        result = await getattr(backend_of(command, store, memory), command.method)(**command.arguments())
    except StoreRefusedError as error:
        return StoreReply(correlation_id=command.correlation_id, op=command.op, error=error.to_body()), []
    # What a sealed command carried is sealed again under the same key on the way back and out.
    whose = command.sealed_for
    reply = StoreReply(
        correlation_id=command.correlation_id, op=command.op, result=encode_result(result), sealed_for=whose
    )
    if memory_command:
        return reply, memory_events_after_commit(command, result)
    return reply, [sealed_as(message, whose) for message in calls_after_commit(command, result)] + [
        sealed_as(event, whose) for event in events_after_commit(command, result)
    ]


def backend_of(command: StoreOperation, store: Store, memory: MemoryStore | None) -> object:
    """What applies `command`: the runtime store, the memory store, or the rule over both
    (UNAVAILABLE when it needs a memory store this owner does not serve)."""
    if command.backend is Backend.RUNTIME:
        return store
    if memory is None:
        raise StoreError(ErrorCode.UNAVAILABLE, "this storage owner serves no memory store")
    return memory if command.backend is Backend.MEMORY else SessionClaimRule(store, memory)


def _check_carried_calls(command: StoreOperation) -> None:
    """A step may only have calls of its own run published (INVALID_ARGUMENT before anything is
    applied): what the owner publishes for a command is justified by that command's records."""
    if not isinstance(command, AppendRunRecords) or not command.records:
        return
    first = command.records[0]
    for carried in command.calls:
        call = carried.call
        if (call.run_id, call.session_id, call.agent_id) != (first.run_id, first.session_id, first.agent_id):
            raise StoreRefusedError(
                ErrorCode.INVALID_ARGUMENT, "a carried tool call must belong to the run of the step's records"
            )


def calls_after_commit(command: StoreOperation, result: object) -> list[DispatchedCall]:
    """The tool calls a committed step (or its exact retry) carries for the owner to publish.

    A call is not stored: the records that justify it are. A retry carries what the planner derived
    again from the same records, so the calls repeat with the same ids (at-least-once, idempotent).
    None in an ended session: the step stands (a running run may still write), but its run is
    closed by the planner, told by the result's `session_status`, and runs no tool.
    """
    if not isinstance(command, AppendRunRecords) or _in_ended_session(result):
        return []
    return list(command.calls)


def _in_ended_session(result: object) -> bool:
    results = result if isinstance(result, list) else [result]
    return any(isinstance(each, AppendResult) and each.in_ended_session for each in results)


_Sealable = TypeVar("_Sealable", bound=RunEvent | DispatchedCall)


def sealed_as(message: _Sealable, whose: SealedFor | None) -> _Sealable:
    """`message` sealed under `whose` (a carried call: the call itself)."""
    if isinstance(message, DispatchedCall):
        return message.model_copy(update={"call": message.call.model_copy(update={"sealed_for": whose})})
    return message.model_copy(update={"sealed_for": whose})


def correlation_of(body: bytes) -> str:
    """The correlation id of a command that failed validation, when it can be read at all."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    correlation_id = value.get("correlation_id") if isinstance(value, dict) else None
    return correlation_id if isinstance(correlation_id, str) else ""


_PARTITION_NUMBER = re.compile(r"0|[1-9][0-9]{0,5}")


def reply_partition(headers: Mapping[str, Any], replies_topic: str, partitions: int) -> int | None:
    """The partition of the owner's replies topic a command's reply goes to (None: any partition).

    The topic is never the message's to choose: `replies_topic` comes from the owner's settings.
    `quipu-reply-to`, sent by older clients, may only repeat that very name. A route that names
    another topic, or a partition the topic does not have, is INVALID_ARGUMENT (nothing applied);
    the messages name the rule, never the header's value.
    """
    named_topic = headers.get(REPLY_TO_HEADER)
    if named_topic is not None and named_topic != replies_topic:
        raise StoreError(
            ErrorCode.INVALID_ARGUMENT,
            f"{REPLY_TO_HEADER} may only name this deployment's replies topic; "
            f"route a reply with {REPLY_PARTITION_HEADER}",
        )
    route = headers.get(REPLY_PARTITION_HEADER)
    if route is None:
        return None
    if not isinstance(route, str) or not _PARTITION_NUMBER.fullmatch(route) or int(route) >= partitions:
        raise StoreError(
            ErrorCode.INVALID_ARGUMENT,
            f"{REPLY_PARTITION_HEADER} must be a partition number of the replies topic (0..{partitions - 1})",
        )
    return int(route)
