"""AnthropicModel through the real `anthropic` SDK against a local Messages API server.

Nothing here reaches the network: the SDK's `base_url` is `tests/support/messages_api.py`, which
records what the SDK sent (so the encoding is checked on the wire) and answers with scripted
streams, JSON messages and failures (so decoding, retries and error kinds are checked too).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import anthropic
import pytest

from quipu.contracts.transcript import (
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from quipu.services.domain.models.anthropic import AnthropicModel
from quipu.services.domain.models.factory import ModelSettings, make_model
from quipu.services.domain.models.port import ModelError, ModelRequest, StopReason, ToolSpec
from tests.support.messages_api import (
    Delayed,
    DropConnection,
    ErrorReply,
    MessageReply,
    MessagesApiServer,
    StreamReply,
    message_events,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from tests.support.transcripts import assistant, user
from tests.timing import scaled

FAST_RETRY = {"retry-after-ms": "10"}
CALCULATOR = ToolSpec(
    name="calculator",
    description="Evaluates an arithmetic expression.",
    input_schema={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)


@pytest.fixture
async def server() -> AsyncIterator[MessagesApiServer]:
    async with MessagesApiServer() as running:
        yield running


@pytest.fixture
async def model(server: MessagesApiServer) -> AsyncIterator[AnthropicModel]:
    adapter = AnthropicModel(
        api_key="sk-local", model="claude-test", base_url=server.base_url, timeout_s=5, max_retries=2
    )
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def no_retry_model(server: MessagesApiServer) -> AsyncIterator[AnthropicModel]:
    adapter = AnthropicModel(
        api_key="sk-local", model="claude-test", base_url=server.base_url, timeout_s=0.3, max_retries=0
    )
    yield adapter
    await adapter.aclose()


def ask(text_value: str = "What is 6*7?", **options: Any) -> ModelRequest:
    return ModelRequest(system="You are Quipu.", messages=[user(TextPart(text=text_value))], **options)


class Collector:
    """An `on_text` callback that keeps what it is given."""

    def __init__(self) -> None:
        self.chunks: list[str] = []

    async def __call__(self, delta: str) -> None:
        self.chunks.append(delta)


# --- answers ------------------------------------------------------------------------------------


async def test_a_streamed_answer_keeps_the_parts_in_order_and_streams_only_answer_text(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    server.enqueue(
        MessageReply(
            content=[
                thinking("First I multiply.", "sig-abc"),
                redacted_thinking("opaque-data=="),
                text("Let me calculate."),
                tool_use("toolu_01", "calculator", {"expression": "6*7", "precision": 0.5}),
            ],
            stop_reason="tool_use",
            input_tokens=12,
            output_tokens=30,
            cache_creation_input_tokens=3,
            cache_read_input_tokens=100,
            model="claude-test-20990101",
            chunk_chars=4,
        )
    )
    collected = Collector()
    response = await model.complete(ask(tools=[CALCULATOR], max_tokens=4096, thinking_budget=2048), collected)

    assert response.parts == [
        ThinkingPart(text="First I multiply.", signature="sig-abc", index=0, final=False),
        ThinkingPart(redacted=b"opaque-data==", index=1, final=True),
        TextPart(text="Let me calculate."),
        ToolUsePart(
            id="toolu_01", name="calculator", input={"expression": "6*7", "precision": Decimal("0.5")}
        ),
    ]
    assert collected.chunks == ["Let ", "me c", "alcu", "late", "."]
    assert response.stop_reason is StopReason.TOOL_USE
    assert response.usage.input_tokens == 12 + 3 + 100  # cached input counts as input
    assert response.usage.output_tokens == 30
    assert response.model == "claude-test-20990101"
    assert server.message_requests[0].streamed


@pytest.mark.parametrize(
    ("api_reason", "stop_reason"),
    [
        ("end_turn", StopReason.END_TURN),
        ("stop_sequence", StopReason.END_TURN),
        ("max_tokens", StopReason.MAX_TOKENS),
        ("model_context_window_exceeded", StopReason.MAX_TOKENS),
        ("refusal", StopReason.REFUSAL),
    ],
)
async def test_stop_reasons_are_mapped(
    server: MessagesApiServer, model: AnthropicModel, api_reason: str, stop_reason: StopReason
) -> None:
    server.enqueue(MessageReply(content=[text("ok")], stop_reason=api_reason))
    assert (await model.complete(ask())).stop_reason is stop_reason


async def test_structured_output_asks_for_the_schema_and_returns_the_json_text(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    schema = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}
    server.enqueue(MessageReply(content=[text('{"summary": "6*7 asked"}')]))
    response = await model.complete(ask(output_schema=schema))
    assert server.message_requests[0].body["output_config"] == {
        "format": {"type": "json_schema", "schema": schema}
    }
    assert response.parts == [TextPart(text='{"summary": "6*7 asked"}')]
    assert json.loads(response.parts[0].text) == {"summary": "6*7 asked"}  # type: ignore[union-attr]


async def test_an_answer_block_the_transcript_cannot_hold_is_an_invalid_response(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    server.enqueue(
        MessageReply(
            content=[{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}]
        )
    )
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert (caught.value.kind, caught.value.retryable) == ("invalid_response", False)


async def test_a_failing_on_text_callback_is_not_a_model_error(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    async def broken(delta: str) -> None:
        raise LookupError("the stream consumer is gone")

    server.enqueue(MessageReply(content=[text("hello")]))
    with pytest.raises(LookupError):
        await model.complete(ask(), broken)


# --- what the SDK sends ---------------------------------------------------------------------------


async def test_the_request_on_the_wire(server: MessagesApiServer, model: AnthropicModel) -> None:
    transcript = [
        Message(role="system", parts=(TextPart(text="Policy: be brief."),)),
        user(TextPart(text="What is 6*7?")),
        assistant(
            ThinkingPart(text="Multiply.", signature="sig-1", final=True),
            TextPart(text="Calling calculator."),
            ToolUsePart(id="call/1", name="calculator", input={"expression": "6*7", "scale": Decimal("1.5")}),
        ),
        user(ToolResultPart(tool_use_id="call/1", content={"result": 42})),
    ]
    request = ModelRequest(
        system="You are Quipu.",
        messages=transcript,
        tools=[CALCULATOR],
        max_tokens=4000,
        thinking_budget=1024,
    )
    await model.complete(request)

    (sent,) = server.message_requests
    assert sent.method == "POST"
    assert sent.headers["authorization"] == "Bearer sk-local"
    assert "anthropic-version" in sent.headers
    body = sent.body
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["max_tokens"] == 4000  # as in the API, thinking included
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["system"] == [
        {"type": "text", "text": "You are Quipu."},
        {"type": "text", "text": "Policy: be brief.", "cache_control": {"type": "ephemeral"}},
    ]
    assert body["tools"] == [
        {"name": "calculator", "description": CALCULATOR.description, "input_schema": CALCULATOR.input_schema}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Multiply.", "signature": "sig-1"},
                {"type": "text", "text": "Calling calculator."},
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "calculator",
                    "input": {"expression": "6*7", "scale": 1.5},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": '{"result":42}', "is_error": False}
            ],
        },
    ]
    assert "output_config" not in body


async def test_a_plain_request_sends_no_optional_fields(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    await model.complete(ModelRequest(system="", messages=[user(TextPart(text="hi"))]))
    body = server.message_requests[0].body
    assert set(body) == {"model", "max_tokens", "messages", "stream"}
    assert body["max_tokens"] == 1024


async def test_the_system_prompt_alone_carries_the_cache_marker(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    await model.complete(ask())
    assert server.message_requests[0].body["system"] == [
        {"type": "text", "text": "You are Quipu.", "cache_control": {"type": "ephemeral"}}
    ]


async def test_adaptive_thinking_mode(server: MessagesApiServer) -> None:
    adaptive = AnthropicModel(
        api_key="k",
        model="claude-opus-4-7",
        base_url=server.base_url,
        timeout_s=5,
        max_retries=0,
        thinking_mode="adaptive",
    )
    try:
        await adaptive.complete(ask(thinking_budget=4096))
    finally:
        await adaptive.aclose()
    body = server.message_requests[0].body
    assert body["thinking"] == {"type": "adaptive"}
    assert body["max_tokens"] == 1024  # adaptive thinking has no budget to fit under max_tokens


async def test_a_transcript_the_api_cannot_carry_fails_before_sending(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    request = ModelRequest(system="", messages=[user(ImagePart(format="png", bytes=b"\x89PNG"))])
    with pytest.raises(ModelError) as caught:
        await model.complete(request)
    assert (caught.value.kind, caught.value.retryable) == ("invalid_request", False)
    assert server.requests == []


async def test_a_thinking_budget_must_fit_under_max_tokens(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    with pytest.raises(ModelError) as caught:
        await model.complete(ask(max_tokens=1024, thinking_budget=1024))
    assert (caught.value.kind, caught.value.retryable) == ("invalid_request", False)
    assert server.requests == []


async def test_a_request_naming_its_model_asks_that_model_else_the_default(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    """An agent's own model (`Agent(model=...)`) reaches the API; without one, the deployment's."""
    await model.complete(ModelRequest(system="", messages=[user(TextPart(text="hi"))], model="claude-agent"))
    await model.complete(ModelRequest(system="", messages=[user(TextPart(text="hi"))]))
    server.count_tokens_result = 5
    await model.count_tokens(
        ModelRequest(system="", messages=[user(TextPart(text="hi"))], model="claude-agent")
    )
    assert [sent.body["model"] for sent in server.message_requests] == ["claude-agent", "claude-test"]
    (counted,) = server.requests_to("/v1/messages/count_tokens")
    assert counted.body["model"] == "claude-agent"


async def test_count_tokens_asks_the_api(server: MessagesApiServer, model: AnthropicModel) -> None:
    server.count_tokens_result = 321
    assert await model.count_tokens(ask(tools=[CALCULATOR], max_tokens=2048, thinking_budget=1024)) == 321
    (sent,) = server.requests_to("/v1/messages/count_tokens")
    assert set(sent.body) == {"model", "messages", "system", "tools", "thinking"}
    assert server.message_requests == []


async def test_make_model_with_a_key_talks_to_the_configured_server(
    server: MessagesApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUIPU_MODEL_PROVIDER", raising=False)
    settings = ModelSettings(
        api_key="sk-factory", base_url=server.base_url, name="claude-from-settings", max_retries=0
    )
    built = make_model(settings, max_poll_interval_ms=300_000)
    assert isinstance(built, AnthropicModel)
    try:
        response = await built.complete(ask())
    finally:
        await built.aclose()
    assert response.parts == [TextPart(text="Hello from the local Messages API.")]
    assert server.message_requests[0].headers["authorization"] == "Bearer sk-factory"
    assert server.message_requests[0].body["model"] == "claude-from-settings"


async def test_the_server_answers_non_streamed_requests_with_the_same_message(
    server: MessagesApiServer,
) -> None:
    reply = MessageReply(
        content=[thinking("t", "s"), text("answer"), tool_use("toolu_9", "calculator", {"a": [1, 2]})]
    )
    server.enqueue(reply, reply)
    client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, timeout=5, max_retries=0)
    try:
        plain = await client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
        async with client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            streamed = await stream.get_final_message()
    finally:
        await client.close()
    assert [block.to_dict() for block in plain.content] == reply.content
    assert [block.to_dict() for block in streamed.content] == reply.content
    assert not server.message_requests[0].streamed


# --- retries and errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        ErrorReply(429, "rate_limit_error", headers=FAST_RETRY),
        ErrorReply(529, "overloaded_error", headers=FAST_RETRY),
        ErrorReply(503, "api_error", headers=FAST_RETRY),
    ],
    ids=["429", "529", "503"],
)
async def test_the_sdk_retries_transient_failures_and_recovers(
    server: MessagesApiServer, model: AnthropicModel, failure: ErrorReply
) -> None:
    server.enqueue(failure, MessageReply(content=[text("recovered")]))
    response = await model.complete(ask())
    assert response.parts == [TextPart(text="recovered")]
    attempts = server.message_requests
    assert len(attempts) == 2
    assert [attempt.headers["x-stainless-retry-count"] for attempt in attempts] == ["0", "1"]
    assert attempts[0].body == attempts[1].body


async def test_a_server_error_that_persists_is_retryable_after_the_sdk_retries(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    server.always(ErrorReply(500, "api_error", headers=FAST_RETRY))
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    error = caught.value
    assert (error.kind, error.retryable, error.http_status) == ("server_error", True, 500)
    assert len(server.message_requests) == 3  # the first attempt and max_retries=2


@pytest.mark.parametrize(
    ("status", "error_type", "kind"),
    [
        (400, "invalid_request_error", "invalid_request"),
        (401, "authentication_error", "authentication"),
        (403, "permission_error", "permission"),
        (404, "not_found_error", "not_found"),
        (413, "request_too_large", "request_too_large"),
    ],
)
async def test_client_errors_are_not_retried(
    server: MessagesApiServer, model: AnthropicModel, status: int, error_type: str, kind: str
) -> None:
    server.always(ErrorReply(status, error_type, headers=FAST_RETRY))
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    error = caught.value
    assert (error.kind, error.retryable, error.http_status) == (kind, False, status)
    assert len(server.message_requests) == 1


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (ErrorReply(429, "rate_limit_error", headers=FAST_RETRY), "rate_limited"),
        (ErrorReply(529, "overloaded_error", headers=FAST_RETRY), "overloaded"),
    ],
)
async def test_transient_failures_that_outlast_the_retries_stay_retryable(
    server: MessagesApiServer, model: AnthropicModel, failure: ErrorReply, kind: str
) -> None:
    server.always(failure)
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert (caught.value.kind, caught.value.retryable, caught.value.http_status) == (
        kind,
        True,
        failure.status,
    )
    assert len(server.message_requests) == 3


async def test_a_reached_spend_limit_is_not_retryable(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    server.always(
        ErrorReply(
            429,
            "rate_limit_error",
            headers={"x-should-retry": "false"},
            error_code="enforced_spend_limit_reached",
        )
    )
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert (caught.value.kind, caught.value.retryable, caught.value.http_status) == (
        "spend_limit",
        False,
        429,
    )
    assert len(server.message_requests) == 1


async def test_an_error_event_inside_the_stream_is_classified_by_its_type(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    events = message_events(MessageReply(content=[text("Partial answer")]), "claude-test", "msg_1")[:5]
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.enqueue(StreamReply(events=[*events, ("error", overloaded)]))
    collected = Collector()
    with pytest.raises(ModelError) as caught:
        await model.complete(ask(), collected)
    assert (caught.value.kind, caught.value.retryable, caught.value.http_status) == ("overloaded", True, None)
    assert collected.chunks == ["Parti", "al an"]  # what streamed before the error reached on_text
    assert len(server.message_requests) == 1  # a stream that has started is not retried by the SDK


async def test_a_stream_that_ends_before_message_stop_is_a_connection_error(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    events = message_events(MessageReply(content=[text("cut short")]), "claude-test", "msg_1")
    server.enqueue(StreamReply(events=events[:-2]))  # no message_delta, no message_stop
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert (caught.value.kind, caught.value.retryable) == ("connection", True)


async def test_a_connection_dropped_mid_stream_is_a_connection_error(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    events = message_events(MessageReply(content=[text("cut short")]), "claude-test", "msg_1")
    server.enqueue(StreamReply(events=events[:4], abort=True))
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert (caught.value.kind, caught.value.retryable) == ("connection", True)


async def test_a_dropped_connection_is_retried_by_the_sdk(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    server.enqueue(DropConnection(), MessageReply(content=[text("second try")]))
    response = await model.complete(ask())
    assert response.parts == [TextPart(text="second try")]
    assert len(server.message_requests) == 2


async def test_a_dropped_connection_without_retries_left_is_retryable(
    server: MessagesApiServer, no_retry_model: AnthropicModel
) -> None:
    server.always(DropConnection())
    with pytest.raises(ModelError) as caught:
        await no_retry_model.complete(ask())
    assert (caught.value.kind, caught.value.retryable, caught.value.http_status) == ("connection", True, None)


async def test_a_slow_answer_times_out(server: MessagesApiServer, no_retry_model: AnthropicModel) -> None:
    server.enqueue(Delayed(2.0, MessageReply(content=[text("too late")])))
    with pytest.raises(ModelError) as caught:
        await no_retry_model.complete(ask())
    assert (caught.value.kind, caught.value.retryable) == ("timeout", True)


async def test_the_deadline_bounds_the_sdk_waiting_on_retry_after(server: MessagesApiServer) -> None:
    bounded = AnthropicModel(
        api_key="k", model="m", base_url=server.base_url, timeout_s=5, max_retries=2, deadline_s=0.3
    )
    server.always(ErrorReply(429, "rate_limit_error", headers={"retry-after": "3600"}))
    try:
        # Unbounded, the SDK would sleep out the retry-after (capped at a minute) and ask again.
        async with asyncio.timeout(scaled(10)):
            with pytest.raises(ModelError) as caught:
                await bounded.complete(ask())
    finally:
        await bounded.aclose()
    assert (caught.value.kind, caught.value.retryable) == ("timeout", True)
    assert len(server.message_requests) == 1


async def test_a_tool_input_the_sdk_cannot_parse_is_an_invalid_response_that_does_not_quote_it(
    server: MessagesApiServer, model: AnthropicModel
) -> None:
    # The SDK's own message quotes the model's JSON; a ModelError reaches logs, so it must not.
    marker = "the model's words about the blue flowerpot"
    events = message_events(
        MessageReply(content=[tool_use("tu_1", "calculator", {"expression": marker})]), "claude-test", "msg_1"
    )
    broken = [
        (
            name,
            {
                **data,
                "delta": {"type": "input_json_delta", "partial_json": '{"expression": "' + marker + '", ]'},
            },
        )
        if data.get("type") == "content_block_delta"
        else (name, data)
        for name, data in events
    ]
    server.enqueue(StreamReply(events=broken))
    with pytest.raises(ModelError) as caught:
        await model.complete(ask(tools=[CALCULATOR]))
    assert caught.value.kind == "invalid_response"
    assert marker not in str(caught.value)
