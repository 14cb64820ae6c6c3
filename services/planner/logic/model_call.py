"""The model call: its request, the record of its answer, its failure, its reply deltas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import Failure
from quipu.contracts.store import Record
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED, Message, encode_messages
from quipu.services.domain.models.port import ModelRequest, ModelResponse
from quipu.services.planner.logic.context import compacted_messages
from quipu.services.planner.logic.dispatch import ToolInfo
from quipu.services.planner.logic.keys import MODEL_ERROR, assistant_key
from quipu.services.planner.logic.view import RunView, text_of


def model_failure(error_message: str, *, provider: str, code: str, http_status: int | None) -> Failure:
    """The failure of a run whose model call failed for good."""
    return Failure(
        message=error_message or "the model call failed",
        kind=MODEL_ERROR,
        provider=provider,
        operation="complete",
        code=code,
        http_status=http_status,
        retryable=False,
    )


def model_request(
    view: RunView,
    agent: AgentDefinition,
    tools: Mapping[str, ToolInfo],
    step: int,
    max_tokens_per_call: int,
    messages: Sequence[Message] | None = None,
) -> ModelRequest:
    """The request of model call `step`: the agent's prompt plus system blocks, the transcript, tools.

    The transcript is the run's messages as its latest compaction shows them, unless `messages`
    is given (the planner trying a compaction).
    """
    assert view.context is not None
    shown = compacted_messages(view.messages, view.compaction) if messages is None else list(messages)
    system = [agent.instructions, *(text_of(m) for m in shown if m.role == "system")]
    remaining = view.context.max_output_tokens - view.output_tokens
    max_tokens = max(1, min(max_tokens_per_call, remaining))
    thinking = agent.thinking_budget if agent.thinking_budget < max_tokens else 0
    return ModelRequest(
        system="\n\n".join(text for text in system if text),
        messages=[message for message in shown if message.role != "system"],
        tools=[tools[name].spec for name in agent.tools if name in tools],
        max_tokens=max_tokens,
        thinking_budget=thinking,
        call_key=f"{view.run_id}/step/{step}",
        model=agent.model or "",
    )


def model_records(view: RunView, step: int, response: ModelResponse, at: datetime) -> list[Record]:
    """The assistant message of call `step`: parts in the order produced, its usage in `meta`.

    One record, so the tokens a budget counts can never be lost between two appends; the owner
    streams the usage as a `usage` event when the record commits.
    """
    usage_fields = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "model": response.model,
        "stop_reason": response.stop_reason.value,
    }
    message = Message(role="assistant", parts=tuple(response.parts), meta={"usage": usage_fields})
    return [view.record(assistant_key(step), TRANSCRIPT_MESSAGES_APPENDED, encode_messages([message]), at)]


def reply_delta(view: RunView, step: int, index: int, text: str, at: datetime) -> RunEvent:
    """An `assistant_reply` event: one piece of answer text while call `step` generates it."""
    key = f"step/{step}/delta/{index}"
    return RunEvent(
        event_id=derive_id(view.run_id, key),
        occurred_at=at,
        type=StreamEventType.ASSISTANT_REPLY,
        event_key=key,
        run_id=view.run_id,
        session_id=view.session_id,
        timestamp=at,
        payload={"text": text, "step": step, "index": index},
    )
