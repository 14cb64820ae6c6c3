"""The tool catalog: what each tool is called, what it does, and what arguments it takes.

Both sides of a tool call read the same definitions:

- the planner gives the model `catalog.specs(names)` (name, description, JSON schema of the
  arguments) and decides, per tool use, who runs it: an agent-tool (`definition.agent_id` set)
  is a child run the planner starts itself; every other tool goes to `tools.calls`;
- the tool executor validates the model's arguments against `definition.arguments`, and runs
  the call under `definition.timeout_s` and at most `definition.max_concurrency` at a time.

A definition is usually made by `quipu.tools.tool` from a typed function; the shipped tools are
in `quipu.services.domain.shipped_tools`.

    catalog = ToolCatalog(my_toolset.definitions())   # or shipped_tools.default_catalog()
    catalog.register(agent_tool("researcher", "Looks things up and reports back.", "agent-research"))
    tools = catalog.specs(["calculator", "current_time", "researcher"])   # for the ModelRequest

A tool with `awaits_input=True` (`ask_user`) never produces content: the executor answers with
`ToolCallCompleted.awaiting` set, and the planner suspends the run until someone answers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quipu.contracts.errors import QuipuError
from quipu.services.domain.models.port import ToolSpec

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""Tool names every provider accepts (Anthropic's rule); the model calls tools by these names."""

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_CONCURRENCY = 8
AGENT_TOOL_TIMEOUT_S = 600.0
"""An agent-tool is a whole child run: the planner's own budget, not an executor deadline."""


class UnknownToolError(QuipuError, KeyError):
    """Raised when a catalog is asked for a tool name it does not hold."""

    def __str__(self) -> str:
        return f"unknown tool {self.args[0]!r}" if self.args else "unknown tool"


class ArgumentError(QuipuError, ValueError):
    """Raised when a model's arguments do not fit a tool's schema; the text is for the model."""


# --- the argument models (their JSON schema is what the model sees) ---------------------------


class ToolArguments(BaseModel):
    """Base of every tool's arguments: frozen, and unknown arguments are an error the model sees."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentToolArguments(ToolArguments):
    """Arguments of every agent-tool: the task handed to the agent."""

    task: str = Field(min_length=1, max_length=20_000, description="What the agent should do, in full.")


# --- definitions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolDefinition:
    """One tool: how the model sees it, and how it runs.

    `arguments` is a pydantic model; its JSON schema is the tool's input schema and it validates
    the model's arguments. `timeout_s` bounds one call, `max_concurrency` the calls of this tool
    running at once in one executor. `awaits_input` tools answer with a request for outside
    input instead of content. `agent_id` makes this an agent-tool: the planner runs that agent as
    a child run with the `task` argument; the tool executor never runs it.
    """

    name: str
    description: str
    arguments: type[BaseModel]
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    awaits_input: bool = False
    agent_id: str = ""

    def __post_init__(self) -> None:
        if not TOOL_NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"tool name {self.name!r} must match {TOOL_NAME_PATTERN.pattern}")
        if not self.description.strip():
            raise ValueError(f"tool {self.name!r} needs a description: the model picks tools by it")
        if not (isinstance(self.arguments, type) and issubclass(self.arguments, BaseModel)):
            raise TypeError(f"tool {self.name!r}: arguments must be a pydantic model class")
        if not self.timeout_s > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be positive")
        if self.max_concurrency < 1:
            raise ValueError(f"tool {self.name!r}: max_concurrency must be at least 1")
        if self.awaits_input and self.agent_id:
            raise ValueError(f"tool {self.name!r}: an agent-tool cannot await input itself")

    @property
    def is_agent_tool(self) -> bool:
        """Whether the planner runs this tool as a child run (never the tool executor)."""
        return bool(self.agent_id)

    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(
            name=self.name, description=self.description, input_schema=input_schema(self.arguments)
        )

    def parse_arguments(self, raw: Mapping[str, Any]) -> BaseModel:
        """The model's arguments, validated; raises ArgumentError with a text the model can act on.

        The text names each offending argument and what is wrong with it, never the values given
        (they may be large, or hold what should not be echoed).
        """
        try:
            return self.arguments.model_validate(dict(raw))
        except ValidationError as error:
            raise ArgumentError(f"invalid arguments for {self.name}: {_describe(error)}") from None


@functools.cache
def input_schema(arguments: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, built once per class (pydantic builds it anew on
    every call, ~0.1 ms, and the planner offers each agent-tool again at every step). Shared by
    every spec of the class: read it, never change it."""
    return arguments.model_json_schema()


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors(include_input=False, include_url=False):
        where = ".".join(str(part) for part in item["loc"])
        problems.append(f"{where}: {item['msg']}" if where else item["msg"])
    return "; ".join(problems)


def agent_tool(
    name: str,
    description: str,
    agent_id: str,
    *,
    timeout_s: float = AGENT_TOOL_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> ToolDefinition:
    """An agent called as a tool: argument `task`; the planner runs `agent_id` as a child run."""
    if not agent_id:
        raise ValueError(f"agent-tool {name!r} needs an agent_id")
    return ToolDefinition(
        name=name,
        description=description,
        arguments=AgentToolArguments,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        agent_id=agent_id,
    )


class ToolCatalog:
    """The tools by name; the planner and the tool executor each build one from the same definitions."""

    def __init__(self, definitions: Iterable[ToolDefinition] = ()) -> None:
        self._definitions: dict[str, ToolDefinition] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: ToolDefinition) -> ToolDefinition:
        """Add a tool; registering the very same definition again is a no-op, a different one an error."""
        existing = self._definitions.get(definition.name)
        if existing is not None and existing != definition:
            raise ValueError(f"tool {definition.name!r} is already registered with another definition")
        self._definitions[definition.name] = definition
        return definition

    def get(self, name: str) -> ToolDefinition:
        """The definition of `name`; raises UnknownToolError."""
        try:
            return self._definitions[name]
        except KeyError:
            raise UnknownToolError(name) from None

    def find(self, name: str) -> ToolDefinition | None:
        """The definition of `name`, or None."""
        return self._definitions.get(name)

    def names(self) -> list[str]:
        """Every tool name, in registration order."""
        return list(self._definitions)

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        """The specs of `names`, in that order (every tool when None); raises UnknownToolError."""
        chosen = self._definitions.values() if names is None else [self.get(name) for name in names]
        return [definition.spec() for definition in chosen]

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __iter__(self) -> Iterator[ToolDefinition]:
        return iter(list(self._definitions.values()))

    def __len__(self) -> int:
        return len(self._definitions)
