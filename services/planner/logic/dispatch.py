"""Tools as the planner sees them, and the messages that start a step's tool uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quipu.contracts.envelope import derive_id
from quipu.contracts.runs import ParentToolCall, RunKind, RunRequested
from quipu.contracts.store import Record
from quipu.contracts.tools import ToolCallRequested
from quipu.contracts.transcript import ToolUsePart, encode_json_value
from quipu.services.domain.models.port import ToolSpec
from quipu.services.planner.logic.actions import Output, Trigger
from quipu.services.planner.logic.keys import TOOL_RESULT_TYPE, child_run_id, tool_result_key
from quipu.services.planner.logic.payloads import ToolResult
from quipu.services.planner.logic.view import RunView


@dataclass(frozen=True)
class ToolInfo:
    """A tool an agent may call: its model-facing spec, deadline, and the agent behind an agent-tool."""

    spec: ToolSpec
    timeout_s: float | None = None
    agent_id: str = ""
    """Non-empty for an agent-tool: calling it starts a child run of this agent."""

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.spec.name


def task_text(tool_input: Mapping[str, Any]) -> str:
    """The child's task from an agent-tool's input: `task` (or a lone string), else the JSON."""
    for key in ("task", "request", "question", "query", "prompt", "input", "text"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    strings = [value for value in tool_input.values() if isinstance(value, str) and value]
    if len(strings) == 1:
        return strings[0]
    return encode_json_value(dict(tool_input)).decode("utf-8")


def dispatch_outputs(
    view: RunView, step: int, uses: Sequence[ToolUsePart], tools: Mapping[str, ToolInfo], trigger: Trigger
) -> tuple[list[Output], list[Record]]:
    """Messages that start the pending tool uses, and error results for tools the agent lacks.

    Times and ids come from the step's assistant record, so a republished call is identical.
    """
    at = view.step_times.get(step, trigger.at)
    principal = view.context.principal_id if view.context is not None else ""
    tenant = view.context.tenant_id if view.context is not None else ""
    outputs: list[Output] = []
    local: list[Record] = []
    for use in uses:
        tool = tools.get(use.name)
        if tool is None:
            unknown = ToolResult(use.id, use.name, f"unknown tool {use.name!r}", is_error=True)
            local.append(view.record(tool_result_key(use.id), TOOL_RESULT_TYPE, unknown.encode(), trigger.at))
        elif tool.agent_id:
            outputs.append(
                RunRequested(
                    event_id=derive_id(view.run_id, f"step/{step}/child/{use.id}"),
                    occurred_at=at,
                    correlation_id=view.run_id,
                    causation_id=trigger.event_id,
                    tenant_id=tenant,
                    kind=RunKind.CHILD,
                    run_id=child_run_id(view.run_id, use.id),
                    session_id=view.session_id,
                    agent_id=tool.agent_id,
                    principal_id=principal,
                    text=task_text(use.input),
                    parent=ParentToolCall(
                        parent_run_id=view.run_id,
                        parent_agent_id=view.agent_id,
                        tool_call_id=use.id,
                        tool_name=use.name,
                    ),
                )
            )
        else:
            outputs.append(
                ToolCallRequested(
                    event_id=derive_id(view.run_id, f"step/{step}/call/{use.id}"),
                    occurred_at=at,
                    correlation_id=view.run_id,
                    causation_id=trigger.event_id,
                    tenant_id=tenant,
                    run_id=view.run_id,
                    session_id=view.session_id,
                    agent_id=view.agent_id,
                    principal_id=principal,
                    tool_use_id=use.id,
                    tool_name=use.name,
                    input=dict(use.input),
                    timeout_s=tool.timeout_s,
                )
            )
    return outputs, local
