"""Tool calls as the tool executor's tests send them: a request for one tool, and its answer.

request = tool_call("calculator", {"expression": "6*7"}, principal_id="ana")
result = await answer_of(runner, request)
"""

from __future__ import annotations

from typing import Any

from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.services.tool_executor.logic import ToolRunner


def tool_call(name: str, arguments: dict[str, Any] | None = None, **fields: Any) -> ToolCallRequested:
    """A request to run tool `name` on `arguments`, in run-1 of session-1, by person-1 (unless
    `fields` say otherwise; they set any field of the request)."""
    values: dict[str, Any] = {
        "run_id": "run-1",
        "session_id": "session-1",
        "agent_id": "agent-1",
        "principal_id": "person-1",
        "tool_use_id": f"toolu_{name}",
        "tool_name": name,
        "input": arguments or {},
        **fields,
    }
    return ToolCallRequested(**values)


async def answer_of(runner: ToolRunner, request: ToolCallRequested) -> ToolCallCompleted:
    """The result `runner` answers `request` with (it answers unless the request's run is canceled)."""
    result = await runner.run(request)
    assert result is not None
    return result
