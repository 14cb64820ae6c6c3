"""The planner's pure decisions: a run's records in, the next step out.

A run is a state machine whose state is its run log. `RunView` folds the records into what the
decisions need (transcript, step, tool results, links, cancellation, terminal); `decide` looks at
a view and names the one next step as a small typed value; the builders turn steps into records
and topic messages. Nothing here touches a broker, a store or a model: `adapters.Planner` runs the
steps and feeds the records it wrote back into the view.

Determinism is what makes redelivery harmless: every record key is derived from the run and the
step, every record written for a message carries that message's `occurred_at`, and every output
message id is derived from the run id and the step, so a replayed trigger rewrites identical
records (exact retries) and republishes identical messages.

Record keys (per run; the store makes `(run_id, event_key)` unique):

| key | type | written when |
| --- | --- | --- |
| `started`, `stopped` | run_started, run_completed | the start (the store keeps one of them) |
| `context` | planner_context | after the start: principal, budgets, the parent's tool call |
| `memory-context` | memory_context | memory a new turn's context used: fact ids and versions, summary |
| `seed` | transcript_messages_seeded | history before the run (session turns, a predecessor) |
| `input` | transcript_messages_appended | the user's text, or the answer to a suspended tool use |
| `phase/<n>/<phase>` | run_phase_changed | planning / synthesizing before call n, executing_tools after |
| `step/<n>/assistant` | transcript_messages_appended | call n's message, parts in order, usage in meta |
| `step/<n>/compacted` | history_compacted | call n overflowed its budget: oldest history turns compacted |
| `tool-result/<tool_use_id>` | tool_result | one tool result as it arrives (first one wins) |
| `step/<n>/tool-results` | transcript_messages_appended | every result of call n's tool uses, in use order |
| `child/<tool_call_id>` | child_run_linked | on the parent, by the child's start |
| `cancel` | runtime.cancellation_intent | a CancelRun |
| `suspend/<tool_use_id>` | run_suspended | a tool waits for outside input |
| `completed`, `failed`, `canceled` | run_completed | the end |
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RUN_PHASE_CHANGED, RunEvent, RunPhase, StreamEventType
from quipu.contracts.lifecycle import (
    Failure,
    RunCompletedPayload,
    canonical_json,
    decode_child_run_linked,
    decode_run_completed,
    decode_run_started,
    encode_cancellation_intent,
    encode_child_run_linked,
    encode_run_completed,
    encode_run_started,
    encode_run_suspended,
)
from quipu.contracts.runs import CancelRun, ParentToolCall, RunKind, RunRequested, TurnCompleted
from quipu.contracts.store import CancellationReason, Checkpoint, LifecycleType, Record, RunStart, RunStatus
from quipu.contracts.tools import (
    TOOL_RESULT_RECORD,
    AwaitInput,
    AwaitKind,
    ToolCallCompleted,
    ToolCallRequested,
)
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_APPENDED,
    TRANSCRIPT_MESSAGES_SEEDED,
    Message,
    TextPart,
    ToolResultPart,
    ToolUsePart,
    TranscriptError,
    bounded_tool_result,
    decode_json_value,
    decode_messages,
    encode_json_value,
    encode_messages,
)
from quipu.services.domain.agents import AgentSpec
from quipu.services.domain.memory.context import ContextBlocks
from quipu.services.domain.memory.summary import summary_block, summary_of_block
from quipu.services.domain.models.port import ModelRequest, ModelResponse, ToolSpec

# --- record types and keys -----------------------------------------------------------------------

CONTEXT_TYPE = "planner_context"
"""Ordinary record (key `context`): principal, budgets and the parent's tool call of a run."""

TOOL_RESULT_TYPE = TOOL_RESULT_RECORD
"""Ordinary record (key `tool-result/<tool_use_id>`): one tool result as it arrived."""


MEMORY_CONTEXT_TYPE = "memory_context"
"""Ordinary record (key `memory-context`): the memory a turn's context used (facts, summary, window)."""

HISTORY_COMPACTED_TYPE = "history_compacted"
"""Ordinary record (key `step/<n>/compacted`): history dropped from call n and compacted into its summary."""

