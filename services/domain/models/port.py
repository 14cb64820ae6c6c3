"""The model port: what a planner, summarizer or extractor asks of a language model.

Adapters: `ScriptedModel` (offline, deterministic) and `AnthropicModel` (the Messages API through
the `anthropic` SDK — the only module allowed to import it). Both take a transcript of
`quipu.contracts.transcript.Message` and answer with parts in the order the model produced them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from quipu.contracts.errors import QuipuError
from quipu.contracts.transcript import Message, Part

ThinkingMode = Literal["enabled", "adaptive"]
"""How a thinking budget is sent: a fixed `budget_tokens`, or adaptive thinking."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description and JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """One model call."""

    system: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 1024
    """Most output tokens of the answer, thinking included (as the Messages API counts them)."""
    thinking_budget: int = 0
    """0 disables extended thinking; otherwise the thinking token budget (below `max_tokens`)."""
    output_schema: dict[str, Any] | None = None
    """When set, the answer must be one JSON object of this schema (structured output)."""
    call_key: str = ""
    """Deterministic key of this call (run id + step): scripted models pick their answer by it."""
    model: str = ""
    """The model to ask (an agent's own); "" asks the adapter's default (the deployment's)."""


class StopReason(StrEnum):
    """Why the model stopped."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    REFUSAL = "refusal"


@dataclass(frozen=True)
class Usage:
    """Token counts of one call."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ModelResponse:
    """The assistant message's parts, in the order produced, and how the call ended."""

    parts: list[Part]
    stop_reason: StopReason
    usage: Usage
    model: str


TextDelta = Callable[[str], Awaitable[None]]
"""Called with each piece of answer text as it is generated (for `assistant_reply` events)."""


class ModelError(QuipuError):
    """Raised by an adapter when a call fails; `retryable` (per instance) separates 429, 5xx,
    overloaded and timeouts from 4xx, as the adapter classified the provider's answer."""

    def __init__(self, message: str, *, kind: str, retryable: bool, http_status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.http_status = http_status


class ModelClient(Protocol):
    """A language model behind the port."""

    name: str

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        """Answer one request; stream answer text through `on_text` while it is generated."""
        ...

    async def count_tokens(self, request: ModelRequest) -> int:
        """Input tokens the request would cost (a local estimate where the provider has no counter)."""
        ...
