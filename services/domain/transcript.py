"""Transcript replay, validation and Anthropic Messages encoding (STORE_CONTRACT §10).

Replay rebuilds the exact messages a run prepared for the model from its ordered records.
The validators are read-only checks run at the planner boundary. The Anthropic encoding maps
parts to Messages API blocks one to one and in order: a part the API cannot carry is an error,
never silently dropped. This module builds plain dicts; it does not import the SDK.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any, Protocol

from quipu.contracts.store import Page, Record
from quipu.contracts.transcript import (
    TRANSCRIPT_RECORD_TYPES,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    TranscriptError,
    decode_messages,
    encode_json_value,
)

PAGE_LIMIT = 500
"""Records asked for per ListRunRecords call (the store's cap)."""


class RunRecordLister(Protocol):
    """The one store read replay needs; every `Store` satisfies it."""

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        """ListRunRecords: per-run order, opaque cursor, `next_cursor=""` at the end."""
        ...


# --- replay -------------------------------------------------------------------------------------


async def build_messages_from_run_log(store: RunRecordLister, run_id: str) -> list[Message]:
    """BuildMessagesFromRunLog: page the run's records to the end and replay its transcript.

    Store errors propagate unchanged; a run without transcript records, a record of another run,
    a listing that stops making progress, or any payload that does not decode raises
    TranscriptError naming the run (and the record's event key).
    """
    transcript_records: list[Record] = []
    cursor = ""
    while True:
        page = await store.list_run_records(run_id, cursor, PAGE_LIMIT)
        transcript_records.extend(_transcript_records_of(page, run_id))
        if page.next_cursor == "":
            break
        # A cursor that does not move would loop forever; a store bug must not hang a worker.
        if not page.records or page.next_cursor == cursor:
            raise TranscriptError(f"run {run_id!r}: record listing made no progress")
        cursor = page.next_cursor
    if not transcript_records:
        raise TranscriptError(f"run {run_id!r}: no transcript record")
    return replay_run_log_events(transcript_records)


def _transcript_records_of(page: Page, run_id: str) -> list[Record]:
    for record in page.records:
        if record.run_id != run_id:
            raise TranscriptError(
                f"run {run_id!r}: listing returned record {record.event_key!r} of run {record.run_id!r}"
            )
    # Only transcript records are kept: a long run's other records need not stay in memory.
    return [record for record in page.records if record.type in TRANSCRIPT_RECORD_TYPES]


def replay_run_log_events(records: Iterable[Record]) -> list[Message]:
    """ReplayRunLogEvents: decode the transcript records among `records`, in order, and concatenate.

    No transcript record, or any decode error (naming run and event key), raises TranscriptError.
    """
    messages: list[Message] = []
    found = False
    runs: dict[str, None] = {}  # distinct run ids in order, to name them when nothing is found
    for record in records:
        runs[record.run_id] = None
        if record.type not in TRANSCRIPT_RECORD_TYPES:
            continue
        found = True
        where = f"run {record.run_id!r} record {record.event_key!r} ({record.type})"
        messages.extend(decode_messages(record.payload, where))
    if not found:
        named = ", ".join(repr(run) for run in runs) or "<no records>"
        raise TranscriptError(f"run {named}: no transcript record")
    return messages


# --- validators ---------------------------------------------------------------------------------


def _tool_uses(message: Message) -> list[ToolUsePart]:
    return [part for part in message.parts if isinstance(part, ToolUsePart)]


def _tool_results(message: Message) -> list[ToolResultPart]:
    return [part for part in message.parts if isinstance(part, ToolResultPart)]


def _assistant_group_end(messages: Sequence[Message], start: int) -> int:
    """Index after the run of contiguous assistant messages that begins at `start`."""
    end = start
    while end < len(messages) and messages[end].role == "assistant":
        end += 1
    return end


def validate_planner_transcript(messages: Sequence[Message]) -> None:
    """ValidatePlannerTranscript: every tool-use group is answered at once, one result per use.

    Contiguous assistant messages form one group. A group with tool uses must be followed
    immediately by one user message holding exactly one `tool_result` per use id; ids are
    non-empty and unique across the transcript; a result answering no use of the group just
    before it is an error. Read-only; raises TranscriptError naming the message.
    """
    seen_ids: set[str] = set()
    answered: set[int] = set()  # indexes of user messages that answer a tool-use group
    index = 0
    while index < len(messages):
        if messages[index].role != "assistant":
            _check_no_stray_tool_use(messages[index], index)
            index += 1
            continue
        end = _assistant_group_end(messages, index)
        uses = [use for message in messages[index:end] for use in _tool_uses(message)]
        if uses:
            _check_use_ids(uses, seen_ids, index)
            _check_results(messages, end, uses)
            answered.add(end)
        index = end
    _check_no_orphan_results(messages, answered)


def _check_no_stray_tool_use(message: Message, index: int) -> None:
    if _tool_uses(message):
        raise TranscriptError(f"message {index}: tool_use outside an assistant message")


def _check_use_ids(uses: list[ToolUsePart], seen_ids: set[str], index: int) -> None:
    for use in uses:
        if not use.id:
            raise TranscriptError(f"message {index}: tool_use with an empty id")
        if use.id in seen_ids:
            raise TranscriptError(f"message {index}: duplicate tool_use id {use.id!r}")
        seen_ids.add(use.id)


def _check_results(messages: Sequence[Message], at: int, uses: list[ToolUsePart]) -> None:
    if at >= len(messages) or messages[at].role != "user":
        ids = [use.id for use in uses]
        raise TranscriptError(
            f"message {at}: tool uses {ids} must be followed at once by a user message of results"
        )
    expected = {use.id for use in uses}
    seen: set[str] = set()
    for result in _tool_results(messages[at]):
        if not result.tool_use_id:
            raise TranscriptError(f"message {at}: tool_result with an empty tool_use_id")
        if result.tool_use_id not in expected:
            raise TranscriptError(
                f"message {at}: tool_result {result.tool_use_id!r} answers no tool use of the group"
            )
        if result.tool_use_id in seen:
            raise TranscriptError(f"message {at}: duplicate tool_result for {result.tool_use_id!r}")
        seen.add(result.tool_use_id)
    missing = [use.id for use in uses if use.id not in seen]
    if missing:
        raise TranscriptError(f"message {at}: missing tool_result for {missing}")


def _check_no_orphan_results(messages: Sequence[Message], answered: set[int]) -> None:
    for index, message in enumerate(messages):
        results = _tool_results(message)
        if results and index not in answered:
            raise TranscriptError(
                f"message {index}: tool_result {results[0].tool_use_id!r} without a preceding tool-use group"
            )


def validate_thinking_first(messages: Sequence[Message]) -> None:
    """ValidateThinkingFirst: every assistant message with a tool use starts with `thinking`.

    Extended thinking requires it; call this only when thinking is enabled (Goa-AI's
    ValidateBedrock). Read-only; raises TranscriptError.
    """
    for index, message in enumerate(messages):
        if message.role != "assistant" or not _tool_uses(message):
            continue
        if not isinstance(message.parts[0], ThinkingPart):
            kinds = [part.kind for part in message.parts]
            raise TranscriptError(
                f"message {index}: assistant tool_use message must start with thinking (parts {kinds})"
            )


# --- Anthropic Messages encoding ----------------------------------------------------------------

_SAFE_TOOL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_safe_tool_id(tool_id: str) -> bool:
    # fullmatch, not `^...$`: `$` would accept a trailing newline.
    return _SAFE_TOOL_ID.fullmatch(tool_id) is not None


def _tool_ids_in_order(messages: Sequence[Message]) -> list[str]:
    ids: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolUsePart):
                ids.append(part.id)
            elif isinstance(part, ToolResultPart):
                ids.append(part.tool_use_id)
    return ids


