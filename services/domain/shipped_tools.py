"""The tools Quipu ships with: `current_time`, `calculator`, `notes` and `ask_user`.

Each is written as a user writes a tool (`quipu.tools.tool` on a typed function): its definition
and its implementation are one object. `current_time` reads a clock and `notes` a notebook, which
are given to it (`current_time_tool(clock)`, `notes_tool(notebook)`), as a user's tool would be
built over its client. The default tool executor serves them as the default toolset
(`shipped_toolset()`, on `tools.calls`) and announces them on `tools.registry`; the planner knows
them only from that announcement.

    toolset = shipped_toolset(clock=system_clock, notebook=NotesStore())   # what the executor runs
    catalog = default_catalog()                                            # their definitions
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, StringConstraints, model_validator

from quipu.contracts.tools import DEFAULT_TOOLSET, AwaitInput, AwaitKind
from quipu.services.domain.calculator import Number, calculate
from quipu.services.domain.tool_catalog import ToolArguments, ToolCatalog
from quipu.tools import AnyTool, ToolContext, ToolError, Toolset, tool

CURRENT_TIME = "current_time"
CALCULATOR = "calculator"
NOTES = "notes"
ASK_USER = "ask_user"


@tool(timeout_s=2.0, max_concurrency=8)
async def calculator(
    expression: Annotated[str, Field(min_length=1, max_length=500)],
) -> dict[str, str | Number]:
    """Evaluates an arithmetic expression exactly as written and returns the number.
    Supports + - * / // % **, parentheses and unary minus on integers and decimals.

    Args:
        expression: Arithmetic expression: numbers, + - * / // % **, parentheses and unary
            minus, e.g. '(17.5 - 2) * 3 ** 2'. No variables or functions.
    """
    return {"expression": expression, "result": calculate(expression)}


Choice = Annotated[str, StringConstraints(min_length=1, max_length=200)]


@tool(timeout_s=2.0, max_concurrency=32, awaits_input=True)
async def ask_user(
    question: Annotated[str, Field(min_length=1, max_length=2000)],
    choices: Annotated[list[Choice] | None, Field(min_length=1, max_length=20)] = None,
) -> AwaitInput:
    """Asks the user a clarifying question and waits for the answer. Use it only when you
    cannot go on without the answer; offer choices when there are a few possible answers.

    Args:
        question: The question to put to the user.
        choices: Answers to offer, when the question has a few possible answers.
    """
    return AwaitInput(kind=AwaitKind.CLARIFICATION, prompt=question, details={"choices": list(choices or [])})


class CurrentTimeArguments(ToolArguments):
    """Arguments of `current_time`."""

    timezone: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="IANA time zone name such as 'Europe/Madrid' or 'America/New_York'; UTC if omitted.",
    )


NoteAction = Literal["get", "set", "list"]


class NotesArguments(ToolArguments):
    """Arguments of `notes`."""

    action: NoteAction = Field(
        description="'set' saves value under key, 'get' reads the note under key, 'list' lists the keys."
    )
    key: str | None = Field(
        default=None, min_length=1, max_length=200, description="Name of the note (get and set)."
    )
    value: str | None = Field(default=None, max_length=4000, description="Text to save (set only).")

    @model_validator(mode="after")
    def _fits_action(self) -> NotesArguments:
        if self.action in ("get", "set") and self.key is None:
            raise ValueError(f"action {self.action!r} needs a key")
        if self.action == "set" and self.value is None:
            raise ValueError("action 'set' needs a value")
        if self.action != "set" and self.value is not None:
            raise ValueError(f"action {self.action!r} takes no value")
        return self


Clock = Callable[[], datetime]
"""The current time, timezone-aware."""


def system_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def current_time_tool(clock: Clock = system_clock) -> AnyTool:
    """The `current_time` tool, reading `clock`."""

    @tool(name=CURRENT_TIME, timeout_s=2.0, max_concurrency=32)
    async def current_time(arguments: CurrentTimeArguments) -> dict[str, str]:
        """The current date and time, in UTC or in the given IANA time zone. Use it whenever the
        answer depends on today's date or the time of day."""
        name = arguments.timezone or "UTC"
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Madrid'") from None
        now = clock().astimezone(zone)
        return {
            "timezone": name,
            "iso": now.isoformat(timespec="seconds"),
            "date": now.date().isoformat(),
            "time": now.strftime("%H:%M:%S"),
            "weekday": now.strftime("%A"),
            "utc_offset": now.strftime("%z"),
        }

    return current_time