STARTED_KEY = "started"
STOPPED_KEY = "stopped"
CONTEXT_KEY = "context"
SEED_KEY = "seed"
MEMORY_CONTEXT_KEY = "memory-context"
INPUT_KEY = "input"
CANCEL_KEY = "cancel"
COMPLETED_KEY = "completed"
FAILED_KEY = "failed"
CANCELED_KEY = "canceled"

CHECKPOINT_VERSION = "1"
"""Version of the checkpoint JSON and of the `run_suspended` payload."""

BUDGET_EXHAUSTED = "budget_exhausted"
MODEL_ERROR = "model_error"
INVALID_TRANSCRIPT = "invalid_transcript"
INPUT_REQUIRED = "input_required"
CONTEXT_OVERFLOW = "context_overflow"
"""Failure kinds the planner writes."""


def assistant_key(step: int) -> str:
    """Key of the assistant message of model call `step`."""
    return f"step/{step}/assistant"


def tool_results_key(step: int) -> str:
    """Key of the user message answering the tool uses of call `step`."""
    return f"step/{step}/tool-results"


def compacted_key(step: int) -> str:
    """Key of the compaction that made model call `step` fit its budget."""
    return f"step/{step}/compacted"


def tool_result_key(tool_use_id: str) -> str:
    """Key of one arrived tool result."""
    return f"tool-result/{tool_use_id}"


def phase_key(step: int, phase: RunPhase) -> str:
    """Key of a phase change around model call `step`."""
    return f"phase/{step}/{phase.value}"


def suspend_key(tool_use_id: str) -> str:
    """Key of the suspension waiting for the answer to `tool_use_id`."""
    return f"suspend/{tool_use_id}"


def link_key(tool_call_id: str, child_run_id: str, continuation: bool) -> str:
    """Key of `child_run_linked` on the parent; a child's continuation gets a key of its own."""
    return f"child/{tool_call_id}/{child_run_id}" if continuation else f"child/{tool_call_id}"


def child_run_id(parent_run_id: str, tool_use_id: str) -> str:
    """The run id of the child that answers an agent-tool use: the same on every redelivery."""
    return derive_id(parent_run_id, f"child/{tool_use_id}")