def anthropic_tool_id_aliases(messages: Sequence[Message]) -> dict[str, str]:
    """Request-local aliases `t1`, `t2`, … for tool ids the API would refuse, by first appearance.

    Aliases skip safe ids already present in the request, so no alias can collide with a real id.
    """
    ids = _tool_ids_in_order(messages)
    taken = {tool_id for tool_id in ids if _is_safe_tool_id(tool_id)}
    aliases: dict[str, str] = {}
    counter = 0
    for tool_id in ids:
        if tool_id in taken or tool_id in aliases:
            continue
        counter += 1
        while f"t{counter}" in taken:
            counter += 1
        aliases[tool_id] = f"t{counter}"
    return aliases


def encode_anthropic_messages(
    messages: Sequence[Message],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Encode a transcript as Messages API `(system, messages)`, in order, without dropping parts.

    System messages give text blocks only. Thinking is allowed only in assistant messages.
    Unsafe tool ids are aliased in this request only (the transcript keeps canonical ids).
    Image, document, citations and cache checkpoint parts raise TranscriptError.
    """
    aliases = anthropic_tool_id_aliases(messages)
    system: list[dict[str, Any]] = []
    conversation: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            system.extend(_system_block(part, index) for part in message.parts)
            continue
        if not message.parts:
            raise TranscriptError(f"message {index}: a {message.role} message needs at least one part")
        blocks = [_block(part, message.role, index, aliases) for part in message.parts]
        conversation.append({"role": message.role, "content": blocks})
    return system, conversation


def _system_block(part: Part, index: int) -> dict[str, Any]:
    if not isinstance(part, TextPart):
        raise TranscriptError(f"message {index}: system messages carry text only, not {part.kind}")
    return {"type": "text", "text": part.text}


def _block(part: Part, role: str, index: int, aliases: dict[str, str]) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ThinkingPart):
        return _thinking_block(part, role, index)
    if isinstance(part, ToolUsePart):
        return _tool_use_block(part, role, index, aliases)
    if isinstance(part, ToolResultPart):
        return _tool_result_block(part, role, index, aliases)
    raise TranscriptError(f"message {index}: {part.kind} parts cannot be sent to Anthropic Messages")


def _thinking_block(part: ThinkingPart, role: str, index: int) -> dict[str, Any]:
    if role != "assistant":
        raise TranscriptError(f"message {index}: thinking is only allowed in assistant messages")
    if part.signature:
        return {"type": "thinking", "thinking": part.text, "signature": part.signature}
    if part.redacted:
        return {"type": "redacted_thinking", "data": _redacted_data(part.redacted, index)}
    raise TranscriptError(f"message {index}: thinking is neither signed nor redacted")


def _redacted_data(redacted: bytes, index: int) -> str:
    # The API's `data` is an opaque string; decode_anthropic_content stores its UTF-8 bytes, so
    # this is the exact inverse. Bytes that are not UTF-8 never came from this API.
    try:
        return redacted.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TranscriptError(f"message {index}: redacted thinking is not Anthropic data") from error


def _tool_use_block(part: ToolUsePart, role: str, index: int, aliases: dict[str, str]) -> dict[str, Any]:
    if role != "assistant":
        raise TranscriptError(f"message {index}: tool_use is only allowed in assistant messages")
    return {
        "type": "tool_use",
        "id": aliases.get(part.id, part.id),
        "name": part.name,
        "input": _sdk_json(part.input, index),
    }


def _tool_result_block(
    part: ToolResultPart, role: str, index: int, aliases: dict[str, str]
) -> dict[str, Any]:
    if role != "user":
        raise TranscriptError(f"message {index}: tool_result is only allowed in user messages")
    return {
        "type": "tool_result",
        "tool_use_id": aliases.get(part.tool_use_id, part.tool_use_id),
        "content": tool_result_text(part.content),
        "is_error": part.is_error,
    }


def tool_result_text(content: Any) -> str:
    """Tool-result content as the API's string: a string as is, null as "", else compact JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return encode_json_value(content).decode("utf-8")


def _sdk_json(value: Any, index: int) -> Any:
    """A copy of a JSON value the SDK can serialise: its encoder has no Decimal, only float.

    A Decimal is sent as the float whose shortest text has the same value; numbers that came from
    the API were floats, so they go back unchanged. A Decimal no float can carry is refused
    rather than rounded.
    """
    if isinstance(value, Decimal):
        return _exact_float(value, index)
    if isinstance(value, dict):
        return {key: _sdk_json(item, index) for key, item in value.items()}
    if isinstance(value, list):
        return [_sdk_json(item, index) for item in value]
    return value


def _exact_float(value: Decimal, index: int) -> float:
    as_float = float(value)
    if Decimal(repr(as_float)) != value:
        raise TranscriptError(
            f"message {index}: tool input number {value} cannot be sent exactly as a JSON float"
        )
    return as_float


# --- Anthropic response content -----------------------------------------------------------------


def decode_anthropic_content(blocks: list[dict[str, Any]]) -> list[Part]:
    """Map Messages API response content blocks to parts, in order.

    thinking → signed ThinkingPart, redacted_thinking → redacted ThinkingPart (the opaque `data`
    kept as its UTF-8 bytes), text → TextPart, tool_use → ToolUsePart. Reasoning blocks are
    numbered in order and the last one is final. Any other block, or text with citations,
    raises TranscriptError rather than being dropped.
    """
    reasoning = [i for i, b in enumerate(blocks) if b.get("type") in _REASONING_TYPES]
    parts: list[Part] = []
    for position, block in enumerate(blocks):
        try:
            parts.append(_decode_block(block, position, reasoning))
        except (KeyError, TypeError, ValueError) as error:
            raise TranscriptError(f"content block {position}: {error}") from error
    return parts


_REASONING_TYPES = frozenset({"thinking", "redacted_thinking"})


def _decode_block(block: dict[str, Any], position: int, reasoning: list[int]) -> Part:
    kind = block.get("type")
    if kind in _REASONING_TYPES:
        return _decode_reasoning(block, position, reasoning)
    if kind == "text":
        if block.get("citations"):
            raise ValueError("text with citations is not supported; it would lose its citations")
        return TextPart(text=block["text"])
    if kind == "tool_use":
        return ToolUsePart(id=block["id"], name=block["name"], input=block["input"])
    raise ValueError(f"unsupported content block type {kind!r}")


def _decode_reasoning(block: dict[str, Any], position: int, reasoning: list[int]) -> ThinkingPart:
    index = reasoning.index(position)
    final = position == reasoning[-1]
    if block["type"] == "thinking":
        return ThinkingPart(text=block["thinking"], signature=block["signature"], index=index, final=final)
    data = block["data"]
    if not isinstance(data, str):
        raise TypeError("redacted_thinking data must be a string")
    return ThinkingPart(redacted=data.encode("utf-8"), index=index, final=final)
