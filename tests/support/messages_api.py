"""A local HTTP server that speaks the Anthropic Messages API, for tests.

The real `anthropic` SDK is pointed at it (`base_url=server.base_url`), so every request the
adapter builds is encoded, sent, streamed back and decoded by the SDK itself. The server is a
small HTTP/1.1 implementation over asyncio streams (keep-alive, chunked responses), with no
dependency beyond the standard library.

- `POST /v1/messages`: answers with the next queued reply (`enqueue`), else the `always` reply,
  else a short default text. A `MessageReply` is rendered as a JSON message, or, when the request
  asked for `"stream": true`, as server-sent events: `message_start`, a `ping`, per block
  `content_block_start` / deltas (`text_delta`, `input_json_delta`, `thinking_delta` then
  `signature_delta`) / `content_block_stop`, then `message_delta` (stop reason, usage) and
  `message_stop`. `ErrorReply` answers with an API error body and status, `StreamReply` with
  raw events (mid-stream errors, streams that end early), `DropConnection` closes the socket
  without answering, `Delayed` waits first.
- `POST /v1/messages/count_tokens`: `{"input_tokens": count_tokens_result}` (or a size-based
  figure when unset); queued replies are not consumed.
- Every request is recorded (`requests`): method, path, lower-cased headers and parsed JSON body,
  so tests can assert what the SDK actually sent and count its retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# --- content blocks ------------------------------------------------------------------------------


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def tool_use(block_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    """A tool_use content block."""
    return {"type": "tool_use", "id": block_id, "name": name, "input": tool_input}


def thinking(value: str, signature: str) -> dict[str, Any]:
    """A signed thinking content block."""
    return {"type": "thinking", "thinking": value, "signature": signature}


def redacted_thinking(data: str) -> dict[str, Any]:
    """A redacted_thinking content block (opaque data)."""
    return {"type": "redacted_thinking", "data": data}


# --- replies -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageReply:
    """A successful answer; streamed or not as the request asks."""

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    input_tokens: int = 10
    output_tokens: int = 5
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    model: str | None = None
    """None answers with the model the request named."""
    chunk_chars: int = 5
    """Characters per text, thinking or input-JSON delta."""


@dataclass(frozen=True)
class ErrorReply:
    """An API error: `{"type": "error", "error": {"type", "message", "details"?}}` with a status."""

    status: int
    error_type: str
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None


@dataclass(frozen=True)
class StreamReply:
    """Raw server-sent events `(event name, data)`; `abort` closes the socket instead of ending."""

    events: list[tuple[str, dict[str, Any]]]
    abort: bool = False


@dataclass(frozen=True)
class DropConnection:
    """Close the connection without answering."""


@dataclass(frozen=True)
class Delayed:
    """Wait `seconds`, then answer with `reply`."""

    seconds: float
    reply: Reply


Reply = MessageReply | ErrorReply | StreamReply | DropConnection | Delayed

DEFAULT_REPLY = MessageReply(content=[text("Hello from the local Messages API.")])

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


def error_body(error_type: str, message: str, error_code: str | None = None) -> dict[str, Any]:
    """The API's error body."""
    error: dict[str, Any] = {"type": error_type, "message": message}
    if error_code is not None:
        error["details"] = {"error_code": error_code}
    return {"type": "error", "error": error, "request_id": "req_local"}


def message_json(reply: MessageReply, model: str, message_id: str) -> dict[str, Any]:
    """The non-streamed JSON message for `reply`."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": reply.model or model,
        "content": reply.content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": _usage(reply, reply.output_tokens),
    }


def _usage(reply: MessageReply, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": reply.cache_creation_input_tokens,
        "cache_read_input_tokens": reply.cache_read_input_tokens,
    }


def message_events(reply: MessageReply, model: str, message_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events that stream `reply`, in the API's order."""
    start = {**message_json(reply, model, message_id), "content": [], "stop_reason": None}
    start["usage"] = _usage(reply, 1)
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(reply.content):
        events.extend(_block_events(index, block, reply.chunk_chars))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _chunks(value: str, size: int) -> list[str]:
    return [value[start : start + size] for start in range(0, len(value), size)]