def to_millisecond(value: datetime) -> datetime:
    """The store refuses sub-millisecond timestamps; a message's time is truncated, deterministically."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


# --- small payloads -----------------------------------------------------------------------------


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


# --- the run as its records say ---------------------------------------------------------------------


@dataclass
class RunView:
    """What a run's records say, folded in log order; `add` extends it with one more record."""

    run_id: str
    agent_id: str
    session_id: str
    parent_run_id: str = ""
    predecessor_run_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    messages: list[Message] = field(default_factory=list)
    step: int = 0
    step_times: dict[int, datetime] = field(default_factory=dict)
    results: dict[str, ToolResult] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    """tool_call_id -> child run ids linked on this run (a child's continuations included)."""
    context: RunContext | None = None
    cancel_reason: str = ""
    terminal: RunCompletedPayload | None = None
    terminal_time: datetime | None = None
    suspended_time: datetime | None = None
    output_tokens: int = 0
    compaction: Compaction | None = None
    """The latest compaction of the run's history (it holds for every later call too)."""
    session_ended: bool = False
    """Observed, not recorded: a store reply said the session has ended (workers stop planning)."""

    @classmethod
    def of(cls, records: Iterable[Record]) -> RunView | None:
        """Fold a run's records; None when they hold no `run_started` (not a run yet)."""
        view: RunView | None = None
        for record in records:
            if view is None:
                if record.type != LifecycleType.RUN_STARTED.value:
                    continue
                view = cls(run_id=record.run_id, agent_id=record.agent_id, session_id=record.session_id)
            view.add(record)
        return view

    def add(self, record: Record) -> None:
        """Take one more record into account (records must come in log order)."""
        self.keys.add(record.event_key)
        kind = record.type
        if kind == LifecycleType.RUN_STARTED.value:
            started = decode_run_started(record.payload)
            self.parent_run_id = started.parent_run_id
            self.predecessor_run_id = started.predecessor_run_id
            self.labels = dict(started.labels)
        elif kind in (TRANSCRIPT_MESSAGES_SEEDED, TRANSCRIPT_MESSAGES_APPENDED):
            where = f"run {record.run_id!r} record {record.event_key!r} ({kind})"
            messages = decode_messages(record.payload, where)
            self.messages.extend(messages)
            step = _assistant_step(record.event_key)
            if step:
                self.step = max(self.step, step)
                self.step_times[step] = record.timestamp
                self.output_tokens += sum(_output_tokens(message) for message in messages)
        elif kind == TOOL_RESULT_TYPE:
            result = ToolResult.decode(record.payload, f"run {record.run_id!r} {record.event_key!r}")
            self.results.setdefault(result.tool_use_id, result)
        elif kind == CONTEXT_TYPE:
            self.context = RunContext.decode(record.payload)
        elif kind == HISTORY_COMPACTED_TYPE:
            compaction = Compaction.decode(record.payload)
            if self.compaction is None or compaction.step >= self.compaction.step:
                self.compaction = compaction
        else:
            self._add_lifecycle(record)

    def _add_lifecycle(self, record: Record) -> None:
        kind = record.type
        if kind == LifecycleType.CHILD_RUN_LINKED.value:
            link = decode_child_run_linked(record.payload)
            self.children.setdefault(link.tool_call_id, []).append(link.child_run_id)
        elif kind == LifecycleType.CANCELLATION_INTENT.value:
            self.cancel_reason = json.loads(record.payload)["reason"]
        elif kind == LifecycleType.RUN_SUSPENDED.value:
            self.suspended_time = record.timestamp
        elif kind == LifecycleType.RUN_COMPLETED.value:
            self.terminal = decode_run_completed(record.payload)
            self.terminal_time = record.timestamp

    @property
    def closed(self) -> bool:
        """Suspended or final: nothing more is planned."""
        return self.terminal is not None or self.suspended_time is not None

    @property
    def has_input(self) -> bool:
        """Whether the run's input (user text or answer) is recorded."""
        return INPUT_KEY in self.keys

    def record(self, key: str, type_: str, payload: bytes, at: datetime, turn_id: str = "") -> Record:
        """A record of this run."""
        return Record(
            event_key=key,
            run_id=self.run_id,
            agent_id=self.agent_id,
            session_id=self.session_id,
            type=type_,
            turn_id=turn_id,
            payload=payload,
            timestamp=to_millisecond(at),
        )

    def last_tool_uses(self) -> list[ToolUsePart]:
        """Tool uses of the last message when it is the assistant's (the open group)."""
        if not self.messages or self.messages[-1].role != "assistant":
            return []
        return tool_uses(self.messages[-1])


def _assistant_step(event_key: str) -> int:
    parts = event_key.split("/")
    if len(parts) == 3 and parts[0] == "step" and parts[2] == "assistant" and parts[1].isdigit():
        return int(parts[1])
    return 0


def tool_uses(message: Message) -> list[ToolUsePart]:
    """The tool uses of a message, in order."""
    return [part for part in message.parts if isinstance(part, ToolUsePart)]


def text_of(message: Message) -> str:
    """The visible text of a message (its text parts, joined)."""
    return "".join(part.text for part in message.parts if isinstance(part, TextPart))


def _is_user_text(message: Message) -> bool:
    return message.role == "user" and any(isinstance(part, TextPart) for part in message.parts)


def user_text(messages: Sequence[Message]) -> str:
    """What the user said in this turn: the last user message with text (tool results have none)."""
    for message in reversed(messages):
        if _is_user_text(message):
            return text_of(message)
    return ""


def final_text(messages: Sequence[Message]) -> str:
    """The agent's answer: the text of the last message when it is the assistant's."""
    if messages and messages[-1].role == "assistant":
        return text_of(messages[-1])
    return ""


def completed_turn(messages: Sequence[Message]) -> tuple[str, str] | None:
    """(what the user said, what the agent answered) of a completed run's transcript."""
    said, answered = user_text(messages), final_text(messages)
    if not said or not answered:
        return None
    return said, answered


# --- context assembly (the port the memory services implement) ---------------------------------------


