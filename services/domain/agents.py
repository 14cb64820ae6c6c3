"""The agent registry: who an agent is, which tools it may use, and how much it may spend.

    agents = default_agents()            # the built-in agents
    agents.apply(changed)                # an entry of agents.registry (quipu.contracts.agents)
    spec = agents.get_agent("assistant") # UnknownAgentError when not registered

An agent's tools are names. A name is either a tool (announced on tools.registry, or of the tool
catalog, `quipu.services.domain.tool_catalog`) or the id of another registered agent: that is an
agent-tool, and calling it starts a child run of that agent. The planner reads the budgets and
the model; memory services read `memory_opt_out`.

Agents are data: `defined(...)` and `removed(...)` make the entries `quipu agents apply|delete`
and an App publish (`domain.agent_publisher`); every planner copy replays `agents.registry` and
applies each entry to its registry. The latest entry of an agent (by `changed_at`) wins, whatever
order they were read in; a registered agent replaces a built-in one of the same id, and removing
it serves the built-in again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quipu.assistant import assistant, math_agent
from quipu.contracts.agents import AgentChanged, AgentDefinition
from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import QuipuError


class UnknownAgentError(QuipuError, LookupError):
    """Raised when an agent id is not in the registry."""


class AgentSpec(BaseModel):
    """One agent: identity, instructions, tools and budgets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: str = Field(min_length=1, description="Stable identifier, used in runs and records.")
    description: str = Field(
        default="", description="What the agent does; the tool description when another agent calls it."
    )
    system_prompt: str = Field(description="Instructions given to the model as the system prompt.")
    tools: tuple[str, ...] = Field(
        default=(), description="Tool names the agent may call: catalog tools or other agents' ids."
    )
    max_steps: int = Field(default=8, ge=1, description="Model calls one run may make.")
    max_output_tokens: int = Field(
        default=16_000, ge=1, description="Output tokens one run may spend across all its model calls."
    )
    thinking_budget: int = Field(
        default=0, ge=0, description="Extended-thinking tokens per call; 0 turns thinking off."
    )
    memory_opt_out: bool = Field(
        default=False,
        description=(
            "The agent gets no cross-session memory: context sources give it no facts or profile, "
            "and its turns feed no fact extraction. Session history (continuity) is unaffected."
        ),
    )

    model: str | None = Field(
        default=None, description="The model its calls ask for; None: the deployment's default."
    )

    @model_validator(mode="after")
    def _no_self_call(self) -> AgentSpec:
        if self.agent_id in self.tools:
            raise ValueError(f"agent {self.agent_id!r} cannot call itself as a tool")
        return self

    @classmethod
    def of(cls, definition: AgentDefinition) -> AgentSpec:
        """The planner's view of a registered definition (ValueError when it calls itself)."""
        return cls(
            agent_id=definition.id,
            description=definition.description,
            system_prompt=definition.instructions,
            tools=tuple(definition.tools),
            max_steps=definition.max_steps,
            max_output_tokens=definition.max_output_tokens,
            thinking_budget=definition.thinking_budget,
            memory_opt_out=definition.memory_opt_out,
            model=definition.model,
        )


def defined(definition: AgentDefinition, *, at: datetime) -> AgentChanged:
    """The registry entry that defines `definition`; its `event_id` comes from the content alone."""
    content = definition.model_dump_json()
    return AgentChanged(
        event_id=derive_id(f"agent/{definition.id}", hashlib.sha256(content.encode()).hexdigest()),
        agent_id=definition.id,
        agent=definition,
        changed_at=at,
    )


def removed(agent_id: str, *, at: datetime) -> AgentChanged:
    """The registry entry that removes agent `agent_id`."""
    return AgentChanged(
        event_id=derive_id(f"agent/{agent_id}", "removed"), agent_id=agent_id, agent=None, changed_at=at
    )


class InvalidAgentEntryError(QuipuError, ValueError):
    """Raised when a registry entry cannot be served: its definition is about another id, or calls itself."""


class AgentRegistry(Mapping[str, AgentSpec]):
    """Agents by id: the built-in ones it is built with, and those registered through `apply`."""

    def __init__(self, agents: Iterable[AgentSpec] = ()) -> None:
        self._built_in: dict[str, AgentSpec] = {}
        for agent in agents:
            if agent.agent_id in self._built_in:
                raise ValueError(f"agent {agent.agent_id!r} is registered twice")
            self._built_in[agent.agent_id] = agent
        self._latest: dict[str, tuple[datetime, AgentSpec | None]] = {}
        self._agents = dict(self._built_in)

    def apply(self, entry: AgentChanged) -> None:
        """Take an entry of agents.registry; one older than the agent's latest is ignored (a replay).

        InvalidAgentEntryError (nothing changes) for a definition about another id or one that
        calls itself."""
        if entry.agent is not None and entry.agent.id != entry.agent_id:
            raise InvalidAgentEntryError(f"the entry of agent {entry.agent_id!r} defines another agent")
        try:
            spec = AgentSpec.of(entry.agent) if entry.agent is not None else None
        except ValueError as error:
            raise InvalidAgentEntryError(
                f"agent {entry.agent_id!r} cannot be served: it calls itself"
            ) from error
        latest = self._latest.get(entry.agent_id)
        if latest is not None and latest[0] > entry.changed_at:
            return
        self._latest[entry.agent_id] = (entry.changed_at, spec)
        built_in = self._built_in.get(entry.agent_id)
        served = spec or built_in
        if served is None:
            self._agents.pop(entry.agent_id, None)
        else:
            self._agents[entry.agent_id] = served

    def take(self, body: bytes) -> AgentChanged:
        """Apply one record of agents.registry as it came off the topic; InvalidAgentEntryError
        (nothing changes, no value quoted) for a record that is no entry or cannot be served."""
        try:
            entry = AgentChanged.model_validate_json(body)
        except ValidationError as error:
            raise InvalidAgentEntryError(
                f"not an agents.registry entry ({error.error_count()} error(s))"
            ) from None
        self.apply(entry)
        return entry

    def registered(self) -> list[str]:
        """The ids of the agents registered through `apply` (not removed since), sorted."""
        return sorted(agent_id for agent_id, (_, spec) in self._latest.items() if spec is not None)

    def __getitem__(self, agent_id: str) -> AgentSpec:
        return self._agents[agent_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def get_agent(self, agent_id: str) -> AgentSpec:
        """The agent `agent_id`; raises UnknownAgentError when it is not registered."""
        try:
            return self._agents[agent_id]
        except KeyError:
            raise UnknownAgentError(
                f"agent {agent_id!r} is not registered (none of that id on agents.registry nor built in)"
            ) from None

    def is_agent_tool(self, name: str) -> bool:
        """Whether a tool name is another agent (calling it starts a child run)."""
        return name in self._agents


# The built-in agents are the public example's (quipu/assistant.py), written once, as a user writes hers.
ASSISTANT, MATH_AGENT = AgentSpec.of(assistant), AgentSpec.of(math_agent)


def default_agents() -> AgentRegistry:
    """The built-in agents: `assistant` (with the agent-tool `math_agent`) and `math_agent`."""
    return AgentRegistry([ASSISTANT, MATH_AGENT])