NOTES_PER_SCOPE = 200
"""Most notes one person (or session) keeps."""


class NotesStore:
    """Notes by scope and key, in the process that serves `notes`.

    That is enough for the demo: a redelivered call finds its result in the executor's record
    and is not run again. It is not shared between executor copies nor kept across restarts
    (notes written through one copy are not seen by another); a notebook that must outlive the
    process is a tool of your own over a store of your own.
    """

    def __init__(self, max_notes: int = NOTES_PER_SCOPE) -> None:
        self._max_notes = max_notes
        self._notes: dict[tuple[str, str], dict[str, str]] = {}

    @staticmethod
    def scope(context: ToolContext) -> tuple[str, str]:
        """Whose notebook a call reads: the person's, else the session's, else the run's; per tenant."""
        if context.principal_id:
            owner = f"principal:{context.principal_id}"
        elif context.session_id:
            owner = f"session:{context.session_id}"
        else:
            owner = f"run:{context.run_id}"
        return (context.tenant_id, owner)

    def get(self, scope: tuple[str, str], key: str) -> str | None:
        """The note under `key`, if any."""
        return self._notes.get(scope, {}).get(key)

    def set(self, scope: tuple[str, str], key: str, value: str) -> None:
        """Save a note; raises ToolError when the notebook is full."""
        notes = self._notes.setdefault(scope, {})
        if key not in notes and len(notes) >= self._max_notes:
            raise ToolError(f"the notebook is full ({self._max_notes} notes); overwrite an existing key")
        notes[key] = value

    def keys(self, scope: tuple[str, str]) -> list[str]:
        """Every key, sorted."""
        return sorted(self._notes.get(scope, {}))


def notes_tool(notebook: NotesStore) -> AnyTool:
    """The `notes` tool over `notebook`."""

    @tool(name=NOTES, timeout_s=5.0, max_concurrency=8)
    async def notes(arguments: NotesArguments, context: ToolContext) -> dict[str, Any]:
        """A small notebook for the person you work for: 'set' saves a text under a key, 'get'
        reads it back, 'list' lists the keys. Notes outlive the conversation turn."""
        scope = NotesStore.scope(context)
        if arguments.action == "list":
            return {"keys": notebook.keys(scope)}
        key = arguments.key or ""
        if arguments.action == "set":
            notebook.set(scope, key, arguments.value or "")
            return {"key": key, "saved": True}
        value = notebook.get(scope, key)
        return {"key": key, "found": value is not None, "value": value}

    return notes


SHIPPED_TOOLS_VERSION = "1"


def shipped_toolset(*, clock: Clock = system_clock, notebook: NotesStore | None = None) -> Toolset:
    """The shipped tools as the default toolset, `current_time` on `clock` and `notes` on
    `notebook` (a new, empty one by default)."""
    return Toolset(
        DEFAULT_TOOLSET,
        tools=[current_time_tool(clock), calculator, notes_tool(notebook or NotesStore()), ask_user],
        version=SHIPPED_TOOLS_VERSION,
    )


SHIPPED_TOOL_NAMES: tuple[str, ...] = (CURRENT_TIME, CALCULATOR, NOTES, ASK_USER)
"""The names of the tools the default executor serves, in the order it announces them."""


def default_catalog(*toolsets: Toolset) -> ToolCatalog:
    """A new catalog of the shipped tools and then the tools of `toolsets` (what the default executor
    serves with `ToolExecutorDeps.serving(*toolsets)`); a toolset's tool named like another is a
    ValueError."""
    served = [shipped_toolset(), *toolsets]
    return ToolCatalog(definition for toolset in served for definition in toolset.definitions())
