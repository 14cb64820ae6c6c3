"""Your own agents, as data: who an agent is, which tools it may use, how much it may spend.

    import quipu

    forecaster = quipu.Agent(
        id="forecaster",
        instructions="You answer questions about the weather.",
        description="Answers questions about the weather.",   # its tool description as an agent-tool
        tools=[forecast, "current_time"],                     # Tool objects, tool names, other Agents
        max_steps=8,
    )

An agent is published on the compacted `agents.registry` topic (`quipu agents apply`, or an App at
start-up) and every planner serves it from then on, without a restart. Its tools are names: a
`quipu.Tool` stands for its name, another `Agent` for its id (calling it starts a child run of
that agent). A tool no executor announces fails a run of the agent at its start (`missing_tool`).

`load_agents` reads agents from a YAML or TOML file (one agent, a list, or a list under `agents`)
or from `module:attr` (an Agent, a list of them, or an object with `.agents`), as
`quipu agents apply` does:

    # agents.yaml                              # agents.toml
    id: forecaster                             # [[agents]]
    instructions: You answer questions ...     # id = "forecaster"
    tools: [forecast, current_time]            # instructions = "You answer questions ..."
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr, ValidationError
from pydantic_core import ErrorDetails

from quipu.contracts.agents import AGENT_ID_PATTERN, AgentDefinition
from quipu.contracts.errors import QuipuError
from quipu.tools import Tool

AGENT_FILE_SUFFIXES = (".yaml", ".yml", ".toml")
"""The files `load_agents` reads."""


class AgentFileError(QuipuError, ValueError):
    """Raised when agents cannot be loaded: the message names the source, the agent and the field,
    never a value (instructions may hold what their author keeps private)."""


class Agent(AgentDefinition):
    """An agent: its id, instructions, tools and budgets (every field: `quipu.contracts.agents`).

    `tools` takes tool names, `quipu.Tool` objects and other `Agent`s, kept as names (what is
    published); `declared_tools` keeps them as given, so an App finds the agents and Tools an agent
    names by object. An agent that names itself or a tool twice is refused (ValueError).
    """

    _declared: tuple[str | Tool[..., Any] | AgentDefinition, ...] = PrivateAttr(default=())

    def __init__(
        self,
        *,
        id: str,
        instructions: str,
        description: str = "",
        tools: Iterable[str | Tool[..., Any] | AgentDefinition] = (),
        max_steps: int = 8,
        max_output_tokens: int = 16_000,
        thinking_budget: int = 0,
        memory_opt_out: bool = False,
        model: str | None = None,
    ) -> None:
        declared = tuple(tools)
        names = [tool_name(tool) for tool in declared]
        super().__init__(
            id=id,
            instructions=instructions,
            description=description,
            tools=names,
            max_steps=max_steps,
            max_output_tokens=max_output_tokens,
            thinking_budget=thinking_budget,
            memory_opt_out=memory_opt_out,
            model=model,
        )
        self._declared = declared
        refuse_bad_tools(self)

    @property
    def declared_tools(self) -> tuple[str | Tool[..., Any] | AgentDefinition, ...]:
        """The tools as given: names, `quipu.Tool` objects and other agents."""
        return self._declared


def tool_name(tool: str | Tool[..., Any] | AgentDefinition) -> str:
    """The name an agent's tool entry stands for: a name itself, a Tool's name, an agent's id."""
    if isinstance(tool, str):
        return tool
    if isinstance(tool, Tool):
        return tool.name
    if isinstance(tool, AgentDefinition):
        return tool.id
    raise TypeError(f"an agent's tool is a name, a quipu.Tool or a quipu.Agent, not {type(tool).__name__}")


def refuse_bad_tools(agent: AgentDefinition) -> None:
    """ValueError when `agent` names itself as a tool, or a tool twice."""
    if agent.id in agent.tools:
        raise ValueError(f"agent {agent.id!r} cannot call itself as a tool")
    twice = sorted({name for name in agent.tools if agent.tools.count(name) > 1})
    if twice:
        raise ValueError(f"agent {agent.id!r} names a tool twice: {', '.join(twice)}")


# --- loading agents from a file or a module ---------------------------------------------------------


def load_agents(source: str) -> list[Agent]:
    """The agents in `source`: a .yaml/.yml/.toml file, or `module:attr` (AgentFileError else)."""
    if source.lower().endswith(AGENT_FILE_SUFFIXES):
        return agents_from_file(Path(source))
    module, colon, attribute = source.partition(":")
    if colon and module and attribute:
        return agents_from_object(source, _imported(module, attribute, source))
    raise AgentFileError(f"{source}: not a .yaml, .yml or .toml file nor module:attr")


