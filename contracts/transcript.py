"""The transcript model (STORE_CONTRACT §10): messages, their parts, and their exact JSON form.

A transcript is what the model saw and said, in order. It is stored in ordinary run records
(`transcript_messages_seeded`, `transcript_messages_appended`) whose payload is a JSON array of
`Message`. Decoding is strict (unknown kinds or keys, duplicate keys, bad UTF-8 and trailing data
are refused) and JSON numbers stay exact: a fractional number decodes to `Decimal`, so `1.10`
comes back as `1.10`, never as the float `1.1`.

One module (about 500 lines) on purpose: the model and its exact JSON form are one contract;
every decoder here raises `TranscriptError` and is read against the same part kinds.
"""

from __future__ import annotations

import base64
import binascii
import json
import json.encoder
import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from quipu.contracts.errors import QuipuError
from quipu.contracts.store import is_erased

TRANSCRIPT_MESSAGES_SEEDED = "transcript_messages_seeded"
"""Record type: history that existed before the run (rebuilds model input, never a new reply)."""

TRANSCRIPT_MESSAGES_APPENDED = "transcript_messages_appended"
"""Record type: messages accepted during the run."""

TRANSCRIPT_RECORD_TYPES = frozenset({TRANSCRIPT_MESSAGES_SEEDED, TRANSCRIPT_MESSAGES_APPENDED})
"""The two record types replay reads, in stored order."""

TOOL_RESULT_MAX_BYTES = 64 * 1024
"""Successful tool-result content whose canonical JSON is longer than this is omitted."""


class TranscriptError(QuipuError):
    """Raised when a transcript cannot be decoded, replayed, validated or encoded for a provider."""


class TranscriptErasedError(TranscriptError):
    """Raised when a transcript record reads as erased: the run's principal was forgotten."""


