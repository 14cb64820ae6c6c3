"""Your own tools: plain typed functions, decorated with `@tool`, grouped in a `Toolset`.

    from quipu import ToolContext, ToolError, Toolset, tool

    @tool(timeout_s=5.0, max_concurrency=4)
    async def weather(city: str, units: Literal["C", "F"] = "C") -> dict[str, float]:
        '''The current temperature in a city.

        Args:
            city: The city's name, e.g. "Lima".
            units: Celsius or Fahrenheit.
        '''
        ...

    @tool
    def refund(order_id: str, amount: Decimal, context: ToolContext) -> str:
        '''Refunds part of an order.'''
        payments.refund(order_id, amount, idempotency_key=context.idempotency_key)
        return "refunded"

    shop = Toolset("shop", tools=[weather, refund], version="1.2.0")

What the decorator reads:

- the tool's **name** is the function's (or `name=`), its **description** the docstring's text
  before the parameter section (or `description=`); the model picks tools by it;
- the **arguments' JSON schema** comes from the parameters' annotations and defaults through
  pydantic (any type pydantic validates: `Literal`, `Annotated[int, Field(ge=1)]`, models,
  `list[...]`, `X | None`), each parameter described by its entry in the docstring (Google,
  NumPy, reST or Epydoc style) unless its `Field` says otherwise. Unknown arguments are refused;
- a parameter annotated `ToolContext` is not an argument: the executor passes the call's context;
- a function whose one argument is a `ToolArguments` model takes that model as its whole schema,
  and is called with the validated model: the way to state a rule across fields (a model
  validator). A parameter of any other model type is one nested argument.

How a call runs (in the tool executor): the model's arguments are validated first, and a schema
error goes back to the model as an error result naming each bad argument (never its value); the
function is called with the validated values: awaited when it is `async def`, in a worker thread
otherwise, so a blocking function never holds the event loop. A `ToolError("...")` is a message
for the model; any other exception becomes an error result too (its type and message), and is
logged with its type and frames only, never the input. The return value is the result: anything
JSON can carry, a pydantic model or a dataclass. A tool declared `awaits_input=True` returns an
`AwaitInput` (or the question as a `str`): the run suspends until someone answers, as `ask_user`
does.

`timeout_s` bounds one call (waiting for a slot included), `max_concurrency` how many calls of
the tool one executor runs at once. A call is delivered at least once: a tool with effects beyond
its result keys them by `context.idempotency_key`, which is the same for every delivery of one
tool use (after an executor crash too).

One module (about 500 lines) on purpose: it is the whole public surface of a tool, read top to
bottom by someone writing one; what the executor does with it lives in the tool executor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, ParamSpec, TypeVar, get_type_hints, overload

import docstring_parser
from pydantic import BaseModel, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from quipu.contracts.errors import QuipuError
from quipu.contracts.tools import AwaitInput, AwaitKind
from quipu.services.domain.models.port import ToolSpec
from quipu.services.domain.tool_catalog import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_TIMEOUT_S,
    TOOL_NAME_PATTERN,
    ArgumentError,
    ToolArguments,
    ToolCatalog,
    ToolDefinition,
)

__all__ = [
    "ArgumentError",
    "AwaitInput",
    "AwaitKind",
    "Cancellation",
    "Tool",
    "ToolArguments",
    "ToolContext",
    "ToolError",
    "ToolImplementation",
    "Toolset",
    "tool",
]

P = ParamSpec("P")
R = TypeVar("R")


class ToolError(QuipuError):
    """Raised by a tool for a failure the model should read and can act on (bad input, nothing found)."""


class Cancellation:
    """Set when nobody waits for a call any more: its run was canceled, or its deadline passed.

    An `async` tool is also interrupted (its task is canceled); a tool running in a thread cannot
    be, so it checks `is_set()` between steps of long work and stops early.
    """

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._waiters: list[asyncio.Event] = []

    def is_set(self) -> bool:
        """Whether the call was abandoned (safe to ask from any thread)."""
        return self._flag.is_set()

    def set(self) -> None:
        """Abandon the call (the executor does this; from the event loop's thread)."""
        self._flag.set()
        for waiter in self._waiters:
            waiter.set()

    def wait_in_thread(self, timeout: float | None = None) -> bool:
        """Block this (worker) thread until the call is abandoned or `timeout` passes; True if abandoned.

        For a tool that is not `async`: `while not context.cancellation.wait_in_thread(1.0): poll()`.
        """
        return self._flag.wait(timeout)

    async def wait(self) -> None:
        """Return once the call is abandoned (from the event loop)."""
        if self.is_set():
            return
        waiter = asyncio.Event()
        self._waiters.append(waiter)
        try:
            await waiter.wait()
        finally:
            self._waiters.remove(waiter)


NO_DEADLINE = float("inf")


@dataclass(frozen=True)
class ToolContext:
    """Whom one tool call is for and how long it may take: what a tool keys its effects by."""

    run_id: str
    tool_use_id: str
    session_id: str = ""
    agent_id: str = ""
    principal_id: str = ""
    tenant_id: str = ""
    deadline: datetime | None = None
    """When the executor stops waiting for this call (UTC); None outside an executor."""
    cancellation: Cancellation = field(default_factory=Cancellation, compare=False, repr=False)
    """Set when the call is abandoned (its run canceled, its deadline passed)."""
    deadline_monotonic: float = field(default=NO_DEADLINE, compare=False, repr=False)
    """`deadline` on `time.monotonic()`'s clock, for `seconds_left`."""

    @property
    def idempotency_key(self) -> str:
        """The same for every delivery of this tool use: key an effect by it so it happens once."""
        return self.tool_use_id

    @property
    def cancelled(self) -> bool:
        """Whether the call was abandoned; a long-running tool checks it between steps."""
        return self.cancellation.is_set()

    def seconds_left(self) -> float:
        """Seconds until the deadline (infinite outside an executor; negative once it passed)."""
        return self.deadline_monotonic - time.monotonic()

    def with_deadline(self, seconds: float, cancellation: Cancellation | None = None) -> ToolContext:
        """This context with a deadline `seconds` from now, and a cancellation of its own."""
        return dataclasses.replace(
            self,
            deadline=datetime.now(UTC) + timedelta(seconds=seconds),
            deadline_monotonic=time.monotonic() + seconds,
            cancellation=cancellation or Cancellation(),
        )


ToolImplementation = Callable[[Any, ToolContext], Awaitable[Any]]
"""How the executor calls a tool: validated arguments (its definition's model) and context in.

Out comes JSON content, or an `AwaitInput` for a tool that `awaits_input`. `Tool.run` is one.
"""


class Tool(Generic[P, R]):
    """A typed function as a tool: its `definition` (what the model sees, how it runs) and `run`.

    Calling the tool calls the function unchanged, so a test can call it directly.
    """

    def __init__(
        self,
        function: Callable[P, R],
        definition: ToolDefinition,
        context_parameter: str = "",
        model_parameter: str = "",
    ) -> None:
        self.function = function
        self.definition = definition
        self._context_parameter = context_parameter
        self._model_parameter = model_parameter
        self._is_async = inspect.iscoroutinefunction(function)
        self.__doc__ = function.__doc__
        self.__name__ = getattr(function, "__name__", definition.name)
        self.__wrapped__ = function

    @property
    def name(self) -> str:
        """The name the model calls this tool by."""
        return self.definition.name

    def spec(self) -> ToolSpec:
        """The tool as the model sees it: name, description, JSON schema of the arguments."""
        return self.definition.spec()

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    async def run(self, arguments: BaseModel, context: ToolContext) -> Any:
        """Call the function with validated `arguments` (`definition.arguments`) and `context`.

        Returns the result as JSON content (a model or dataclass dumped), or an `AwaitInput`.
        """
        if self._model_parameter:
            values: dict[str, Any] = {self._model_parameter: arguments}
        else:
            values = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        if self._context_parameter:
            values[self._context_parameter] = context
        function: Callable[..., Any] = self.function
        if self._is_async:
            value = await function(**values)
        else:
            # In a worker thread: a blocking tool must not hold the executor's event loop.
            value = await asyncio.to_thread(function, **values)
            if inspect.isawaitable(value):
                value = await value
        return self._content(value)

    def _content(self, value: Any) -> Any:
        if isinstance(value, AwaitInput):
            return value
        if self.definition.awaits_input and isinstance(value, str):
            return AwaitInput(kind=AwaitKind.CLARIFICATION, prompt=value)
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return to_jsonable_python(value)
        return value


@overload
def tool(function: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    awaits_input: bool = False,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    awaits_input: bool = False,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a typed function a tool (see the module docstring); `@tool` or `@tool(...)`.

    `name` and `description` default to the function's name and docstring; `timeout_s` bounds
    one call, `max_concurrency` the calls running at once in one executor; `awaits_input` makes
    it a tool that suspends the run for outside input. Raises TypeError for a function whose
    parameters cannot become a schema, ValueError for a name or limit no definition accepts.
    """

    def decorate(function: Callable[P, R]) -> Tool[P, R]:
        return _make_tool(
            function,
            name=name,
            description=description,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            awaits_input=awaits_input,
        )

    return decorate if function is None else decorate(function)


def _make_tool(
    function: Callable[P, R],
    *,
    name: str | None,
    description: str | None,
    timeout_s: float,
    max_concurrency: int,
    awaits_input: bool,
) -> Tool[P, R]:
    tool_name = str(name or getattr(function, "__name__", ""))
    docstring = docstring_parser.parse(inspect.getdoc(function) or "")
    arguments, context_parameter, model_parameter = _arguments_model(function, tool_name, docstring)
    definition = ToolDefinition(
        name=tool_name,
        description=description if description is not None else _description(docstring),
        arguments=arguments,
        timeout_s=timeout_s,
        max_concurrency=max_concurrency,
        awaits_input=awaits_input,
    )
    return Tool(function, definition, context_parameter, model_parameter)


def _description(docstring: docstring_parser.Docstring) -> str:
    """The docstring's text before its sections, each paragraph's wrapped lines joined again."""
    short, long = docstring.short_description or "", docstring.long_description or ""
    text = short + ("\n\n" if docstring.blank_after_short_description else "\n") + long
    paragraphs = [_unwrapped(paragraph) for paragraph in _BLANK_LINE.split(text.strip())]
    return "\n\n".join(paragraph for paragraph in paragraphs if paragraph)


_BLANK_LINE = re.compile(r"\n\s*\n")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")


def _unwrapped(paragraph: str) -> str:
    """Lines wrapped for the source joined into one; a list keeps one line per item."""
    lines: list[str] = []
    for line in paragraph.splitlines():
        if lines and not _LIST_ITEM.match(line):
            lines[-1] = f"{lines[-1]} {line.strip()}"
        else:
            lines.append(line.strip())
    return "\n".join(lines).strip()


def _arguments_model(
    function: Callable[..., Any], tool_name: str, docstring: docstring_parser.Docstring
) -> tuple[type[BaseModel], str, str]:
    """The pydantic model of the function's arguments, and the names of its ToolContext parameter
    and of its `ToolArguments` one (when that one parameter is the whole schema)."""
    try:
        hints = get_type_hints(function, include_extras=True)
    except NameError as error:
        raise TypeError(
            f"tool {tool_name!r}: an annotation names something not importable from its module: {error}"
        ) from None
    described = {param.arg_name: param.description for param in docstring.params if param.description}
    fields: dict[str, Any] = {}
    context_parameter = ""
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            raise TypeError(f"tool {tool_name!r}: parameter {parameter.name!r} must be passable by name")
        if parameter.name not in hints:
            raise TypeError(f"tool {tool_name!r}: parameter {parameter.name!r} needs a type annotation")
        annotation = hints[parameter.name]
        if annotation is ToolContext:
            context_parameter = parameter.name
            continue
        if parameter.name.startswith("_"):
            raise TypeError(f"tool {tool_name!r}: argument {parameter.name!r} must not start with '_'")
        fields[parameter.name] = (annotation, _field(parameter, described.get(parameter.name)))
    if len(fields) == 1:
        [(only, (whole, _))] = fields.items()
        if isinstance(whole, type) and issubclass(whole, ToolArguments):
            return whole, context_parameter, only
    model: type[BaseModel] = create_model(
        _model_name(tool_name),
        __base__=ToolArguments,
        __module__=getattr(function, "__module__", __name__),
        __doc__=f"Arguments of `{tool_name}`.",
        **fields,
    )
    return model, context_parameter, ""


def _field(parameter: inspect.Parameter, description: str | None) -> FieldInfo:
    default = parameter.default
    if isinstance(default, FieldInfo):
        if default.description is None and description:
            return FieldInfo.merge_field_infos(default, description=description)
        return default
    value = PydanticUndefined if default is inspect.Parameter.empty else default
    return FieldInfo(default=value, description=description)


def _model_name(tool_name: str) -> str:
    words = tool_name.replace("-", "_").split("_")
    return "".join(word[:1].upper() + word[1:] for word in words if word) + "Arguments"


AnyTool = Tool[..., Any]


class Toolset:
    """Tools published together under one name and version (what an executor serves).

        shop = Toolset("shop", tools=[weather, refund], version="1.2.0")

        @shop.tool(timeout_s=30)
        async def track(order_id: str) -> str: ...

    `definitions()` and `specs()` are what announcing the toolset tells the rest of the system;
    `catalog()` and `implementations()` what a tool executor runs it with.
    """

    def __init__(self, name: str, tools: Iterable[AnyTool] = (), *, version: str = "1") -> None:
        if not TOOL_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"toolset name {name!r} must match {TOOL_NAME_PATTERN.pattern}")
        if not version.strip():
            raise ValueError(f"toolset {name!r} needs a version")
        self.name = name
        self.version = version
        self._tools: dict[str, AnyTool] = {}
        for each in tools:
            self.add(each)

    def add(self, tool: AnyTool) -> AnyTool:
        """Add a tool; another tool of the same name is an error."""
        if not isinstance(tool, Tool):
            raise TypeError(f"toolset {self.name!r} takes tools made with @tool, not {tool!r}")
        existing = self._tools.get(tool.name)
        if existing is not None and existing is not tool:
            raise ValueError(f"toolset {self.name!r} already has a tool named {tool.name!r}")
        self._tools[tool.name] = tool
        return tool

    @overload
    def tool(self, function: Callable[P, R], /) -> Tool[P, R]: ...

    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        awaits_input: bool = False,
    ) -> Callable[[Callable[P, R]], Tool[P, R]]: ...

    def tool(
        self,
        function: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        awaits_input: bool = False,
    ) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
        """`@tool` that also adds the tool to this toolset."""

        def decorate(function: Callable[P, R]) -> Tool[P, R]:
            made = tool(
                name=name,
                description=description,
                timeout_s=timeout_s,
                max_concurrency=max_concurrency,
                awaits_input=awaits_input,
            )(function)
            self.add(made)
            return made

        return decorate if function is None else decorate(function)

    def get(self, name: str) -> AnyTool:
        """The tool called `name`; raises KeyError."""
        return self._tools[name]

    def definitions(self) -> list[ToolDefinition]:
        """Each tool's definition, in the order added."""
        return [each.definition for each in self._tools.values()]

    def specs(self) -> list[ToolSpec]:
        """Each tool as the model sees it, in the order added."""
        return [each.spec() for each in self._tools.values()]

    def implementations(self) -> dict[str, ToolImplementation]:
        """How the executor calls each tool, by name."""
        return {name: each.run for name, each in self._tools.items()}

    def catalog(self) -> ToolCatalog:
        """A new catalog of this toolset's definitions."""
        return ToolCatalog(self.definitions())

    def __iter__(self) -> Iterator[AnyTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"Toolset({self.name!r}, version={self.version!r}, tools={list(self._tools)})"
