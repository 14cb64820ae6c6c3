"""The planner's own record payloads and their canonical JSON: context, compaction, tool result,
suspension checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from quipu.contracts.lifecycle import canonical_json
from quipu.contracts.runs import ParentToolCall
from quipu.contracts.tools import AwaitInput, AwaitKind, ToolCallCompleted
from quipu.contracts.transcript import decode_json_value, encode_json_value
from quipu.services.planner.logic.keys import CHECKPOINT_VERSION


@dataclass(frozen=True)
class RunContext:
    """What every later step of a run needs from its request (the `context` record)."""

    principal_id: str
    max_steps: int
    max_output_tokens: int
    parent: ParentToolCall | None = None
    tenant_id: str = ""

    def encode(self) -> bytes:
        """Canonical JSON: the same request always gives the same bytes."""
        value: dict[str, Any] = {
            "principal_id": self.principal_id,
            "max_steps": self.max_steps,
            "max_output_tokens": self.max_output_tokens,
        }
        if self.tenant_id:
            value["tenant_id"] = self.tenant_id
        if self.parent is not None:
            value["parent"] = {
                "parent_run_id": self.parent.parent_run_id,
                "parent_agent_id": self.parent.parent_agent_id,
                "tool_call_id": self.parent.tool_call_id,
                "tool_name": self.parent.tool_name,
            }
        return canonical_json(value)

    @classmethod
    def decode(cls, payload: bytes) -> RunContext:
        """Read a `context` record's payload."""
        value = json.loads(payload)
        parent = value.get("parent")
        return cls(
            principal_id=str(value.get("principal_id", "")),
            max_steps=int(value["max_steps"]),
            max_output_tokens=int(value["max_output_tokens"]),
            parent=ParentToolCall.model_validate(parent) if parent else None,
            tenant_id=str(value.get("tenant_id", "")),
        )


@dataclass(frozen=True)
class Compaction:
    """History dropped from a request to fit its budget, and the summary it was compacted into.

    `dropped_turns` counts from the start of the run's history (a later compaction of the same
    run includes the earlier one's turns); `summary` replaces the request's summary block.
    """

    step: int
    dropped_turns: int
    summary: str
    tokens_before: int
    tokens_after: int

    def encode(self) -> bytes:
        """Canonical JSON of the `history_compacted` record."""
        return canonical_json(
            {
                "step": self.step,
                "dropped_turns": self.dropped_turns,
                "summary": self.summary,
                "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after,
            }
        )

    @classmethod
    def decode(cls, payload: bytes) -> Compaction:
        """Read a `history_compacted` record's payload."""
        value = json.loads(payload)
        return cls(
            step=int(value["step"]),
            dropped_turns=int(value["dropped_turns"]),
            summary=str(value["summary"]),
            tokens_before=int(value["tokens_before"]),
            tokens_after=int(value["tokens_after"]),
        )


@dataclass(frozen=True)
class ToolResult:
    """One arrived tool result (the `tool-result/<id>` record)."""

    tool_use_id: str
    tool_name: str
    content: Any
    is_error: bool = False
    awaiting: AwaitInput | None = None
    duration_ms: float = 0.0

    def encode(self) -> bytes:
        """Canonical JSON with exact numbers (`encode_json_value`)."""
        value: dict[str, Any] = {
            "tool_use_id": self.tool_use_id,
            "tool_name": self.tool_name,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.awaiting is not None:
            value["awaiting"] = self.awaiting.model_dump(mode="json")
        if self.duration_ms:
            value["duration_ms"] = self.duration_ms
        return encode_json_value(value)

    @classmethod
    def decode(cls, payload: bytes, where: str) -> ToolResult:
        """Read a `tool-result/<id>` record's payload."""
        value = decode_json_value(payload, where)
        awaiting = value.get("awaiting")
        return cls(
            tool_use_id=value["tool_use_id"],
            tool_name=value["tool_name"],
            content=value.get("content"),
            is_error=bool(value.get("is_error", False)),
            awaiting=AwaitInput.model_validate(awaiting) if awaiting else None,
            duration_ms=float(value.get("duration_ms", 0.0)),
        )

    @classmethod
    def of(cls, completed: ToolCallCompleted) -> ToolResult:
        """The result a ToolCallCompleted brings."""
        return cls(
            tool_use_id=completed.tool_use_id,
            tool_name=completed.tool_name,
            content=completed.content,
            is_error=completed.is_error,
            awaiting=completed.awaiting,
            duration_ms=completed.duration_ms,
        )


@dataclass(frozen=True)
class PendingInput:
    """A tool use that waits for outside input, as the checkpoint keeps it."""

    tool_use_id: str
    tool_name: str
    kind: AwaitKind
    prompt: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SuspensionCheckpoint:
    """The private resume state of a suspended run: the step and the tool uses that wait."""

    step: int
    pending: tuple[PendingInput, ...]

    def encode(self) -> bytes:
        """JSON bytes; the first pending use is repeated at the top for a quick look."""
        first = self.pending[0]
        return canonical_json(
            {
                "version": CHECKPOINT_VERSION,
                "step": self.step,
                "tool_use_id": first.tool_use_id,
                "tool_name": first.tool_name,
                "prompt": first.prompt,
                "pending": [
                    {
                        "tool_use_id": item.tool_use_id,
                        "tool_name": item.tool_name,
                        "kind": item.kind.value,
                        "prompt": item.prompt,
                        "details": item.details,
                    }
                    for item in self.pending
                ],
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> SuspensionCheckpoint:
        """Read a checkpoint written by `encode`."""
        value = json.loads(data)
        return cls(
            step=int(value["step"]),
            pending=tuple(
                PendingInput(
                    tool_use_id=item["tool_use_id"],
                    tool_name=item["tool_name"],
                    kind=AwaitKind(item["kind"]),
                    prompt=item["prompt"],
                    details=dict(item.get("details") or {}),
                )
                for item in value["pending"]
            ),
        )