def agents_from_file(path: Path) -> list[Agent]:
    """The agents a YAML or TOML file holds."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise AgentFileError(f"{path}: cannot be read ({type(error).__name__})") from error
    document = _toml(path, text) if path.suffix.lower() == ".toml" else _yaml(path, text)
    return agents_from_data(str(path), document)


def agents_from_data(source: str, document: Any) -> list[Agent]:
    """The agents of a parsed document: one agent's table, a list of them, or a list under `agents`."""
    if isinstance(document, Mapping) and "agents" in document:
        if set(document) != {"agents"}:
            raise AgentFileError(f"{source}: `agents` must be the only top-level key")
        document = document["agents"]
    entries = [document] if isinstance(document, Mapping) else document
    if not isinstance(entries, list) or not entries:
        raise AgentFileError(f"{source}: expected an agent, a list of agents, or `agents = [...]`")
    agents = [_agent(source, index, entry) for index, entry in enumerate(entries)]
    _refuse_repeated_ids(source, agents)
    return agents


def agents_from_object(source: str, found: Any) -> list[Agent]:
    """The agents an imported object stands for: an Agent, a list of them, or its `.agents`."""
    if not isinstance(found, (AgentDefinition, list, tuple)) and hasattr(found, "agents"):
        found = found.agents
    items: Sequence[Any] = [found] if isinstance(found, AgentDefinition) else found
    if not isinstance(items, (list, tuple)) or not items:
        raise AgentFileError(f"{source}: expected an Agent, a list of Agents, or an object with .agents")
    agents: list[Agent] = []
    for index, item in enumerate(items):
        if not isinstance(item, AgentDefinition):
            raise AgentFileError(f"{source}[{index}]: a {type(item).__name__}, not a quipu.Agent")
        agents.append(item if isinstance(item, Agent) else _agent(source, index, item.model_dump()))
    _refuse_repeated_ids(source, agents)
    return agents


def _agent(source: str, index: int, entry: Any) -> Agent:
    where = f"{source}: agent {index}"
    if not isinstance(entry, Mapping):
        raise AgentFileError(f"{where}: expected a table of fields, got a {type(entry).__name__}")
    if isinstance(entry.get("id"), str) and re.fullmatch(AGENT_ID_PATTERN, entry["id"]):
        where = f"{source}: agent {entry['id']!r}"
    unknown = sorted(str(name) for name in entry if name not in AgentDefinition.model_fields)
    if unknown:
        raise AgentFileError(f"{where}: unknown field(s) {', '.join(unknown)}")
    try:
        # Validated as the wire's definition first: Agent's own __init__ would raise TypeError for a
        # missing field where a ValidationError names it.
        agent = Agent(**AgentDefinition.model_validate(dict(entry)).model_dump())
    except ValidationError as error:
        raise AgentFileError(f"{where}: {_fields_at_fault(error)}") from None
    except ValueError as error:
        raise AgentFileError(f"{where}: {error}") from None
    return agent


def _fields_at_fault(error: ValidationError) -> str:
    """Which fields are wrong and why, without their values (pydantic's own text quotes them)."""
    return "; ".join(_fault(detail) for detail in error.errors(include_input=False, include_url=False))


def _fault(detail: ErrorDetails) -> str:
    where = ".".join(str(part) for part in detail["loc"])
    why = detail["msg"].removeprefix("Value error, ")
    return f"{where}: {why}" if where else why


def _refuse_repeated_ids(source: str, agents: list[Agent]) -> None:
    ids = [agent.id for agent in agents]
    twice = sorted({agent_id for agent_id in ids if ids.count(agent_id) > 1})
    if twice:
        raise AgentFileError(f"{source}: agent id(s) given twice: {', '.join(twice)}")


def _toml(path: Path, text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise AgentFileError(f"{path}: not valid TOML ({_position(error)})") from None


def _yaml(path: Path, text: str) -> Any:
    import yaml  # noqa: PLC0415 - only for a YAML file

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unreadable"
        raise AgentFileError(f"{path}: not valid YAML ({where})") from None


def _position(error: tomllib.TOMLDecodeError) -> str:
    # Python 3.14 gives lineno/colno; before, the message ends with "(at line N, column M)".
    text = str(error)
    start = text.rfind("(at ")
    return text[start + 1 : -1] if start >= 0 and text.endswith(")") else "unreadable"


def _imported(module: str, attribute: str, source: str) -> Any:
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)  # as `python -m` does (and load_app): the user's module is where they are
    try:
        found: Any = importlib.import_module(module)
    except ImportError as error:
        raise AgentFileError(f"{source}: module {module!r} cannot be imported ({error})") from error
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AgentFileError(f"{source}: {module!r} has no attribute {attribute!r}") from None
    return found
