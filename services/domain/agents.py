"""The agent registry: who an agent is, which tools it may use, and how much it may spend.

    agents = default_agents()
    spec = agents.get("assistant")       # UnknownAgentError when not registered

An agent's tools are names. A name is either a tool of the tool catalog (`quipu.services.domain.tool_catalog`)
or the id of another registered agent: that is an agent-tool, and calling it starts a child run
of that agent. The planner reads the budgets; memory services read `memory_opt_out`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

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

    @model_validator(mode="after")
    def _no_self_call(self) -> AgentSpec:
        if self.agent_id in self.tools:
            raise ValueError(f"agent {self.agent_id!r} cannot call itself as a tool")
        return self


class AgentRegistry(Mapping[str, AgentSpec]):
    """Agents by id; immutable once built."""

    def __init__(self, agents: Iterable[AgentSpec]) -> None:
        self._agents: dict[str, AgentSpec] = {}
        for agent in agents:
            if agent.agent_id in self._agents:
                raise ValueError(f"agent {agent.agent_id!r} is registered twice")
            self._agents[agent.agent_id] = agent

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
            raise UnknownAgentError(f"agent {agent_id!r} is not registered") from None

    def is_agent_tool(self, name: str) -> bool:
        """Whether a tool name is another agent (calling it starts a child run)."""
        return name in self._agents


ASSISTANT = AgentSpec(
    agent_id="assistant",
    description="A general assistant that can tell the time, calculate, keep notes and ask the user.",
    system_prompt=(
        "You are Quipu's assistant. Answer briefly and precisely. Use the tools when they help: "
        "current_time for the date and time, calculator for arithmetic, notes to remember or recall "
        "short notes, ask_user when you need the user's confirmation or a missing detail, and "
        "math_agent to delegate a mathematical task."
    ),
    tools=("current_time", "calculator", "notes", "ask_user", "math_agent"),
)

MATH_AGENT = AgentSpec(
    agent_id="math_agent",
    description="Solves a mathematical task with a calculator and answers with the result.",
    system_prompt=(
        "You are a careful mathematician. Use the calculator for every computation and answer "
        "with the result and one sentence of explanation."
    ),
    tools=("calculator",),
    max_steps=4,
)


def default_agents() -> AgentRegistry:
    """The built-in agents: `assistant` (with the agent-tool `math_agent`) and `math_agent`."""
    return AgentRegistry([ASSISTANT, MATH_AGENT])
