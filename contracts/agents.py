"""Agents as data: an agent's definition, and the registry entries that define or remove one.

`agents.registry` (compacted, 1 partition, keyed by agent id) holds every agent a deployment
serves: `quipu agents apply` and an `App` at start-up publish an `AgentChanged` with the definition,
`quipu agents delete` one without. Every planner copy replays the topic from its beginning and follows it;
an agent's latest entry (by `changed_at`) is what it serves.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.wire import Timestamp

AGENT_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""Agent ids: another agent calls one as a tool by its id, and tool names allow only these."""


class AgentDefinition(BaseModel):
    """Who an agent is, which tools it may use, and how much one of its runs may spend."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(pattern=AGENT_ID_PATTERN, description="Stable identifier: runs name the agent by it.")
    instructions: str = Field(min_length=1, description="The system prompt the model is given.")
    description: str = Field(
        default="", description="What the agent does: its tool description when another agent calls it."
    )
    tools: list[str] = Field(
        default_factory=list,
        description=(
            "Names of the tools it may call: tools some toolset announces on tools.registry, or "
            "other agents' ids (agent-tools: calling one starts a child run of that agent); never "
            "the agent's own id."
        ),
    )
    max_steps: int = Field(default=8, ge=1, description="Model calls one run may make.")
    max_output_tokens: int = Field(
        default=16_000, ge=1, description="Output tokens one run may spend across all its model calls."
    )
    thinking_budget: int = Field(
        default=0, ge=0, description="Extended-thinking tokens per model call; 0 turns thinking off."
    )
    memory_opt_out: bool = Field(
        default=False,
        description=(
            "The agent gets no cross-session memory (no facts, no profile) and its turns feed no "
            "fact extraction; session history is unaffected."
        ),
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "The model its calls ask the planner's model adapter for; absent: the deployment's default."
        ),
    )


class AgentChanged(Envelope):
    """An agent is defined, redefined or removed (`agent` null): the planner serves its latest entry.

    A definition's `event_id` comes from its content, so every copy of an App publishing the same
    agent publishes the same id. After a removal runs for the agent are refused: a planner serves
    no agent but those this topic holds.
    """

    agent_id: str = Field(pattern=AGENT_ID_PATTERN, description="The agent (the record's key).")
    agent: AgentDefinition | None = Field(
        description=(
            "Its definition; null: the agent is removed. A reader skips an entry whose `agent.id` "
            "is not `agent_id`."
        )
    )
    changed_at: Timestamp = Field(description="When it was published; an agent's latest entry wins.")