def history_window(turns: Sequence[tuple[str, str]], max_messages: int) -> list[Message]:
    """The last whole turns, as user/assistant text messages, at most `max_messages` of them."""
    keep = max(0, max_messages // 2)
    window = list(turns)[-keep:] if keep else []
    messages: list[Message] = []
    for said, answered in window:
        messages.append(Message(role="user", parts=(TextPart(text=said),)))
        messages.append(Message(role="assistant", parts=(TextPart(text=answered),)))
    return messages


def history_turns(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Index ranges `[start, end)` of the earlier turns a request may drop, oldest first.

    The history is every non-system message before the current turn's user text (the last
    user message with text: tool results carry none), cut into turns at each user text.
    """
    current = next(
        (index for index in range(len(messages) - 1, -1, -1) if _is_user_text(messages[index])), -1
    )
    starts = [index for index in range(max(current, 0)) if _is_user_text(messages[index])]
    return [(start, end) for start, end in zip(starts, [*starts[1:], current], strict=True)]


def compacted_summary_note(dropped_turns: int) -> str:
    """What a compacted summary block covers."""
    plural = "s" if dropped_turns != 1 else ""
    return (
        f"the session's summary and the {dropped_turns} oldest turn{plural} of the history, "
        "compacted to fit this request"
    )


def summary_text(messages: Sequence[Message]) -> str:
    """The summary in a request's summary block (empty when it has none)."""
    for message in messages:
        if message.role == "system":
            found = summary_of_block(text_of(message))
            if found is not None:
                return found
    return ""


def fit_messages(messages: Sequence[Message], drop: int, summary: str | None) -> list[Message]:
    """`messages` without the `drop` oldest history turns, the summary block replaced by `summary`.

    `summary` None removes the block; a new block goes after the other system blocks, directly
    above the history.
    """
    turns = history_turns(messages)[:drop]
    dropped = {index for start, end in turns for index in range(start, end)}
    kept = [
        message
        for index, message in enumerate(messages)
        if index not in dropped
        and not (message.role == "system" and summary_of_block(text_of(message)) is not None)
    ]
    if summary is None or not summary.strip():
        return kept
    block = Message(
        role="system", parts=(TextPart(text=summary_block(summary, compacted_summary_note(drop))),)
    )
    position = next((index for index, message in enumerate(kept) if message.role != "system"), len(kept))
    return [*kept[:position], block, *kept[position:]]


def compacted_messages(messages: Sequence[Message], compaction: Compaction | None) -> list[Message]:
    """The run's messages as its latest compaction lets a request see them."""
    if compaction is None:
        return list(messages)
    return fit_messages(messages, compaction.dropped_turns, compaction.summary)


def dropped_messages(messages: Sequence[Message], first: int, last: int) -> list[Message]:
    """The messages of history turns `first` to `last - 1` (the ones a compaction summarises)."""
    turns = history_turns(messages)[first:last]
    return [message for start, end in turns for message in messages[start:end]]


def compaction_record(view: RunView, compaction: Compaction, at: datetime) -> Record:
    """The `history_compacted` record of a compaction."""
    return view.record(compacted_key(compaction.step), HISTORY_COMPACTED_TYPE, compaction.encode(), at)


def compaction_event(view: RunView, compaction: Compaction, at: datetime) -> RunEvent:
    """The `history_compacted` event: how many turns were compacted, tokens before and after."""
    key = compacted_key(compaction.step)
    return RunEvent(
        event_id=derive_id(view.run_id, key),
        occurred_at=at,
        type=StreamEventType.HISTORY_COMPACTED,
        event_key=key,
        run_id=view.run_id,
        session_id=view.session_id,
        timestamp=at,
        payload={
            "step": compaction.step,
            "dropped_turns": compaction.dropped_turns,
            "tokens_before": compaction.tokens_before,
            "tokens_after": compaction.tokens_after,
        },
    )


def overflow_failure(needed: int, budget: int, why: str = "") -> Failure:
    """The failure of a turn that cannot fit its request budget even without any history."""
    return Failure(
        message=why
        or (
            f"the current turn alone needs {needed} input tokens, over the request budget of "
            f"{budget}: it cannot be sent even with every earlier turn dropped"
        ),
        kind=CONTEXT_OVERFLOW,
        retryable=False,
    )


def seed_messages(blocks: ContextBlocks) -> list[Message]:
    """The `seed` record's messages: system blocks (as system messages) then the history."""
    system = [Message(role="system", parts=(TextPart(text=text),)) for text in blocks.system_blocks if text]
    return [*system, *blocks.history]


# --- tools as the planner sees them ---------------------------------------------------------------


@dataclass(frozen=True)
class ToolInfo:
    """A tool an agent may call: its model-facing spec, deadline, and the agent behind an agent-tool."""

    spec: ToolSpec
    timeout_s: float | None = None
    agent_id: str = ""
    """Non-empty for an agent-tool: calling it starts a child run of this agent."""

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.spec.name


def task_text(tool_input: Mapping[str, Any]) -> str:
    """The child's task from an agent-tool's input: `task` (or a lone string), else the JSON."""
    for key in ("task", "request", "question", "query", "prompt", "input", "text"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    strings = [value for value in tool_input.values() if isinstance(value, str) and value]
    if len(strings) == 1:
        return strings[0]
    return encode_json_value(dict(tool_input)).decode("utf-8")


# --- starts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPlan:
    """The store call that starts a run: identity, its two records, and a link for children."""

    run: RunStart
    started: Record
    stopped: Record
    parent_link: Record | None = None


def _start_record(run: RunStart, key: str, type_: str, payload: bytes) -> Record:
    return Record(
        event_key=key,
        run_id=run.run_id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        type=type_,
        payload=payload,
        timestamp=run.started_at,
    )


def start_plan(run: RunStart, link: tuple[ParentToolCall, str] | None = None) -> StartPlan:
    """The canonical `started`/`stopped` records of `run`, and its parent link (with its key)."""
    started = _start_record(run, STARTED_KEY, LifecycleType.RUN_STARTED.value, encode_run_started(run))
    stopped = _start_record(
        run,
        STOPPED_KEY,
        LifecycleType.RUN_COMPLETED.value,
        encode_run_completed(
            RunStatus.CANCELED, run.labels, cancellation_reason=CancellationReason.SESSION_ENDED.value
        ),
    )
    parent_link = None
    if link is not None:
        parent, key = link
        parent_link = Record(
            event_key=key,
            run_id=parent.parent_run_id,
            agent_id=parent.parent_agent_id,
            session_id=run.session_id,
            type=LifecycleType.CHILD_RUN_LINKED.value,
            payload=encode_child_run_linked(parent.tool_name, parent.tool_call_id, run.run_id, run.agent_id),
            timestamp=run.started_at,
        )
    return StartPlan(run=run, started=started, stopped=stopped, parent_link=parent_link)


def run_start(
    request: RunRequested,
    *,
    agent_id: str,
    session_id: str,
    parent_run_id: str = "",
    inherited: RunContext | None = None,
) -> RunStart:
    """The identity of the run a request starts; `started_at` is the request's time, so retries repeat it.

    The principal (the request's, else the predecessor's, as in `run_context`) goes to the store,
    which seals the run's records under that person's data key.
    """
    return RunStart(
        run_id=request.run_id,
        agent_id=agent_id,
        session_id=session_id,
        parent_run_id=parent_run_id,
        predecessor_run_id=request.predecessor_run_id if request.kind is RunKind.RESUME else "",
        started_at=to_millisecond(request.occurred_at),
        labels=request.labels,
        tenant_id=request.tenant_id or (inherited.tenant_id if inherited else ""),
        principal_id=request.principal_id or (inherited.principal_id if inherited else ""),
    )


def run_context(request: RunRequested, agent: AgentSpec, inherited: RunContext | None = None) -> RunContext:
    """Budgets, tenant and principal of a new run: the request's, else the predecessor's, else the
    agent's."""
    return RunContext(
        principal_id=request.principal_id or (inherited.principal_id if inherited else ""),
        max_steps=request.max_steps or (inherited.max_steps if inherited else agent.max_steps),
        max_output_tokens=request.max_tokens
        or (inherited.max_output_tokens if inherited else agent.max_output_tokens),
        parent=request.parent if request.kind is RunKind.CHILD else (inherited.parent if inherited else None),
        tenant_id=request.tenant_id or (inherited.tenant_id if inherited else ""),
    )


def user_message(text: str) -> Message:
    """The user's words as a transcript message."""
    return Message(role="user", parts=(TextPart(text=text),))


def answer_message(predecessor: RunView, pending: Sequence[PendingInput], answer: Any) -> Message:
    """The user message that closes a suspended group: every result in tool-use order.

    Completed tools keep the results they gave (they are never run again); each use that waited
    for input gets the answer (or, when `answer` is an object keyed by the waiting ids, its own).
    """
    waiting = {item.tool_use_id for item in pending}
    per_use = isinstance(answer, dict) and waiting and waiting <= set(answer)
    parts: list[ToolResultPart] = []
    for use in predecessor.last_tool_uses():
        if use.id in waiting:
            given = answer[use.id] if per_use else answer
            parts.append(ToolResultPart(tool_use_id=use.id, content=bounded_tool_result(given, False)))
            continue
        result = predecessor.results.get(use.id)
        if result is None:
            raise TranscriptError(f"tool use {use.id!r} of the suspended run has no result")
        parts.append(result_part(result))
    return Message(role="user", parts=tuple(parts))


# --- the next step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """The message that made the planner look at a run."""

    at: datetime
    """Its `occurred_at`: the timestamp of every record written in response to it."""
    event_id: str = ""
    result_for: str = ""
    """For a tool result: the tool use it answers (its group is already dispatched)."""


@dataclass(frozen=True)
class Wait:
    """Nothing to do until another message arrives."""

    why: str


@dataclass(frozen=True)
class Closed:
    """The run is closed; publish again what its end published (redelivery is harmless)."""

    outputs: list[Output]


@dataclass(frozen=True)
class Append:
    """Append one ordinary record, then look again."""

    record: Record


@dataclass(frozen=True)
class Intend:
    """Record a cancellation intent (the session ended under a running run), then look again."""

    record: Record


@dataclass(frozen=True)
class Dispatch:
    """Send the tool uses of call `step` that have no result yet."""

    step: int
    uses: list[ToolUsePart]


@dataclass(frozen=True)
class Suspend:
    """Every use has a result and some wait for input: suspend with a checkpoint."""

    checkpoint: Checkpoint
    record: Record


@dataclass(frozen=True)
class CallModel:
    """Call the model for step `step` (the last message is the user's)."""

    step: int


@dataclass(frozen=True)
class Finish:
    """Close the run with a terminal record (what the end publishes follows from `Closed`)."""

    record: Record


Output = ToolCallRequested | RunRequested | ToolCallCompleted | TurnCompleted | CancelRun | RunEvent
"""A message the planner publishes."""

Action = Wait | Closed | Append | Intend | Dispatch | Suspend | CallModel | Finish
"""The next step of a run."""


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


def _finish(view: RunView, trigger: Trigger, *, failure: Failure | None = None, canceled: str = "") -> Finish:
    if canceled:
        key, payload = CANCELED_KEY, encode_run_completed(RunStatus.CANCELED, view.labels, None, canceled)
    elif failure is not None:
        key, payload = FAILED_KEY, encode_run_completed(RunStatus.FAILED, view.labels, failure)
    else:
        key, payload = COMPLETED_KEY, encode_run_completed(RunStatus.COMPLETED, view.labels)
    return Finish(view.record(key, LifecycleType.RUN_COMPLETED.value, payload, trigger.at))


def model_failure(error_message: str, *, provider: str, code: str, http_status: int | None) -> Failure:
    """The failure of a run whose model call failed for good."""
    return Failure(
        message=error_message or "the model call failed",
        kind=MODEL_ERROR,
        provider=provider,
        operation="complete",
        code=code,
        http_status=http_status,
        retryable=False,
    )


def failure_finish(view: RunView, trigger: Trigger, failure: Failure) -> Finish:
    """Close the run as failed."""
    return _finish(view, trigger, failure=failure)


# --- what an end publishes ---------------------------------------------------------------------------


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


# --- tool dispatch ------------------------------------------------------------------------------


def dispatch_outputs(
    view: RunView, step: int, uses: Sequence[ToolUsePart], tools: Mapping[str, ToolInfo], trigger: Trigger
) -> tuple[list[Output], list[Record]]:
    """Messages that start the pending tool uses, and error results for tools the agent lacks.

    Times and ids come from the step's assistant record, so a republished call is identical.
    """
    at = view.step_times.get(step, trigger.at)
    principal = view.context.principal_id if view.context is not None else ""
    tenant = view.context.tenant_id if view.context is not None else ""
    outputs: list[Output] = []
    local: list[Record] = []
    for use in uses:
        tool = tools.get(use.name)
        if tool is None:
            unknown = ToolResult(use.id, use.name, f"unknown tool {use.name!r}", is_error=True)
            local.append(view.record(tool_result_key(use.id), TOOL_RESULT_TYPE, unknown.encode(), trigger.at))
        elif tool.agent_id:
            outputs.append(
                RunRequested(
                    event_id=derive_id(view.run_id, f"step/{step}/child/{use.id}"),
                    occurred_at=at,
                    correlation_id=view.run_id,
                    causation_id=trigger.event_id,
                    tenant_id=tenant,
                    kind=RunKind.CHILD,
                    run_id=child_run_id(view.run_id, use.id),
                    session_id=view.session_id,
                    agent_id=tool.agent_id,
                    principal_id=principal,
                    text=task_text(use.input),
                    parent=ParentToolCall(
                        parent_run_id=view.run_id,
                        parent_agent_id=view.agent_id,
                        tool_call_id=use.id,
                        tool_name=use.name,
                    ),
                )
            )
        else:
            outputs.append(
                ToolCallRequested(
                    event_id=derive_id(view.run_id, f"step/{step}/call/{use.id}"),
                    occurred_at=at,
                    correlation_id=view.run_id,
                    causation_id=trigger.event_id,
                    tenant_id=tenant,
                    run_id=view.run_id,
                    session_id=view.session_id,
                    agent_id=view.agent_id,
                    principal_id=principal,
                    tool_use_id=use.id,
                    tool_name=use.name,
                    input=dict(use.input),
                    timeout_s=tool.timeout_s,
                )
            )
    return outputs, local


# --- the model call ---------------------------------------------------------------------------------


def model_request(
    view: RunView,
    agent: AgentSpec,
    tools: Mapping[str, ToolInfo],
    step: int,
    max_tokens_per_call: int,
    messages: Sequence[Message] | None = None,
) -> ModelRequest:
    """The request of model call `step`: the agent's prompt plus system blocks, the transcript, tools.

    The transcript is the run's messages as its latest compaction shows them, unless `messages`
    is given (the planner trying a compaction).
    """
    assert view.context is not None
    shown = compacted_messages(view.messages, view.compaction) if messages is None else list(messages)
    system = [agent.system_prompt, *(text_of(m) for m in shown if m.role == "system")]
    remaining = view.context.max_output_tokens - view.output_tokens
    max_tokens = max(1, min(max_tokens_per_call, remaining))
    thinking = agent.thinking_budget if agent.thinking_budget < max_tokens else 0
    return ModelRequest(
        system="\n\n".join(text for text in system if text),
        messages=[message for message in shown if message.role != "system"],
        tools=[tools[name].spec for name in agent.tools if name in tools],
        max_tokens=max_tokens,
        thinking_budget=thinking,
        call_key=f"{view.run_id}/step/{step}",
    )


def _output_tokens(message: Message) -> int:
    usage = (message.meta or {}).get("usage")
    return int(usage.get("output_tokens", 0)) if isinstance(usage, dict) else 0


def model_records(view: RunView, step: int, response: ModelResponse, at: datetime) -> list[Record]:
    """The assistant message of call `step`: parts in the order produced, its usage in `meta`.

    One record, so the tokens a budget counts can never be lost between two appends; the owner
    streams the usage as a `usage` event when the record commits.
    """
    usage_fields = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "model": response.model,
        "stop_reason": response.stop_reason.value,
    }
    message = Message(role="assistant", parts=tuple(response.parts), meta={"usage": usage_fields})
    return [view.record(assistant_key(step), TRANSCRIPT_MESSAGES_APPENDED, encode_messages([message]), at)]


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


def reply_delta(view: RunView, step: int, index: int, text: str, at: datetime) -> RunEvent:
    """An `assistant_reply` event: one piece of answer text while call `step` generates it."""
    key = f"step/{step}/delta/{index}"
    return RunEvent(
        event_id=derive_id(view.run_id, key),
        occurred_at=at,
        type=StreamEventType.ASSISTANT_REPLY,
        event_key=key,
        run_id=view.run_id,
        session_id=view.session_id,
        timestamp=at,
        payload={"text": text, "step": step, "index": index},
    )