def _block_events(index: int, block: dict[str, Any], size: int) -> list[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        first: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in _chunks(block["text"], size)]
    elif kind == "tool_use":
        first = {**block, "input": {}}
        encoded = json.dumps(block["input"]) if block["input"] else ""
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in _chunks(encoded, size)]
    elif kind == "thinking":
        # As the API sends it: the signature arrives last, in its own delta.
        first = {"type": "thinking", "thinking": ""}
        deltas = [{"type": "thinking_delta", "thinking": piece} for piece in _chunks(block["thinking"], size)]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:  # redacted_thinking and anything else arrive whole
        first, deltas = block, []
    return [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": first}),
        *(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            for delta in deltas
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


# --- the server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw_body: bytes

    @property
    def streamed(self) -> bool:
        """Whether the request asked for server-sent events."""
        return isinstance(self.body, dict) and self.body.get("stream") is True


class _CloseConnectionError(Exception):
    """Raised inside a connection handler to close the connection."""


class MessagesApiServer:
    """The local Messages API (see the module docstring). Use `async with`."""

    def __init__(self) -> None:
        """A stopped server; `start` (or `async with`) binds a free loopback port."""
        self.requests: list[RecordedRequest] = []
        self.count_tokens_result: int | None = None
        self._queue: deque[Reply] = deque()
        self._always: Reply | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._served = 0

    async def __aenter__(self) -> MessagesApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Listen on 127.0.0.1 at a free port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def aclose(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is None:
            return
        self._server.close()
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`, for the SDK's `base_url`."""
        assert self._server is not None, "server not started"
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def enqueue(self, *replies: Reply) -> None:
        """Answer the next `POST /v1/messages` requests with these replies, in order."""
        self._queue.extend(replies)

    def always(self, reply: Reply | None) -> None:
        """Answer with `reply` whenever the queue is empty (None: the default text)."""
        self._always = reply

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The recorded requests to one path."""
        return [request for request in self.requests if request.path == path]

    @property
    def message_requests(self) -> list[RecordedRequest]:
        """The recorded `POST /v1/messages` requests (each SDK attempt is one)."""
        return self.requests_to("/v1/messages")

    # -- HTTP ---------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            while (request := await _read_request(reader)) is not None:
                self.requests.append(request)
                await self._answer(request, writer)
                if request.headers.get("connection", "").lower() == "close":
                    break
        except (_CloseConnectionError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only `aclose` cancels a handler; ending quietly keeps asyncio from logging it.
            pass
        finally:
            self._handlers.discard(handler)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _answer(self, request: RecordedRequest, writer: asyncio.StreamWriter) -> None:
        if request.method == "POST" and request.path == "/v1/messages/count_tokens":
            count = self.count_tokens_result
            if count is None:
                count = len(request.raw_body) // 4
            await _write_json(writer, 200, {"input_tokens": count})
        elif request.method == "POST" and request.path == "/v1/messages":
            await self._reply(self._next_reply(), request, writer)
        else:
            await _write_json(writer, 404, error_body("not_found_error", f"no route {request.path}"))

    def _next_reply(self) -> Reply:
        if self._queue:
            return self._queue.popleft()
        return self._always or DEFAULT_REPLY

    async def _reply(self, reply: Reply, request: RecordedRequest, writer: asyncio.StreamWriter) -> None:
        if isinstance(reply, Delayed):
            await asyncio.sleep(reply.seconds)
            await self._reply(reply.reply, request, writer)
        elif isinstance(reply, DropConnection):
            raise _CloseConnectionError
        elif isinstance(reply, ErrorReply):
            body = error_body(reply.error_type, reply.message, reply.error_code)
            await _write_json(writer, reply.status, body, reply.headers)
        elif isinstance(reply, StreamReply):
            await _write_events(writer, reply.events, abort=reply.abort)
        else:
            self._served += 1
            model = str(request.body.get("model", "")) if isinstance(request.body, dict) else ""
            message_id = f"msg_local_{self._served}"
            if request.streamed:
                await _write_events(writer, message_events(reply, model, message_id), abort=False)
            else:
                await _write_json(writer, 200, message_json(reply, model, message_id))


async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise _CloseConnectionError  # the SDK sends sized bodies; a chunked one is not supported here
    raw_body = await reader.readexactly(int(headers.get("content-length", "0")))
    body = json.loads(raw_body) if raw_body else None
    return RecordedRequest(method, target.split("?", 1)[0], headers, body, raw_body)


def _status_line(status: int) -> str:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"


async def _write_json(
    writer: asyncio.StreamWriter, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(body).encode("utf-8")
    head = _status_line(status) + "content-type: application/json\r\nrequest-id: req_local\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head += f"content-length: {len(payload)}\r\n\r\n"
    writer.write(head.encode("latin-1") + payload)
    await writer.drain()


async def _write_events(
    writer: asyncio.StreamWriter, events: list[tuple[str, dict[str, Any]]], *, abort: bool
) -> None:
    head = _status_line(200) + "content-type: text/event-stream\r\ncache-control: no-cache\r\n"
    head += "request-id: req_local\r\ntransfer-encoding: chunked\r\n\r\n"
    writer.write(head.encode("latin-1"))
    for name, data in events:
        payload = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        writer.write(f"{len(payload):x}\r\n".encode("ascii") + payload + b"\r\n")
        await writer.drain()
    if abort:
        raise _CloseConnectionError
    writer.write(b"0\r\n\r\n")
    await writer.drain()
