"""`AnthropicModel`: the model port over the Messages API, through the `anthropic` SDK.

This is the only module that imports `anthropic` (and its HTTP client, `httpx2`). A request is
encoded with `encode_anthropic_messages` (STORE_CONTRACT §10) and always streamed, so answer text
reaches `on_text` while it is generated and long answers never hit the SDK's refusal of slow
non-streamed calls. The final message's content is decoded with `decode_anthropic_content`, so
the parts keep the order the model produced them in: signed or redacted thinking, text, tool
uses.

What is sent:

- `system`: `request.system` as a text block, then the transcript's system messages; the last
  system block carries `cache_control: {"type": "ephemeral"}`, so tools and system prompt form
  one cached prefix (prompt caching).
- `tools`: `request.tools` as `{name, description, input_schema}`.
- `thinking` when `request.thinking_budget > 0`: `{"type": "enabled", "budget_tokens": N}` in
  the default `"enabled"` mode, or `{"type": "adaptive"}` in `"adaptive"` mode (Claude Opus 4.7
  and later reject the enabled form with a 400). `max_tokens` is `request.max_tokens` as is:
  as in the API it includes the thinking, so an enabled budget must be below it (else the call
  fails with `invalid_request` before anything is sent).
- `output_config: {"format": {"type": "json_schema", "schema": ...}}` when
  `request.output_schema` is set; the JSON answer comes back as a text part.

Failures raise `ModelError`. Retryable (the SDK has already retried them `max_retries` times):
429 `rate_limited`, 529 or `overloaded_error` `overloaded`, other 5xx `server_error`, 408 and
timeouts `timeout`, 409 `conflict`, dropped or refused connections and streams that end early
`connection`. Not retryable: 400/422 `invalid_request`, 401 `authentication`, 402 `billing`,
403 `permission`, 404 `not_found`, 413 `request_too_large`, a 429 for a reached spend limit
`spend_limit`, and an answer that cannot be decoded `invalid_response`. An error event inside
a stream is classified by its error type and has no `http_status`.

The whole call, the SDK's retries and its waits included, is bounded by `deadline_s`: the SDK's
`timeout` bounds each attempt's connect and each read, not the call, and it sleeps as long as a
`retry-after` header says. Keep `deadline_s` below the consumer's `max_poll_interval`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2

from quipu.contracts.transcript import TranscriptError
from quipu.services.domain.models.port import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    ThinkingMode,
    Usage,
)
from quipu.services.domain.transcript import decode_anthropic_content, encode_anthropic_messages

CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}
"""The prompt-cache marker put on the last system block."""

SDK_MAX_RETRY_DELAY_S = 8.0
"""The SDK's longest backoff between two attempts when the server names no wait."""

_STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "stop_sequence": StopReason.END_TURN,
    # Only server tools pause a turn, and none are offered: treat it as the end of the turn.
    "pause_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "model_context_window_exceeded": StopReason.MAX_TOKENS,
    "refusal": StopReason.REFUSAL,
}

_SPEND_LIMIT_CODES = frozenset({"enforced_spend_limit_reached", "contract_spend_limit_reached"})

# (kind, retryable) per HTTP status; 5xx not listed here are server errors.
_STATUS_KINDS: dict[int, tuple[str, bool]] = {
    400: ("invalid_request", False),
    401: ("authentication", False),
    402: ("billing", False),
    403: ("permission", False),
    404: ("not_found", False),
    408: ("timeout", True),
    409: ("conflict", True),
    413: ("request_too_large", False),
    422: ("invalid_request", False),
    429: ("rate_limited", True),
    529: ("overloaded", True),
}

# (kind, retryable) per API error type, for errors sent inside a stream (HTTP status 200).
_ERROR_TYPE_KINDS: dict[str, tuple[str, bool]] = {
    "invalid_request_error": ("invalid_request", False),
    "authentication_error": ("authentication", False),
    "billing_error": ("billing", False),
    "permission_error": ("permission", False),
    "not_found_error": ("not_found", False),
    "request_too_large": ("request_too_large", False),
    "rate_limit_error": ("rate_limited", True),
    "timeout_error": ("timeout", True),
    "api_error": ("server_error", True),
    "overloaded_error": ("overloaded", True),
}


def default_deadline_s(timeout_s: float, max_retries: int) -> float:
    """A deadline that lets every attempt use its whole timeout, plus the SDK's longest backoffs."""
    return timeout_s * (max_retries + 1) + SDK_MAX_RETRY_DELAY_S * max_retries


