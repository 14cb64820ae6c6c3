"""The tools Quipu ships with: `current_time`, `calculator`, `notes` and `ask_user`.

`calculator` and `ask_user` are written as a user writes a tool (`quipu.tools.tool` on a typed
function): their definition and their implementation are one object, and the planner and the
tool executor read the same one. `current_time` and `notes` need a clock and a notebook the
executor provides (`quipu.services.tool_executor.adapters`), so here they are definitions only.

    catalog = default_catalog()          # what the planner offers and the executor runs
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from quipu.contracts.tools import AwaitInput, AwaitKind
from quipu.services.domain.calculator import Number, calculate
from quipu.services.domain.tool_catalog import ToolArguments, ToolCatalog, ToolDefinition
from quipu.tools import Toolset, tool

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


CURRENT_TIME_TOOL = ToolDefinition(
    name=CURRENT_TIME,
    description=(
        "The current date and time, in UTC or in the given IANA time zone. Use it whenever the "
        "answer depends on today's date or the time of day."
    ),
    arguments=CurrentTimeArguments,
    timeout_s=2.0,
    max_concurrency=32,
)

NOTES_TOOL = ToolDefinition(
    name=NOTES,
    description=(
        "A small notebook for the person you work for: 'set' saves a text under a key, 'get' "
        "reads it back, 'list' lists the keys. Notes outlive the conversation turn."
    ),
    arguments=NotesArguments,
    timeout_s=5.0,
    max_concurrency=8,
)

DEFAULT_TOOLS: tuple[ToolDefinition, ...] = (
    CURRENT_TIME_TOOL,
    calculator.definition,
    NOTES_TOOL,
    ask_user.definition,
)
"""The tools the tool executor ships with."""


def default_catalog(*toolsets: Toolset) -> ToolCatalog:
    """A new catalog of the shipped tools and then the tools of `toolsets` (each call a new one:
    registering agent-tools is local); a toolset's tool named like another is a ValueError."""
    return ToolCatalog(
        [*DEFAULT_TOOLS, *(definition for toolset in toolsets for definition in toolset.definitions())]
    )
