"""Run requests and control (`runs.requested`, `runs.control`) and finished turns (`history.turns`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.store import CancellationReason


class RunKind(StrEnum):
    """What a run request asks for."""

    TURN = "turn"
    """A new user turn in a session (or a one-shot run when there is no session)."""
    RESUME = "resume"
    """The answer to a suspended run: starts a continuation that names its predecessor."""
    CHILD = "child"
    """An agent called as a tool by a parent run (published by the planner)."""


class ParentToolCall(BaseModel):
    """The tool call of the parent run that a child run answers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    parent_run_id: str = Field(description="Run that called the agent as a tool.")
    parent_agent_id: str = Field(description="Agent of the parent run.")
    tool_call_id: str = Field(description="tool_use id in the parent's transcript.")
    tool_name: str = Field(description="Name of the agent-tool the parent called.")


class RunRequested(Envelope):
    """A request to run an agent: a user turn, the answer to a suspended run, or a child run."""

    kind: RunKind = Field(default=RunKind.TURN, description="Turn, resume or child.")
    run_id: str = Field(description="Identifier of the run to start; retries repeat it.")
    session_id: str = Field(default="", description="Session of the run; empty for a one-shot run.")
    agent_id: str = Field(description="Agent that executes the run.")
    principal_id: str = Field(default="", description="The person the agent acts for (memory scope).")
    text: str = Field(default="", description="What the user said (turn), or the child's task (child).")
    predecessor_run_id: str = Field(
        default="", description="The suspended run this request answers (resume only)."
    )
    answer: Any = Field(default=None, description="The user's answer to the suspended run (resume only).")
    parent: ParentToolCall | None = Field(default=None, description="The calling tool use (child only).")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels recorded on the run.")
    max_steps: int | None = Field(
        default=None, description="Model-call budget; the agent's default if unset."
    )
    max_tokens: int | None = Field(default=None, description="Output-token budget of the whole run.")

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"text", "answer"})
    """What the user said or answered; kind, ids, labels and budgets stay in clear."""

    def partition_key(self) -> str:
        """Everything about one session goes to one partition; sessionless runs by run id."""
        return self.session_id or self.run_id


class CancelRun(Envelope):
    """Ask for a run to be canceled; the first accepted reason is permanent."""

    run_id: str = Field(description="Run to cancel.")
    session_id: str = Field(default="", description="Session of the run (the partition key).")
    reason: CancellationReason = Field(
        default=CancellationReason.USER_REQUESTED, description="Why the run is canceled."
    )


class TurnCompleted(Envelope):
    """A finished turn for the product history: what the user said and what the agent answered."""

    session_id: str = Field(description="Session of the turn.")
    run_id: str = Field(description="Run that produced the answer.")
    agent_id: str = Field(description="Agent that answered.")
    principal_id: str = Field(default="", description="The person the turn belongs to.")
    user_text: str = Field(description="What the user said, word for word.")
    assistant_text: str = Field(description="What the agent answered, word for word (no tool traffic).")

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"user_text", "assistant_text"})
    """The turn's words; ids stay in clear."""
