"""`RunView`: a run's records folded into what the decisions need, and the transcript's text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from quipu.contracts.lifecycle import (
    RunCompletedPayload,
    decode_child_run_linked,
    decode_run_completed,
    decode_run_started,
)
from quipu.contracts.store import LifecycleType, Record
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_APPENDED,
    TRANSCRIPT_MESSAGES_SEEDED,
    Message,
    TextPart,
    ToolUsePart,
    decode_messages,
)
from quipu.contracts.wire import to_millisecond
from quipu.services.planner.logic.keys import (
    CONTEXT_TYPE,
    HISTORY_COMPACTED_TYPE,
    INPUT_KEY,
    TOOL_RESULT_TYPE,
)
from quipu.services.planner.logic.payloads import Compaction, RunContext, ToolResult


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
    unwritten: list[Record] = field(default_factory=list)
    """Records folded in (`stage`) that the store has not taken yet: the step being built, written
    as one command before anything it justifies is published."""

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

    def stage(self, record: Record) -> None:
        """Fold `record` in as part of the step being built (`unwritten`)."""
        self.add(record)
        self.unwritten.append(record)

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


def is_user_text(message: Message) -> bool:
    return message.role == "user" and any(isinstance(part, TextPart) for part in message.parts)


def user_text(messages: Sequence[Message]) -> str:
    """What the user said in this turn: the last user message with text (tool results have none)."""
    for message in reversed(messages):
        if is_user_text(message):
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


def _output_tokens(message: Message) -> int:
    usage = (message.meta or {}).get("usage")
    return int(usage.get("output_tokens", 0)) if isinstance(usage, dict) else 0
