"""The agent registry: who an agent is, which tools it may use, and how much it may spend.

    agents = AgentRegistry()             # what a planner starts with: no agent at all
    agents.apply(changed)                # an entry of agents.registry (quipu.contracts.agents)
    agent = agents.get_agent("assistant") # an AgentDefinition; UnknownAgentError when not registered

An agent is its wire definition, `quipu.contracts.agents.AgentDefinition` (what a `quipu.Agent`
is, and what `agents.registry` carries): the registry adds nothing to it. Its tools are names: a
tool some toolset announced on tools.registry, or the id of another registered agent (an
agent-tool: calling it starts a child run of that agent). The planner reads the budgets and the
model; memory services read `memory_opt_out`.

Agents are data: `defined(...)` and `removed(...)` make the entries `quipu agents apply|delete`
and an App publish (`domain.agent_publisher`); every planner copy replays `agents.registry` and
applies each entry to its registry. The latest entry of an agent (by `changed_at`) wins, whatever
order they were read in. A service knows no agent of its own: the built-in assistant is served
because `quipu up` (or `quipu agents apply quipu.assistant:app` in a deployment) published it.
`AgentRegistry(agents)` starts from given agents, for a planner embedded in a test or a program
of your own; a registered agent of the same id replaces one given, and removing it serves the
given one again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from pydantic import ValidationError

from quipu.contracts.agents import AgentChanged, AgentDefinition
from quipu.contracts.envelope import derive_id
from quipu.contracts.errors import QuipuError


class UnknownAgentError(QuipuError, LookupError):
    """Raised when an agent id is not in the registry."""


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


def calls_itself(agent: AgentDefinition) -> bool:
    """Whether `agent` names itself among its tools (it could never be run)."""
    return agent.id in agent.tools


class AgentRegistry(Mapping[str, AgentDefinition]):
    """Agents by id: those it is built with (none in a service), and those registered through `apply`."""

    def __init__(self, agents: Iterable[AgentDefinition] = ()) -> None:
        self._built_in: dict[str, AgentDefinition] = {}
        for agent in agents:
            if agent.id in self._built_in:
                raise ValueError(f"agent {agent.id!r} is registered twice")
            if calls_itself(agent):
                raise ValueError(f"agent {agent.id!r} cannot call itself as a tool")
            self._built_in[agent.id] = agent
        self._latest: dict[str, tuple[datetime, AgentDefinition | None]] = {}
        self._agents = dict(self._built_in)

    def apply(self, entry: AgentChanged) -> None:
        """Take an entry of agents.registry; one older than the agent's latest is ignored (a replay).

        InvalidAgentEntryError (nothing changes) for a definition about another id or one that
        calls itself."""
        spec = entry.agent
        if spec is not None and spec.id != entry.agent_id:
            raise InvalidAgentEntryError(f"the entry of agent {entry.agent_id!r} defines another agent")
        if spec is not None and calls_itself(spec):
            raise InvalidAgentEntryError(f"agent {entry.agent_id!r} cannot be served: it calls itself")
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

    def __getitem__(self, agent_id: str) -> AgentDefinition:
        return self._agents[agent_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def get_agent(self, agent_id: str) -> AgentDefinition:
        """The agent `agent_id`; raises UnknownAgentError when it is not registered."""
        try:
            return self._agents[agent_id]
        except KeyError:
            raise UnknownAgentError(
                f"agent {agent_id!r} is not registered (none of that id on agents.registry)"
            ) from None

    def is_agent_tool(self, name: str) -> bool:
        """Whether a tool name is another agent (calling it starts a child run)."""
        return name in self._agents
