"""`FunctionModel`: a model whose every answer your function computes, for tests of your own agents.

    def answer(request: ModelRequest) -> ModelAnswer:
        if not any(isinstance(part, ToolResultPart) for part in request.messages[-1].parts):
            return [ToolUsePart(id="toolu_weather_1", name="weather", input={"city": "Lima"})]
        return "It is sunny in Lima."

    model = FunctionModel(answer)        # give it to the planner: PlannerDeps(model=model)

The function gets each `ModelRequest` (system prompt, transcript, offered tools) and returns a
text (the final answer), a list of parts (tool uses make it a `tool_use` step), or a whole
`ModelResponse`; it may be `async`. Usage is the local token estimate, and the answer's text is
streamed through `on_text` as a real model streams it.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from quipu.contracts.transcript import Part, TextPart, ToolUsePart
from quipu.services.domain.models.estimate import estimate_parts_tokens, estimate_request_tokens
from quipu.services.domain.models.port import ModelRequest, ModelResponse, StopReason, TextDelta, Usage
from quipu.services.domain.models.scripted import REQUESTS_KEPT, stream_text

ModelAnswer = ModelResponse | str | Sequence[Part]
"""What a model function returns: the whole response, a final text, or the answer's parts."""

ModelFunction = Callable[[ModelRequest], ModelAnswer | Awaitable[ModelAnswer]]
"""Computes the answer to one request (sync or async)."""


class FunctionModel:
    """A `ModelClient` answering each request with what `function` returns."""

    def __init__(self, function: ModelFunction, *, name: str = "function") -> None:
        self.name = name
        self._function = function
        self.requests: deque[ModelRequest] = deque(maxlen=REQUESTS_KEPT)
        """The last requests `complete` was given, in order."""

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        """The function's answer to `request`, its text streamed through `on_text`."""
        self.requests.append(request)
        answer = self._function(request)
        if inspect.isawaitable(answer):
            answer = await answer
        response = as_response(request, answer, self.name)
        await stream_text(response, on_text)
        return response

    async def count_tokens(self, request: ModelRequest) -> int:
        """The local estimate of the request's input tokens."""
        return estimate_request_tokens(request)


def as_response(request: ModelRequest, answer: ModelAnswer, model: str) -> ModelResponse:
    """`answer` as a response: a text or parts get the estimated usage and the stop reason they imply."""
    if isinstance(answer, ModelResponse):
        return answer
    parts: list[Part] = [TextPart(text=answer)] if isinstance(answer, str) else list(answer)
    stop = (
        StopReason.TOOL_USE if any(isinstance(part, ToolUsePart) for part in parts) else StopReason.END_TURN
    )
    usage = Usage(input_tokens=estimate_request_tokens(request), output_tokens=estimate_parts_tokens(parts))
    return ModelResponse(parts=parts, stop_reason=stop, usage=usage, model=model)