# --- exact JSON values ----------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
_json_string = json.encoder.encode_basestring
"""`json.dumps(text, ensure_ascii=False)` for a str, without building an encoder each call (the
C function json.dumps ends in; a transcript's every string goes through it)."""
# Where JSON text may spell a surrogate: strict UTF-8 holds none, only an escape from D800 to DFFF
# does (an escaped backslash before the `u` matches too: the decoded value is searched then).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _exact_json(value: Any) -> Any:
    """Check a JSON value and make its numbers exact.

    A Python float is turned into the Decimal of its shortest repr, which is the very text
    `json.dumps` would have written, so building a part from floats loses nothing either.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON numbers must be finite")
        return Decimal(repr(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError("JSON numbers must be finite")
        return value
    if isinstance(value, list | tuple):
        return [_exact_json(item) for item in value]
    if isinstance(value, dict):
        return {_json_key(key): _exact_json(item) for key, item in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _json_key(key: Any) -> str:
    if not isinstance(key, str):
        raise ValueError("JSON object keys must be strings")
    return key


def _exact_json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    result: dict[str, Any] = _exact_json(value)
    return result


JsonValue = Annotated[Any, AfterValidator(_exact_json)]
"""Any JSON value: null, bool, int, Decimal, str, list, or object with string keys."""

JsonObject = Annotated[dict[str, Any], BeforeValidator(_exact_json_object)]
"""A JSON object whose values are JSON values."""


def _canonical_base64(value: Any) -> Any:
    """Padded standard base64 that re-encodes to the same text, so stored bytes never drift."""
    if not isinstance(value, str):
        return value
    try:
        decoded = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(f"not padded base64: {error}") from error
    if base64.b64encode(decoded).decode("ascii") != value:
        raise ValueError("base64 is not canonical (non-zero padding bits)")
    return decoded


Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_canonical_base64),
    PlainSerializer(lambda raw: base64.b64encode(raw).decode("ascii"), return_type=str, when_used="json"),
]
"""Raw bytes in Python; canonical padded base64 in JSON."""

NonEmptyStr = Annotated[StrictStr, StringConstraints(min_length=1)]
"""A string that must not be empty."""


# --- parts ------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ThinkingPart(_Strict):
    """Provider reasoning: signed text (the text may be empty) xor redacted bytes."""

    kind: Literal["thinking"] = Field(default="thinking", description="Part discriminator.")
    text: StrictStr = Field(default="", description="Reasoning text of a signed block; may be empty.")
    signature: StrictStr = Field(default="", description="Provider signature of a signed block.")
    redacted: Base64Bytes = Field(default=b"", description="Opaque redacted reasoning (base64 in JSON).")
    index: StrictInt = Field(default=0, ge=0, description="Position in the turn's reasoning sequence.")
    final: StrictBool = Field(default=False, description="Whether this is the turn's last reasoning block.")

    @model_validator(mode="after")
    def _signed_xor_redacted(self) -> ThinkingPart:
        if bool(self.signature) == bool(self.redacted):
            raise ValueError("thinking must be signed (signature) xor redacted, not both or neither")
        if self.redacted and self.text:
            raise ValueError("redacted thinking carries no text")
        return self


class TextPart(_Strict):
    """Visible text."""

    kind: Literal["text"] = Field(default="text", description="Part discriminator.")
    text: StrictStr = Field(description="The text.")


class ImagePart(_Strict):
    """An image given inline."""

    kind: Literal["image"] = Field(default="image", description="Part discriminator.")
    format: Literal["png", "jpeg", "gif", "webp"] = Field(description="Image encoding.")
    bytes: Annotated[Base64Bytes, Field(min_length=1)] = Field(
        description="Raw image bytes (base64 in JSON); non-empty."
    )


_DOCUMENT_SOURCES = ("bytes", "text", "chunks", "uri")


class DocumentPart(_Strict):
    """A document attached to a message; exactly one of bytes, text, chunks or uri carries it."""

    kind: Literal["document"] = Field(default="document", description="Part discriminator.")
    name: NonEmptyStr = Field(description="Short neutral identifier of the document.")
    format: StrictStr = Field(default="", description="Format or extension, e.g. pdf, txt, md.")
    bytes: Base64Bytes = Field(default=b"", description="Raw document bytes (base64 in JSON).")
    text: StrictStr = Field(default="", description="The document as one text.")
    chunks: tuple[NonEmptyStr, ...] = Field(default=(), description="The document as non-empty chunks.")
    uri: StrictStr = Field(default="", description="Where the document lives, when not embedded.")
    context: StrictStr = Field(default="", description="How the model should read the document.")
    cite: StrictBool = Field(default=False, description="Ask the provider for citations.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> DocumentPart:
        # A source counts when it was given; a given but empty source is refused rather than
        # silently treated as absent, so the stored form has one meaning.
        given = [name for name in _DOCUMENT_SOURCES if name in self.model_fields_set]
        for name in given:
            if not getattr(self, name):
                raise ValueError(f"document {name} must not be empty when present")
        if len(given) != 1:
            raise ValueError(f"document needs exactly one of bytes, text, chunks, uri (got {given})")
        return self


class CitationSpan(_Strict):
    """A range inside one source document (characters, chunks or pages)."""

    document_index: StrictInt = Field(ge=0, description="Index of the cited document in the request.")
    start: StrictInt = Field(ge=0, description="First position of the range.")
    end: StrictInt = Field(ge=0, description="Position after the range.")


class CitationLocation(_Strict):
    """Where cited content sits; exactly one kind of range."""

    document_char: CitationSpan | None = Field(default=None, description="A character range.")
    document_chunk: CitationSpan | None = Field(default=None, description="A chunk range.")
    document_page: CitationSpan | None = Field(default=None, description="A page range.")

    @model_validator(mode="after")
    def _exactly_one_range(self) -> CitationLocation:
        given = [span for span in (self.document_char, self.document_chunk, self.document_page) if span]
        if len(given) != 1:
            raise ValueError("citation location needs exactly one of document_char/chunk/page")
        return self


class Citation(_Strict):
    """One citation: which source, where in it, and the cited excerpt."""

    title: StrictStr = Field(default="", description="Source document title.")
    source: StrictStr = Field(default="", description="Provider-specific source identifier.")
    location: CitationLocation | None = Field(default=None, description="Where the excerpt is.")
    source_content: tuple[StrictStr, ...] = Field(default=(), description="The cited excerpt(s).")


class CitationsPart(_Strict):
    """Generated text with the citations that support it."""

    kind: Literal["citations"] = Field(default="citations", description="Part discriminator.")
    text: StrictStr = Field(description="The generated text.")
    citations: tuple[Citation, ...] = Field(description="Citations supporting the text.")


class ToolUsePart(_Strict):
    """A tool call requested by the assistant."""

    kind: Literal["tool_use"] = Field(default="tool_use", description="Part discriminator.")
    id: NonEmptyStr = Field(description="Canonical tool-use id; results refer to it.")
    name: NonEmptyStr = Field(description="Canonical tool name.")
    input: JsonObject = Field(description="The call's arguments: a JSON object, numbers exact.")
    thought_signature: StrictStr = Field(
        default="",
        description="Opaque provider signature bound to this call; carried back unchanged.",
    )


class ToolResultPart(_Strict):
    """The result of one tool call, in the user message after the tool-use group."""

    kind: Literal["tool_result"] = Field(default="tool_result", description="Part discriminator.")
    tool_use_id: NonEmptyStr = Field(description="Id of the tool use this answers.")
    content: JsonValue = Field(description="Result as any JSON value; the error text when is_error.")
    is_error: StrictBool = Field(default=False, description="The tool failed; content is its error text.")

    @model_validator(mode="after")
    def _error_is_text(self) -> ToolResultPart:
        # A failed tool gives its error text and nothing else: a structured result next to an
        # error would leave the model guessing which one to believe.
        if self.is_error and not (isinstance(self.content, str) and self.content):
            raise ValueError("a failed tool result carries its error text (a non-empty string) only")
        return self


class CacheCheckpointPart(_Strict):
    """A prompt-cache boundary; no content."""

    kind: Literal["cache_checkpoint"] = Field(default="cache_checkpoint", description="Part discriminator.")


Part = Annotated[
    ThinkingPart
    | TextPart
    | ImagePart
    | DocumentPart
    | CitationsPart
    | ToolUsePart
    | ToolResultPart
    | CacheCheckpointPart,
    Field(discriminator="kind"),
]
"""One message part, discriminated on `kind`."""


class Message(_Strict):
    """One transcript message: a role and its ordered parts."""

    role: Literal["system", "user", "assistant"] = Field(description="Who speaks.")
    parts: tuple[Part, ...] = Field(description="Ordered parts; never reordered.")
    meta: JsonObject | None = Field(default=None, description="Optional application metadata.")


_MESSAGES = TypeAdapter(list[Message])


# --- strict decoding ----------------------------------------------------------------------------


class _DuplicateKeyError(QuipuError):
    """Raised inside the JSON object hook when an object repeats a key."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(key) or _has_lone_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def decode_json_value(payload: bytes, where: str) -> Any:
    """Strictly parse one JSON value: UTF-8, no duplicate keys, no trailing data, exact numbers."""
    try:
        text = payload.decode("utf-8", errors="strict")
    except UnicodeDecodeError as error:
        raise TranscriptError(f"{where}: payload is not valid UTF-8 ({error.reason})") from error
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_float=Decimal,
            parse_constant=_reject_constant,
        )
    except _DuplicateKeyError as error:
        raise TranscriptError(f"{where}: duplicate key {error.args[0]!r}") from error
    except (ValueError, RecursionError) as error:
        raise TranscriptError(f"{where}: payload is not exactly one JSON value ({error})") from error
    if _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(value):
        raise TranscriptError(f"{where}: lone surrogate escape")
    return value


