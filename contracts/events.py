"""Run phases and the stream events of `runs.events` (STORE_CONTRACT §11)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.wire import Timestamp


class RunPhase(StrEnum):
    """Phases a run goes through; the last four are terminal or closing."""

    PROMPTED = "prompted"
    PLANNING = "planning"
    EXECUTING_TOOLS = "executing_tools"
    SYNTHESIZING = "synthesizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    SUSPENDED = "suspended"

    @property
    def terminal(self) -> bool:
        """Whether a `workflow` event for this phase ends the run's stream."""
        return self in (RunPhase.COMPLETED, RunPhase.FAILED, RunPhase.CANCELED, RunPhase.SUSPENDED)


RUN_PHASE_CHANGED = "run_phase_changed"
"""Ordinary record type carrying `{phase}`."""


class StreamEventType(StrEnum):
    """Types of the events UIs receive on `runs.events`."""

    PLANNER_THOUGHT = "planner_thought"
    PROMPT_RENDERED = "prompt_rendered"
    TOOL_START = "tool_start"
    TOOL_END = "tool_end"
    """A tool use got its result (payload: tool_use_id, tool_name, is_error, result capped at
    `EVENT_VALUE_MAX_BYTES`, duration_ms, and `awaiting` when the tool waits for outside input)."""
    TOOL_UPDATE = "tool_update"
    TOOL_CALL_ARGS_DELTA = "tool_call_args_delta"
    TOOL_OUTPUT_DELTA = "tool_output_delta"
    ASSISTANT_REPLY = "assistant_reply"
    ASSISTANT_TURN = "assistant_turn"
    AWAIT_CLARIFICATION = "await_clarification"
    AWAIT_CONFIRMATION = "await_confirmation"
    AWAIT_QUESTIONS = "await_questions"
    AWAIT_EXTERNAL_TOOLS = "await_external_tools"
    TOOL_AUTHORIZATION = "tool_authorization"
    USAGE = "usage"
    WORKFLOW = "workflow"
    CHILD_RUN_LINKED = "child_run_linked"
    SESSION_STREAM_STARTED = "session_stream_started"
    SESSION_STREAM_END = "session_stream_end"
    RUN_STREAM_END = "run_stream_end"
    HISTORY_COMPACTED = "history_compacted"
    """A model call overflowed its request budget: the oldest history turns were compacted into the
    request's summary block (payload: step, dropped_turns, tokens_before, tokens_after)."""


EVENT_VALUE_MAX_BYTES = 4096
"""Largest value (as compact JSON) an event carries inline, such as a tool's result; a larger one is
replaced by a preview (the run's records keep the whole value: `GET /v1/runs/{id}/records`)."""


def capped_value(value: Any, limit: int = EVENT_VALUE_MAX_BYTES) -> Any:
    """`value` when its compact JSON fits in `limit` bytes, else
    `{"omitted": true, "reason": "size_limit", "bytes": <size>, "preview": <its JSON, cut>}`."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size <= limit:
        return value
    preview = text.encode("utf-8")[: limit // 2].decode("utf-8", errors="ignore")
    return {"omitted": True, "reason": "size_limit", "bytes": size, "preview": preview}


class RunEvent(Envelope):
    """One live event of a run; consumers de-duplicate on (run_id, type, event_key)."""

    type: StreamEventType = Field(description="What happened.")
    event_key: str = Field(description="The record's key, or a deterministic delta key.")
    run_id: str = Field(description="Run the event belongs to.")
    session_id: str = Field(default="", description="Session of the run; the partition key.")
    timestamp: Timestamp = Field(description="When it happened (the record's timestamp when it has one).")
    payload: dict[str, Any] = Field(default_factory=dict, description="Type-specific JSON object.")
    server_data: dict[str, Any] | None = Field(
        default=None, description="Server-side extras for UIs (never secrets)."
    )

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"payload", "server_data"})
    """What a run said or a tool returned lives in the payload; type, keys and ids stay in clear."""

    def dedup_key(self) -> tuple[str, str, str]:
        """The identity consumers de-duplicate on."""
        return (self.run_id, self.type.value, self.event_key)
