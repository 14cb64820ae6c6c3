"""What your own tests of agents and tools run on: offline models, and a tool called as the executor calls it.

- `ScriptedModel` is the model every service uses without an API key. Offered your own tools, it
  calls them (those the user's text names, else every one). A named tool's arguments are what the
  text says after its name (`name=value` pairs, the rest as its free-text parameter); the others
  are drawn to fit its JSON schema, deterministically per tool-use id. Then it answers with their
  results: a user's tools run end to end offline. The demo's phrases ("calculate 6*7", "note k=v",
  "ask me ...") still drive the shipped tools.
- `FunctionModel(function)` answers each `ModelRequest` with what your function returns: a text,
  a list of parts (`ToolUsePart`s make it a tool step) or a `ModelResponse`.
- `fitting_value(schema, seed=...)` is the argument generator on its own.
- `await run_tool(tool, {"city": "Lima"})` validates the arguments as the executor does (an
  `ArgumentError` with the model's text on a misfit) and calls the tool with a `ToolContext`.

Give a model to the planner with `PlannerDeps(model=...)`; no test needs a real model or a key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quipu.contracts.transcript import TextPart, ToolResultPart, ToolUsePart
from quipu.services.domain.models.fitting import fitting_value
from quipu.services.domain.models.function import FunctionModel, ModelAnswer, ModelFunction
from quipu.services.domain.models.port import ModelRequest, ModelResponse, StopReason, ToolSpec, Usage
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.domain.tool_catalog import ArgumentError
from quipu.tools import Tool, ToolContext

__all__ = [
    "ArgumentError",
    "FunctionModel",
    "ModelAnswer",
    "ModelFunction",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "StopReason",
    "TextPart",
    "ToolResultPart",
    "ToolSpec",
    "ToolUsePart",
    "Usage",
    "fitting_value",
    "run_tool",
]


async def run_tool(
    tool: Tool[..., Any], arguments: Mapping[str, Any], context: ToolContext | None = None
) -> Any:
    """The tool's result for `arguments`, validated first as the executor validates a model's.

    Raises ArgumentError (its text is what the model would read) and whatever the tool raises;
    `context` defaults to one of run `run-test`, tool use `toolu_test`, with a 60 s deadline.
    """
    validated = tool.definition.parse_arguments(arguments)
    given = context or ToolContext(run_id="run-test", tool_use_id="toolu_test").with_deadline(60.0)
    return await tool.run(validated, given)