def _describe(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(step) for step in item['loc']) or '<root>'}: {item['msg']}" for item in error.errors()
    )


def decode_messages(payload: bytes, where: str) -> list[Message]:
    """Strictly decode a transcript record payload (a JSON array of Message).

    `where` names the payload in errors (e.g. the run and event key). Raises TranscriptError
    (TranscriptErasedError for a payload that reads as erased).
    """
    if is_erased(payload):
        raise TranscriptErasedError(f"{where}: erased (the run's principal was forgotten)")
    value = decode_json_value(payload, where)
    if not isinstance(value, list):
        raise TranscriptError(f"{where}: payload must be a JSON array of messages")
    for position, item in enumerate(value):
        # Absent meta is the only "no meta" on the wire; null would be a second spelling of it.
        if isinstance(item, dict) and "meta" in item and item["meta"] is None:
            raise TranscriptError(f"{where}: message {position} meta must not be null")
    try:
        return _MESSAGES.validate_python(value)
    except ValidationError as error:
        raise TranscriptError(f"{where}: {_describe(error)}") from error


# --- canonical encoding -------------------------------------------------------------------------


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, Decimal):
        out.append(_decimal_text(value))
    elif isinstance(value, str):
        out.append(_json_string(_SURROGATE.sub("\ufffd", value)))
    elif isinstance(value, bytes):
        out.append('"' + base64.b64encode(value).decode("ascii") + '"')
    elif isinstance(value, dict):
        _write_object(value, out)
    elif isinstance(value, list | tuple):
        _write_array(value, out)
    else:
        raise TranscriptError(f"{type(value).__name__} is not a JSON value")