class AnthropicModel:
    """A `ModelClient` over the Anthropic Messages API (see the module docstring)."""

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str,
        timeout_s: float,
        max_retries: int,
        deadline_s: float | None = None,
        thinking_mode: ThinkingMode = "enabled",
    ) -> None:
        """Build the SDK client with every transport setting given explicitly.

        `timeout_s` is the SDK's per-attempt timeout and `max_retries` its retry count;
        `deadline_s` bounds a whole call (default: `default_deadline_s`).
        """
        if timeout_s <= 0 or max_retries < 0:
            raise ValueError("timeout_s must be positive and max_retries not negative")
        self.name = model
        self.thinking_mode: ThinkingMode = thinking_mode
        self.deadline_s = deadline_s if deadline_s is not None else default_deadline_s(timeout_s, max_retries)
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=max_retries
        )

    async def aclose(self) -> None:
        """Close the SDK client's connection pool."""
        await self._client.close()

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        """Stream one answer; answer text goes to `on_text` as it arrives. Raises ModelError."""
        params = self.message_params(request)
        try:
            async with asyncio.timeout(self.deadline_s):
                message = await self._stream(params, on_text)
        except TimeoutError as error:
            raise ModelError(
                f"model call exceeded its {self.deadline_s:g} s deadline", kind="timeout", retryable=True
            ) from error
        return self._response(message)

    async def count_tokens(self, request: ModelRequest) -> int:
        """Input tokens of the request, counted by the API (`messages.count_tokens`)."""
        params = self.message_params(request)
        del params["max_tokens"]
        try:
            async with asyncio.timeout(self.deadline_s):
                counted = await self._client.messages.count_tokens(**params)
        except TimeoutError as error:
            raise ModelError(
                f"token count exceeded its {self.deadline_s:g} s deadline", kind="timeout", retryable=True
            ) from error
        except (anthropic.APIError, httpx2.HTTPError) as error:
            raise model_error(error) from error
        return counted.input_tokens

    def message_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for `request` (without `stream`)."""
        try:
            transcript_system, messages = encode_anthropic_messages(request.messages)
        except TranscriptError as error:
            raise ModelError(
                f"transcript cannot be sent: {error}", kind="invalid_request", retryable=False
            ) from error
        system: list[dict[str, Any]] = [{"type": "text", "text": request.system}] if request.system else []
        system += transcript_system
        if system:
            system[-1] = {**system[-1], "cache_control": dict(CACHE_CONTROL)}
        params: dict[str, Any] = {
            "model": request.model or self.name,
            "max_tokens": request.max_tokens,
            "messages": messages,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [
                {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
                for tool in request.tools
            ]
        if request.thinking_budget > 0 and self.thinking_mode == "adaptive":
            params["thinking"] = {"type": "adaptive"}
        elif request.thinking_budget > 0:
            if request.thinking_budget >= request.max_tokens:
                raise ModelError(
                    f"thinking_budget {request.thinking_budget} must be below "
                    f"max_tokens {request.max_tokens}",
                    kind="invalid_request",
                    retryable=False,
                )
            params["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget}
        if request.output_schema is not None:
            params["output_config"] = {"format": {"type": "json_schema", "schema": request.output_schema}}
        return params

    async def _stream(self, params: dict[str, Any], on_text: TextDelta | None) -> anthropic.types.Message:
        try:
            async with self._client.messages.stream(**params) as stream:
                stopped = False
                async for event in _sdk_events(stream):
                    if event.type == "message_stop":
                        stopped = True
                    elif event.type == "text" and event.text and on_text is not None:
                        await on_text(event.text)
                if not stopped:
                    raise ModelError(
                        "the stream ended before message_stop", kind="connection", retryable=True
                    )
                return await stream.get_final_message()
        except (anthropic.APIError, httpx2.HTTPError) as error:
            # The request itself (status errors, retries exhausted); failures while reading the
            # stream are classified in `_sdk_events`, so a failing `on_text` stays its own error.
            raise model_error(error) from error

    def _response(self, message: anthropic.types.Message) -> ModelResponse:
        if message.stop_reason not in _STOP_REASONS:
            raise ModelError(
                f"unknown stop reason {message.stop_reason!r}", kind="invalid_response", retryable=False
            )
        try:
            parts = decode_anthropic_content([block.to_dict() for block in message.content])
        except TranscriptError as error:
            raise ModelError(
                f"answer cannot be decoded: {error}", kind="invalid_response", retryable=False
            ) from error
        usage = message.usage
        # Cached input is input the model read: the port counts all of it.
        input_tokens = (
            usage.input_tokens
            + (usage.cache_creation_input_tokens or 0)
            + (usage.cache_read_input_tokens or 0)
        )
        return ModelResponse(
            parts=parts,
            stop_reason=_STOP_REASONS[message.stop_reason],
            usage=Usage(input_tokens=input_tokens, output_tokens=usage.output_tokens),
            model=message.model,
        )


async def _sdk_events(stream: anthropic.AsyncMessageStream[Any]) -> AsyncIterator[Any]:
    """The stream's events, with SDK and transport failures turned into ModelError."""
    iterator = stream.__aiter__()
    while True:
        try:
            event = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except (anthropic.APIError, httpx2.HTTPError) as error:
            raise model_error(error) from error
        except ValueError as error:
            # The SDK's "Unable to parse tool parameter JSON" quotes the model's JSON: a ModelError
            # reaches logs, so it says what failed without repeating the model's words.
            raise ModelError(
                "malformed stream: the SDK could not parse an event (a tool input that is not JSON)",
                kind="invalid_response",
                retryable=True,
            ) from error
        yield event


def model_error(error: anthropic.APIError | httpx2.HTTPError) -> ModelError:
    """The ModelError for an SDK or transport failure (kinds in the module docstring)."""
    if isinstance(error, anthropic.APITimeoutError | httpx2.TimeoutException):
        return ModelError(str(error), kind="timeout", retryable=True)
    if isinstance(error, anthropic.APIConnectionError | httpx2.TransportError):
        return ModelError(str(error) or type(error).__name__, kind="connection", retryable=True)
    if isinstance(error, anthropic.APIStatusError):
        kind, retryable = _status_kind(error)
        status = error.status_code if error.status_code >= 400 else None
        return ModelError(str(error), kind=kind, retryable=retryable, http_status=status)
    return ModelError(str(error), kind="invalid_response", retryable=False)


def _status_kind(error: anthropic.APIStatusError) -> tuple[str, bool]:
    if error.error_code in _SPEND_LIMIT_CODES:
        return "spend_limit", False
    if error.status_code < 400:  # an error event inside a stream
        return _ERROR_TYPE_KINDS.get(str(error.type), ("server_error", True))
    if error.type == "overloaded_error":
        return "overloaded", True
    if error.status_code in _STATUS_KINDS:
        return _STATUS_KINDS[error.status_code]
    if error.status_code >= 500:
        return "server_error", True
    return "invalid_request", False
