"""`quipu.testing`: the function-driven model and `run_tool`, as a user's own tests use them."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

import quipu.testing
from quipu.contracts.transcript import Message
from quipu.testing import (
    ArgumentError,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextPart,
    ToolUsePart,
    Usage,
    run_tool,
)
from quipu.tools import ToolContext, tool


@tool
async def greet(name: Annotated[str, Field(min_length=1)], context: ToolContext) -> str:
    """Greets someone.

    Args:
        name: Who to greet.
    """
    return f"hello {name} from {context.run_id} ({context.idempotency_key})"


def _request(text: str) -> ModelRequest:
    return ModelRequest(system="Be brief.", messages=[Message(role="user", parts=[TextPart(text=text)])])


async def test_a_text_is_a_final_answer_streamed_in_chunks() -> None:
    model = FunctionModel(lambda request: f"you said {len(request.messages)} thing")
    streamed: list[str] = []

    async def collect(chunk: str) -> None:
        streamed.append(chunk)

    response = await model.complete(_request("hi"), collect)
    assert response.parts == [TextPart(text="you said 1 thing")]
    assert response.stop_reason is StopReason.END_TURN and response.model == "function"
    assert "".join(streamed) == "you said 1 thing"
    assert response.usage.input_tokens == await model.count_tokens(_request("hi"))
    assert response.usage.output_tokens > 0
    assert list(model.requests) == [_request("hi")]


async def test_parts_with_a_tool_use_make_a_tool_step_and_an_async_function_is_awaited() -> None:
    async def answer(request: ModelRequest) -> list[TextPart | ToolUsePart]:
        return [TextPart(text="Greeting."), ToolUsePart(id="toolu_1", name="greet", input={"name": "Ana"})]

    response = await FunctionModel(answer).complete(_request("greet Ana"))
    assert response.stop_reason is StopReason.TOOL_USE
    assert [part.kind for part in response.parts] == ["text", "tool_use"]


async def test_a_whole_response_is_returned_as_given() -> None:
    given = ModelResponse(
        parts=[TextPart(text="x")], stop_reason=StopReason.MAX_TOKENS, usage=Usage(), model="m"
    )
    assert await FunctionModel(lambda _request: given).complete(_request("hi")) is given


async def test_run_tool_validates_like_the_executor_and_passes_a_context() -> None:
    assert await run_tool(greet, {"name": "Ana"}) == "hello Ana from run-test (toolu_test)"
    context = ToolContext(run_id="run-9", tool_use_id="toolu_9")
    assert await run_tool(greet, {"name": "Bo"}, context) == "hello Bo from run-9 (toolu_9)"
    with pytest.raises(ArgumentError, match="name: String should have at least 1 character"):
        await run_tool(greet, {"name": ""})
    with pytest.raises(ArgumentError, match="shout: Extra inputs are not permitted"):
        await run_tool(greet, {"name": "Ana", "shout": True})


def test_every_exported_name_resolves() -> None:
    for name in quipu.testing.__all__:
        assert getattr(quipu.testing, name) is not None