def _decimal_text(value: Decimal) -> str:
    # str() of a finite Decimal is valid JSON and keeps every digit (`1.10` stays `1.10`). A
    # Decimal without fraction or exponent reads back as an int, so it is written as one:
    # `Decimal('-0')` becomes `0`, keeping encode(decode(encode(x))) == encode(x).
    if value.as_tuple().exponent == 0:
        return str(int(value))
    return str(value)


def _write_object(value: dict[str, Any], out: list[str]) -> None:
    out.append("{")
    for position, (key, item) in enumerate(value.items()):
        if position:
            out.append(",")
        _write(key, out)
        out.append(":")
        _write(item, out)
    out.append("}")


def _write_array(value: list[Any] | tuple[Any, ...], out: list[str]) -> None:
    out.append("[")
    for position, item in enumerate(value):
        if position:
            out.append(",")
        _write(item, out)
    out.append("]")


def encode_json_value(value: Any) -> bytes:
    """Canonical compact UTF-8 JSON of a JSON value: keys as given, numbers exact, non-ASCII raw.

    Floats are written as the Decimal of their repr; lone surrogates become U+FFFD.
    """
    try:
        exact = _exact_json(value)
    except ValueError as error:
        raise TranscriptError(str(error)) from error
    out: list[str] = []
    _write(exact, out)
    return "".join(out).encode("utf-8")


def part_to_wire(part: Part) -> dict[str, Any]:
    """The JSON object of a part: `kind` first, then its keys in listed order, defaults omitted."""
    fields = part.model_dump(mode="python", exclude_defaults=True, exclude={"kind"})
    return {"kind": part.kind, **fields}


def message_to_wire(message: Message) -> dict[str, Any]:
    """The JSON object of a message: role, parts, then meta when present."""
    wire: dict[str, Any] = {"role": message.role, "parts": [part_to_wire(p) for p in message.parts]}
    if message.meta is not None:
        wire["meta"] = message.meta
    return wire


def encode_messages(messages: list[Message]) -> bytes:
    """Canonical compact JSON array of messages: what writers put in a transcript record payload.

    The same messages always give the same bytes, so a retried append is an exact retry.
    """
    out: list[str] = []
    _write([message_to_wire(message) for message in messages], out)
    return "".join(out).encode("utf-8")


# --- tool-result size rule ----------------------------------------------------------------------


def bounded_tool_result(
    content: Any,
    is_error: bool,
    *,
    preview: str = "",
    bounds: dict[str, Any] | None = None,
) -> Any:
    """The content to store in a `ToolResultPart`.

    A failed tool gives its error text (a non-empty string) with `is_error=True`; anything else
    with an error is refused, because result and error together is an error. A successful result
    whose canonical JSON exceeds 64 KiB becomes `{"omitted": true, "reason": "size_limit",
    "preview"?, "bounds"?}`; `preview` and `bounds` are the tool's own short description of what
    was left out. Raises TranscriptError.
    """
    if is_error:
        if not (isinstance(content, str) and content):
            raise TranscriptError("a failed tool result is its error text: a non-empty string only")
        return content
    if len(encode_json_value(content)) <= TOOL_RESULT_MAX_BYTES:
        return _exact_json(content)
    return _omission(preview, bounds)


def _omission(preview: str, bounds: dict[str, Any] | None) -> dict[str, Any]:
    omitted: dict[str, Any] = {"omitted": True, "reason": "size_limit"}
    if preview:
        omitted["preview"] = preview
    if bounds is not None:
        omitted["bounds"] = _exact_json_object(bounds)
    # The replacement must itself respect the limit, or the rule would protect nothing.
    if len(encode_json_value(omitted)) > TOOL_RESULT_MAX_BYTES:
        raise TranscriptError("tool result preview and bounds exceed the 64 KiB limit themselves")
    return omitted
