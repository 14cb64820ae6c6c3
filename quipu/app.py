"""Your application: your agents and the toolsets that serve their tools, run with one command.

    import quipu

    weather = quipu.Toolset("weather", version="1")

    @weather.tool(timeout_s=20)
    async def forecast(city: str) -> str:
        '''Tomorrow's forecast for a city.'''

    forecaster = quipu.Agent(id="forecaster", instructions="...", tools=[forecast, "current_time"])
    app = quipu.App(agents=[forecaster], toolsets=[weather])

    quipu up --app mypkg.app:app                 # everything, your agents and tools included
    quipu serve tools --app mypkg.app:app        # the executor of the app's one toolset (any copies)
    quipu serve tools --app mypkg.app:app --toolset weather

What `App` checks when it is built, so a mistake is an error on your desk and not a failed run:
two toolsets of one name, two different agents of one id, a tool name two toolsets (or a toolset
and an agent, or a toolset and a shipped tool) both claim, and an agent naming a tool that nothing
serves. A tool an agent may use is one of: a tool of a toolset of the app (as the `Tool` object or
by name), a shipped tool (`current_time`, `calculator`, `notes`, `ask_user`, served by the
default executor every `quipu up` runs), another agent (an agent-tool: a child run), or a name
listed in `external_tools` (served by a toolset deployed elsewhere, e.g. another team's
`quipu serve tools`). A name that is none of these is an `AppError`, since it is almost always a
typo and the run would fail with `missing_tool`; the one exception is an app with a toolset whose
tools are only known once it is served (an MCP server): there an unknown name is accepted, and
`quipu up` checks it once the toolsets have announced their tools (`unserved_tools`). An agent
listed by object in another agent's tools belongs to the app too.

A toolset is a `quipu.Toolset`, or any object with the toolset protocol (`ServedToolset`): a
`name` and `version`, and `tool_names()` (a frozenset, or None when only the running server
knows, as for an MCP server's `quipu.McpToolset`); the executor serving it is the tool
executor's `ToolExecutorDeps.dedicated(toolset)`.

`load_app("mypkg.app:app")` finds the object a command was pointed at; `attr` may be an `App`,
a toolset, an agent, or a list or tuple of toolsets and agents (made into an App). Every
command that takes `--app` accepts any of these: `quipu up --app` runs all of it, `quipu serve
tools --app` one toolset of it. A spec that cannot be loaded is an `AppLoadError` saying why.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from quipu.agents import Agent
from quipu.contracts.agents import AgentDefinition
from quipu.contracts.errors import QuipuError
from quipu.contracts.tools import DEFAULT_TOOLSET
from quipu.services.domain.shipped_tools import SHIPPED_TOOL_NAMES
from quipu.services.domain.tool_catalog import TOOL_NAME_PATTERN
from quipu.tools import Tool, Toolset

__all__ = ["App", "AppError", "AppLoadError", "ServedToolset", "load_app", "shipped_tool_names"]


class AppError(QuipuError, ValueError):
    """An App that cannot run as declared: the message names the agent, toolset or tool at fault."""


class AppLoadError(QuipuError, LookupError):
    """`mod:attr` does not lead to an App, a toolset or agents: the message says which part failed."""


@runtime_checkable
class ServedToolset(Protocol):
    """A toolset that is not a `quipu.Toolset` (an MCP server's): what an App needs of it."""

    @property
    def name(self) -> str:
        """Its name: its topic is `tools.calls.<name>`."""

    @property
    def version(self) -> str:
        """Announced with its tools."""

    def tool_names(self) -> frozenset[str] | None:
        """The names of its tools, or None when they are known only once it is served."""


AnyToolset = Toolset | ServedToolset


def shipped_tool_names() -> frozenset[str]:
    """The tools the default executor serves in every `quipu up` (`current_time`, `calculator`, ...)."""
    return frozenset(SHIPPED_TOOL_NAMES)


def declared_tools(agent: AgentDefinition) -> Sequence[str | Tool[..., Any] | AgentDefinition]:
    """An agent's tools as its author gave them (`Tool` objects, names, agents), else as names."""
    return agent.declared_tools if isinstance(agent, Agent) else agent.tools


def tool_names(toolset: AnyToolset) -> frozenset[str] | None:
    """The names of a toolset's tools (None: known only once served)."""
    if isinstance(toolset, Toolset):
        return frozenset(each.name for each in toolset)
    return toolset.tool_names()


class App:
    """Agents and the toolsets serving their tools; see the module docstring for what is checked."""

    def __init__(
        self,
        agents: Iterable[AgentDefinition] = (),
        toolsets: Iterable[AnyToolset] = (),
        *,
        external_tools: Iterable[str] = (),
    ) -> None:
        self.toolsets: tuple[AnyToolset, ...] = _checked_toolsets(toolsets)
        self.agents: tuple[AgentDefinition, ...] = _with_callees(agents)
        self.external_tools: frozenset[str] = frozenset(external_tools)
        _check_tools(self)

    def toolset(self, name: str | None = None) -> AnyToolset:
        """The toolset called `name`, or the app's only one when `name` is None; AppError otherwise."""
        names = [each.name for each in self.toolsets]
        if name is None:
            if len(self.toolsets) == 1:
                return self.toolsets[0]
            if not self.toolsets:
                raise AppError("the app has no toolset")
            raise AppError(f"the app has {len(names)} toolsets ({', '.join(names)}); name one (--toolset)")
        for each in self.toolsets:
            if each.name == name:
                return each
        raise AppError(f"the app has no toolset {name!r}; it has: {', '.join(names) or 'none'}")

    def unserved_tools(self, announced: Iterable[str]) -> dict[str, list[str]]:
        """By agent id, the tools it names that nothing serves, once the tools `announced` (by the
        app's running toolsets) are known: what a toolset known only once served (an MCP server)
        turned out not to have. Empty when every agent can be served."""
        known = set(announced) | shipped_tool_names() | self.external_tools | {a.id for a in self.agents}
        for toolset in self.toolsets:
            known |= tool_names(toolset) or set()
        unserved = {agent.id: sorted(set(agent.tools) - known) for agent in self.agents}
        return {agent: tools for agent, tools in unserved.items() if tools}

    def __repr__(self) -> str:
        agents = [agent.id for agent in self.agents]
        return f"App(agents={agents}, toolsets={[each.name for each in self.toolsets]})"


def _checked_toolsets(toolsets: Iterable[AnyToolset]) -> tuple[AnyToolset, ...]:
    by_name: dict[str, AnyToolset] = {}
    for toolset in toolsets:
        if not isinstance(toolset, Toolset | ServedToolset):
            raise AppError(f"{toolset!r} is not a toolset (a quipu.Toolset or a quipu.McpToolset)")
        if not TOOL_NAME_PATTERN.fullmatch(toolset.name):
            raise AppError(f"toolset name {toolset.name!r} must match {TOOL_NAME_PATTERN.pattern}")
        if toolset.name == DEFAULT_TOOLSET:
            raise AppError(f"the toolset name {DEFAULT_TOOLSET!r} is the shipped tools'; choose another")
        if toolset.name in by_name and by_name[toolset.name] is not toolset:
            raise AppError(f"two toolsets are named {toolset.name!r}; a toolset's name is its topic")
        by_name[toolset.name] = toolset
    return tuple(by_name.values())


def _with_callees(agents: Iterable[AgentDefinition]) -> tuple[AgentDefinition, ...]:
    """The agents, and every agent one of them names by object in its tools, once each."""
    found: dict[str, AgentDefinition] = {}
    pending = list(agents)
    while pending:
        agent = pending.pop(0)
        if not isinstance(agent, AgentDefinition):
            raise AppError(f"{agent!r} is not an agent (a quipu.Agent)")
        known = found.get(agent.id)
        if known is not None:
            if known is not agent and known != agent:
                raise AppError(f"two different agents have the id {agent.id!r}")
            continue
        found[agent.id] = agent
        pending.extend(each for each in declared_tools(agent) if isinstance(each, AgentDefinition))
    return tuple(found.values())


def _check_tools(app: App) -> None:
    shipped = shipped_tool_names()
    served: dict[str, str] = {}  # tool name -> the toolset serving it
    open_ended = [each.name for each in app.toolsets if tool_names(each) is None]
    for toolset in app.toolsets:
        for name in sorted(tool_names(toolset) or ()):
            if name in served:
                raise AppError(f"tool {name!r} is in toolsets {served[name]!r} and {toolset.name!r}")
            if name in shipped:
                raise AppError(f"toolset {toolset.name!r} has a tool {name!r}, the name of a shipped tool")
            served[name] = toolset.name
    agent_ids = {agent.id for agent in app.agents}
    for agent in app.agents:
        if agent.id in served or agent.id in shipped:
            raise AppError(f"agent {agent.id!r} has the name of a tool; agents are called by id")
        for each in declared_tools(agent):
            _check_tool(agent.id, each, app, served, shipped | agent_ids | app.external_tools, open_ended)


def _check_tool(
    agent: str,
    tool: str | Tool[..., Any] | AgentDefinition,
    app: App,
    served: dict[str, str],
    known: frozenset[str] | set[str],
    open_ended: list[str],
) -> None:
    if isinstance(tool, AgentDefinition):
        return
    if isinstance(tool, Tool):
        holder = next((ts for ts in app.toolsets if isinstance(ts, Toolset) and tool.name in ts), None)
        if holder is not None and holder.get(tool.name) is not tool:
            raise AppError(
                f"agent {agent!r} uses a tool {tool.name!r} that is not the one of toolset {holder.name!r}"
            )
        if holder is None and tool.name not in shipped_tool_names():
            raise AppError(
                f"agent {agent!r} uses tool {tool.name!r}, which no toolset of the app holds: add it to "
                f"one (quipu.Toolset('name', tools=[{tool.name}])) and the toolset to App(toolsets=...)"
            )
        return
    if tool in served or tool in known:
        return
    if open_ended:
        return  # perhaps a tool of theirs: `quipu up` checks once they are served (`unserved_tools`)
    offered = sorted({*served, *known} - {agent})
    raise AppError(
        f"agent {agent!r} uses tool {tool!r}, which nothing serves: not a tool of the app's toolsets, "
        f"a shipped tool or an agent (known: {', '.join(offered)}). A tool served by another "
        "deployment goes in App(external_tools=[...])"
    )


# --- loading `mod:attr` ----------------------------------------------------------------------------


def load_app(spec: str) -> App:
    """The App `spec` (`package.module:attribute`) names; see the module docstring for what it may be.

    The current directory is searched first, as `python -m` does, so `quipu up --app app:app` finds
    `./app.py`. Raises AppLoadError saying what is wrong, or AppError for an App that fails its checks.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise AppLoadError(f"{spec!r} is not MODULE:ATTRIBUTE (e.g. mypkg.app:app)")
    value = _attribute(_module(module_name), module_name, attribute)
    return as_app(value, spec)


def as_app(value: object, where: str = "it") -> App:
    """`value` as an App: an App itself, a toolset, an agent, or a list or tuple of those."""
    if isinstance(value, App):
        return value
    items = list(value) if isinstance(value, list | tuple) else [value]
    toolsets = [item for item in items if isinstance(item, Toolset | ServedToolset)]
    agents = [item for item in items if isinstance(item, AgentDefinition)]
    others = [item for item in items if not isinstance(item, Toolset | ServedToolset | AgentDefinition)]
    if others or not items:
        found = type(others[0]).__name__ if others else "an empty list"
        raise AppLoadError(
            f"{where} is {found}: expected a quipu.App, a toolset (quipu.Toolset, quipu.McpToolset), "
            "an agent (quipu.Agent), or a list of toolsets and agents"
        )
    return App(agents=agents, toolsets=toolsets)


def _module(name: str) -> Any:
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)  # as `python -m` and uvicorn do: the user's module is where they are
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(f"{error.name}.")):
            raise AppLoadError(
                f"no module {name!r} (looked in {here} and the installed packages; run the command "
                "where the module is, or set PYTHONPATH)"
            ) from error
        raise AppLoadError(f"module {name!r} imports {error.name!r}, which is not installed") from error
    except AppError:
        raise  # the app it builds fails its checks: that message says it best
    except Exception as error:
        raise AppLoadError(f"importing {name!r} failed: {type(error).__name__}: {error}") from error


def _attribute(module: Any, module_name: str, attribute: str) -> object:
    value: object = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            candidates = sorted(
                name
                for name, each in vars(module).items()
                if isinstance(each, App | Toolset | ServedToolset | AgentDefinition)
            )
            hint = f"; it has: {', '.join(candidates)}" if candidates else ""
            raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r}{hint}")
        value = getattr(value, part)
    return value
