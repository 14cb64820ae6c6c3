"""A local estimate of the tokens a model request or answer costs.

This is an approximation, not a tokenizer: about four characters of text per token, plus a
fixed overhead per message, per tool and per request for the framing the provider adds. It is
what `ScriptedModel` reports as usage and answers to `count_tokens`, and what a planner can use
to budget a request without a network call. Real Claude tokenizers give different numbers
(often within ±30 % for English prose, worse for code, JSON and non-Latin scripts); use
`AnthropicModel.count_tokens` when an exact figure matters.

The estimate is deterministic and monotonic: adding text, a part or a message never lowers it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from quipu.contracts.transcript import (
    CacheCheckpointPart,
    CitationsPart,
    DocumentPart,
    ImagePart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    encode_json_value,
)
from quipu.services.domain.models.port import ModelRequest, ToolSpec
from quipu.services.domain.transcript import tool_result_text

CHARS_PER_TOKEN = 4
"""Characters of text counted as one token."""

REQUEST_OVERHEAD_TOKENS = 3
"""Framing every request pays once (the reply's priming)."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Framing per message (role and separators)."""

PART_OVERHEAD_TOKENS = 2
"""Framing per non-text part (block type, ids)."""

TOOL_OVERHEAD_TOKENS = 8
"""Framing per tool definition, on top of its name, description and schema."""

IMAGE_TOKENS = 1_600
"""An image, whatever its size: the provider's ceiling for one image at full resolution."""


def estimate_text_tokens(text: str) -> int:
    """Tokens of one text: ceil(characters / 4); an empty text costs nothing."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _json_tokens(value: Any) -> int:
    return estimate_text_tokens(encode_json_value(value).decode("utf-8"))


def estimate_part_tokens(part: Part) -> int:
    """Tokens of one message part (its visible text, JSON or a fixed cost for images)."""
    if isinstance(part, TextPart):
        return estimate_text_tokens(part.text)
    if isinstance(part, ThinkingPart):
        # The signature and redacted bytes are opaque to the model but are sent back.
        return PART_OVERHEAD_TOKENS + estimate_text_tokens(part.text) + math.ceil(len(part.redacted) / 4)
    if isinstance(part, ToolUsePart):
        return PART_OVERHEAD_TOKENS + estimate_text_tokens(part.name) + _json_tokens(part.input)
    if isinstance(part, ToolResultPart):
        return PART_OVERHEAD_TOKENS + estimate_text_tokens(tool_result_text(part.content))
    if isinstance(part, ImagePart):
        return IMAGE_TOKENS
    if isinstance(part, DocumentPart):
        return PART_OVERHEAD_TOKENS + _document_tokens(part)
    if isinstance(part, CitationsPart):
        return estimate_text_tokens(part.text) + sum(
            estimate_text_tokens(" ".join(citation.source_content)) for citation in part.citations
        )
    if isinstance(part, CacheCheckpointPart):
        return 0
    raise TypeError(f"unknown part {type(part).__name__}")  # pragma: no cover - Part is closed


def _document_tokens(part: DocumentPart) -> int:
    text = part.text or " ".join(part.chunks) or part.uri
    return (
        estimate_text_tokens(part.name + part.context + text)
        # Raw bytes (a PDF, say): assume the extracted text is about as long as the file.
        + math.ceil(len(part.bytes) / CHARS_PER_TOKEN)
    )


def estimate_parts_tokens(parts: Iterable[Part]) -> int:
    """Tokens of a sequence of parts (an answer, say), without message framing."""
    return sum(estimate_part_tokens(part) for part in parts)


def estimate_messages_tokens(messages: Sequence[Message]) -> int:
    """Tokens of a transcript: every part plus the framing of each message."""
    return sum(MESSAGE_OVERHEAD_TOKENS + estimate_parts_tokens(message.parts) for message in messages)


def estimate_tool_tokens(tool: ToolSpec) -> int:
    """Tokens of one tool definition: name, description, input schema and framing."""
    return (
        TOOL_OVERHEAD_TOKENS
        + estimate_text_tokens(tool.name)
        + estimate_text_tokens(tool.description)
        + _schema_tokens(tool.input_schema)
    )


_SCHEMA_TOKENS: OrderedDict[int, tuple[dict[str, Any], int]] = OrderedDict()
_SCHEMAS_KEPT = 1024


def _schema_tokens(schema: dict[str, Any]) -> int:
    # A tool's schema is one object shared by every spec of its class (`tool_catalog.input_schema`)
    # and counted at every model step; encoding it was a fifth of a turn's planning. Kept by
    # identity with the object itself, so an id is never taken for another's once reused.
    kept = _SCHEMA_TOKENS.get(id(schema))
    if kept is not None and kept[0] is schema:
        _SCHEMA_TOKENS.move_to_end(id(schema))
        return kept[1]
    tokens = _json_tokens(schema)
    _SCHEMA_TOKENS[id(schema)] = (schema, tokens)
    while len(_SCHEMA_TOKENS) > _SCHEMAS_KEPT:
        _SCHEMA_TOKENS.popitem(last=False)
    return tokens


def estimate_request_tokens(request: ModelRequest) -> int:
    """Input tokens of a whole request: system prompt, tools, transcript, output schema.

    An approximation (see the module docstring); `max_tokens`, the thinking budget and the
    call key cost nothing.
    """
    total = REQUEST_OVERHEAD_TOKENS + estimate_text_tokens(request.system)
    total += sum(estimate_tool_tokens(tool) for tool in request.tools)
    total += estimate_messages_tokens(request.messages)
    if request.output_schema is not None:
        total += _json_tokens(request.output_schema)
    return total
