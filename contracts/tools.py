"""Tool calls and their results (`tools.calls`, `tools.results`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.wire import Timestamp

TOOL_RESULT_RECORD = "tool_result"
"""Type of the ordinary run record (key `tool-result/<tool_use_id>`) holding one tool result as it
arrived: JSON `{tool_use_id, tool_name, content, is_error, awaiting?, duration_ms?}`. The storage
owner streams it as a `tool_end` event once it commits."""


class ToolCallRequested(Envelope):
    """Execute one tool use of a run; the result comes back on `tools.results`."""

    run_id: str = Field(description="Run whose model asked for the tool (the partition key).")
    session_id: str = Field(default="", description="Session of the run; results are keyed by it.")
    agent_id: str = Field(description="Agent of the run.")
    principal_id: str = Field(default="", description="The person the run acts for.")
    tool_use_id: str = Field(description="The tool_use id; exactly one result answers it.")
    tool_name: str = Field(description="Registered tool to run.")
    input: dict[str, Any] = Field(default_factory=dict, description="Arguments the model gave.")
    timeout_s: float | None = Field(default=None, description="Deadline override; the tool's own if unset.")

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"input"})
    """The model's arguments may quote the user; the tool's name and ids stay in clear."""


class AwaitKind(StrEnum):
    """What outside input a tool waits for (the `await_*` stream events)."""

    CLARIFICATION = "await_clarification"
    CONFIRMATION = "await_confirmation"
    QUESTIONS = "await_questions"
    EXTERNAL_TOOLS = "await_external_tools"


class AwaitInput(BaseModel):
    """A tool's request for outside input: the run is suspended until someone answers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: AwaitKind = Field(description="What is awaited.")
    prompt: str = Field(description="The question shown to the user.")
    details: dict[str, Any] = Field(default_factory=dict, description="Kind-specific extras (choices...).")


class ToolCallCompleted(Envelope):
    """The one result of a tool use: content or an error, or a request for outside input."""

    run_id: str = Field(description="Run the tool use belongs to.")
    session_id: str = Field(default="", description="Session of the run (the partition key).")
    agent_id: str = Field(default="", description="Agent of the run.")
    tool_use_id: str = Field(description="The tool_use id this result answers.")
    tool_name: str = Field(description="Tool that ran.")
    content: Any = Field(default=None, description="JSON result (or the error text when is_error).")
    is_error: bool = Field(default=False, description="True when the tool failed; content is the error.")
    awaiting: AwaitInput | None = Field(
        default=None, description="Set when the tool needs outside input: the run suspends."
    )
    duration_ms: float = Field(default=0.0, description="How long the tool ran.")

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"content", "awaiting"})
    """What the tool returned or asks; the tool's name, ids, error flag and duration stay in clear."""

    def partition_key(self) -> str:
        """Results go with their session, like everything else about it."""
        return self.session_id or self.run_id


DEFAULT_TOOLSET = "default"
"""The toolset of the deployment's general executor (the shipped tools and any served beside
them): its calls stay on `tools.calls` itself. Every other toolset has `tools.calls.<toolset>`."""

TOOLSET_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""Toolset names: they end a topic name, so letters, digits, `_` and `-` only (no `.`)."""


class AnnouncedTool(BaseModel):
    """One tool of an announced toolset, as the planner offers it to the model."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1, max_length=64, description="The tool's name; the model calls it by this.")
    description: str = Field(min_length=1, description="What the tool does; the model picks tools by it.")
    input_schema: dict[str, Any] = Field(description="JSON schema of the tool's arguments.")
    timeout_s: float = Field(gt=0, description="Bound on one call, in seconds (the executor enforces it).")
    awaits_input: bool = Field(
        default=False, description="True when the tool answers with a request for outside input (ask_user)."
    )


class ToolsetAnnounced(Envelope):
    """An executor deployment serves a toolset: its tools and the topic its calls go to.

    Published by every executor copy at start-up, and again when an MCP server's tool list
    changes (the same content gives the same `event_id`);
    `tools.registry` is compacted by toolset name, so its latest announcement is what remains.
    """

    toolset: str = Field(pattern=TOOLSET_NAME_PATTERN, description="The toolset's name (the key).")
    version: str = Field(default="", description="The toolset's version, as its author gives it.")
    calls_topic: str = Field(
        description=(
            "Where its calls go, without the deployment's prefix: `tools.calls` for the default "
            "toolset, `tools.calls.<toolset>` for any other (a reader checks it against that rule)."
        )
    )
    tools: list[AnnouncedTool] = Field(description="Every tool the toolset serves.")
    announced_at: Timestamp = Field(description="When the executor announced it; a later one replaces it.")
