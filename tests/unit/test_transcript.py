"""Transcript model (STORE_CONTRACT §10): part JSON, strict decoding, exact numbers, size rule."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from quipu.contracts.transcript import (
    TOOL_RESULT_MAX_BYTES,
    TRANSCRIPT_MESSAGES_APPENDED,
    TRANSCRIPT_MESSAGES_SEEDED,
    CacheCheckpointPart,
    Citation,
    CitationLocation,
    CitationSpan,
    CitationsPart,
    DocumentPart,
    ImagePart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    TranscriptError,
    bounded_tool_result,
    decode_messages,
    encode_json_value,
    encode_messages,
)


def one_part(part: dict[str, Any], role: str = "user") -> bytes:
    return json.dumps([{"role": role, "parts": [part]}]).encode()


def decode_one(part: dict[str, Any]) -> Part:
    return decode_messages(one_part(part), "test").pop().parts[0]


# --- constants ----------------------------------------------------------------------------------


def test_record_type_names_are_the_contract_wire_names() -> None:
    assert TRANSCRIPT_MESSAGES_SEEDED == "transcript_messages_seeded"
    assert TRANSCRIPT_MESSAGES_APPENDED == "transcript_messages_appended"


# --- canonical bytes ----------------------------------------------------------------------------

CANONICAL = (
    b'[{"role":"system","parts":[{"kind":"text","text":"Be brief."}]},'
    b'{"role":"user","parts":[{"kind":"text","text":"caf\xc3\xa9?"},'
    b'{"kind":"image","format":"png","bytes":"iVBORw=="},'
    b'{"kind":"document","name":"spec","format":"md","text":"# Spec","context":"ctx","cite":true}],'
    b'"meta":{"turn":1}},'
    b'{"role":"assistant","parts":[{"kind":"thinking","text":"hmm","signature":"sig","final":true},'
    b'{"kind":"thinking","redacted":"b3BhcXVl","index":1},'
    b'{"kind":"text","text":"Calling."},'
    b'{"kind":"tool_use","id":"toolu_1","name":"calc","input":{"x":1.10,"y":[1E+5,-2,0.0]},'
    b'"thought_signature":"ts"}]},'
    b'{"role":"user","parts":[{"kind":"tool_result","tool_use_id":"toolu_1","content":null},'
    b'{"kind":"cache_checkpoint"}]},'
    b'{"role":"assistant","parts":[{"kind":"citations","text":"cited","citations":[{"title":"T",'
    b'"source":"S","location":{"document_char":{"document_index":0,"start":1,"end":4}},'
    b'"source_content":["abc"]}]}]}]'
)


def test_canonical_payload_round_trips_byte_for_byte() -> None:
    messages = decode_messages(CANONICAL, "test")
    assert encode_messages(messages) == CANONICAL


def test_canonical_payload_decodes_to_the_expected_parts() -> None:
    messages = decode_messages(CANONICAL, "test")
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1].meta == {"turn": 1}
    assert messages[1].parts[1] == ImagePart(format="png", bytes=b"\x89PNG")
    assert messages[2].parts[1] == ThinkingPart(redacted=b"opaque", index=1)
    assert isinstance(messages[4].parts[0], CitationsPart)
    span = messages[4].parts[0].citations[0].location
    assert span is not None and span.document_char == CitationSpan(document_index=0, start=1, end=4)


def test_encoding_puts_kind_first_and_omits_defaults() -> None:
    part = ThinkingPart(signature="s")
    assert encode_messages([Message(role="assistant", parts=(part,))]) == (
        b'[{"role":"assistant","parts":[{"kind":"thinking","signature":"s"}]}]'
    )


def test_encoding_is_compact_utf8_with_raw_non_ascii() -> None:
    payload = encode_messages([Message(role="user", parts=(TextPart(text='ñ "q" \n'),))])
    assert payload == '[{"role":"user","parts":[{"kind":"text","text":"ñ \\"q\\" \\n"}]}]'.encode()


def test_lone_surrogates_are_replaced_when_encoding() -> None:
    payload = encode_messages([Message(role="user", parts=(TextPart(text="a\ud800b"),))])
    assert "a\ufffdb".encode() in payload


# --- exact numbers ------------------------------------------------------------------------------


def test_decimal_keeps_trailing_zero_through_decode_and_encode() -> None:
    payload = b'[{"role":"user","parts":[{"kind":"tool_result","tool_use_id":"a","content":1.10}]}]'
    decoded = decode_messages(payload, "test")[0].parts[0]
    assert isinstance(decoded, ToolResultPart)
    assert isinstance(decoded.content, Decimal)
    assert str(decoded.content) == "1.10"
    assert b'"content":1.10}' in encode_messages(decode_messages(payload, "test"))


def test_big_and_precise_numbers_are_exact() -> None:
    text = b'{"i":123456789012345678901234567890,"d":0.1000000000000000000000000001,"e":-2.5E-30}'
    assert encode_json_value(json.loads(text, parse_float=Decimal)) == text


def test_python_floats_become_the_decimal_of_their_repr() -> None:
    part = ToolUsePart(id="a", name="n", input={"x": 0.1, "y": [1.5e300]})
    assert part.input == {"x": Decimal("0.1"), "y": [Decimal("1.5e+300")]}
    assert encode_json_value(part.input) == b'{"x":0.1,"y":[1.5E+300]}'


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity")])
def test_non_finite_numbers_are_refused(bad: Any) -> None:
    with pytest.raises(ValidationError):
        ToolUsePart(id="a", name="n", input={"x": bad})


def test_negative_zero_integer_encodes_as_it_decodes() -> None:
    assert encode_json_value(Decimal("-0")) == b"0"
    assert encode_json_value(Decimal("-0.0")) == b"-0.0"


# --- strict decoding: JSON level ----------------------------------------------------------------


def test_an_escaped_backslash_before_u_is_text_and_a_surrogate_pair_a_character() -> None:
    payload = b'[{"role":"user","parts":[{"kind":"text","text":"\\\\ud800 \\ud83d\\ude00"}]}]'
    [message] = decode_messages(payload, "run 'r1' record 'k1'")
    assert message.parts == (TextPart(text="\\ud800 \U0001f600"),)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff[]", "UTF-8"),
        (b'[{"role":"user","parts":[{"kind":"text","text":"\xed\xa0\x80"}]}]', "UTF-8"),
        (b"[] []", "exactly one JSON value"),
        (b"[]x", "exactly one JSON value"),
        (b"", "exactly one JSON value"),
        (b'{"role":"user","parts":[]}', "JSON array"),
        (b"null", "JSON array"),
        (b'[{"role":"user","role":"user","parts":[]}]', "duplicate key 'role'"),
        (b'[{"role":"user","parts":[{"kind":"text","text":"\\ud800"}]}]', "lone surrogate"),
        (b'[{"role":"user","parts":[{"kind":"text","text":"a \\uDBFF"}]}]', "lone surrogate"),
        (b'[{"role":"user","parts":[{"kind":"text","text":"\\\\u0041\\udc00"}]}]', "lone surrogate"),
        (b'[{"role":"user","parts":[],"meta":{"n":NaN}}]', "exactly one JSON value"),
    ],
)
def test_payload_level_violations_are_refused_and_named(payload: bytes, reason: str) -> None:
    with pytest.raises(TranscriptError, match=reason) as raised:
        decode_messages(payload, "run 'r1' record 'k1'")
    assert "run 'r1' record 'k1'" in str(raised.value)


# --- strict decoding: message and part shapes ---------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"role": "tool", "parts": []},
        {"role": "user"},
        {"role": "user", "parts": [], "extra": 1},
        {"role": "user", "parts": [], "meta": None},
        {"role": "user", "parts": [], "meta": []},
        {"role": "User", "parts": []},
        {"Role": "user", "parts": []},
    ],
)
def test_message_keys_are_exact(message: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError):
        decode_messages(json.dumps([message]).encode(), "test")


def test_empty_array_and_empty_parts_are_valid() -> None:
    assert decode_messages(b"[]", "test") == []
    assert decode_messages(b'[{"role":"user","parts":[]}]', "test") == [Message(role="user", parts=())]


@pytest.mark.parametrize(
    "part",
    [
        {"kind": "video", "bytes": ""},
        {"text": "no kind"},
        {"kind": "Text", "text": "case matters"},
        {"kind": "text", "text": "x", "extra": 1},
        {"kind": "text"},
        {"kind": "text", "text": None},
        {"kind": "text", "text": 5},
        {"kind": "cache_checkpoint", "at": 1},
        {"kind": "image", "format": "bmp", "bytes": "QQ=="},
        {"kind": "image", "format": "png"},
        {"kind": "image", "bytes": "QQ=="},
        {"kind": "image", "format": "png", "bytes": ""},
        {"kind": "image", "format": "png", "bytes": "QQ"},
        {"kind": "image", "format": "png", "bytes": "QR=="},
        {"kind": "tool_use", "id": "", "name": "n", "input": {}},
        {"kind": "tool_use", "id": "a", "name": "", "input": {}},
        {"kind": "tool_use", "id": "a", "name": "n", "input": []},
        {"kind": "tool_use", "id": "a", "name": "n", "input": None},
        {"kind": "tool_use", "id": "a", "name": "n"},
        {"kind": "tool_use", "id": "a", "name": "n", "input": {}, "args": {}},
        {"kind": "tool_result", "tool_use_id": "", "content": 1},
        {"kind": "tool_result", "content": 1},
        {"kind": "tool_result", "tool_use_id": "a"},
        {"kind": "tool_result", "tool_use_id": "a", "content": 1, "is_error": 1},
        {"kind": "tool_result", "tool_use_id": "a", "content": {"r": 1}, "is_error": True},
        {"kind": "tool_result", "tool_use_id": "a", "content": "", "is_error": True},
        {"kind": "thinking", "text": "t", "index": True, "signature": "s"},
        {"kind": "thinking", "signature": "s", "index": -1},
        {"kind": "thinking", "signature": "s", "final": "yes"},
    ],
)
def test_part_violations_are_refused(part: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError):
        decode_messages(one_part(part), "test")


def test_unknown_kind_error_names_the_kind() -> None:
    with pytest.raises(TranscriptError, match="'video'"):
        decode_messages(one_part({"kind": "video"}), "test")


def test_unknown_key_error_names_the_key() -> None:
    with pytest.raises(TranscriptError, match="extra"):
        decode_messages(one_part({"kind": "text", "text": "x", "extra": 1}), "test")


# --- thinking: signed xor redacted --------------------------------------------------------------


def test_signed_thinking_may_have_empty_text() -> None:
    assert decode_one({"kind": "thinking", "signature": "s"}) == ThinkingPart(signature="s")


def test_redacted_thinking_decodes_base64() -> None:
    part = decode_one({"kind": "thinking", "redacted": "AAEC"})
    assert part == ThinkingPart(redacted=b"\x00\x01\x02")


@pytest.mark.parametrize(
    "part",
    [
        {"kind": "thinking"},
        {"kind": "thinking", "text": "unsigned"},
        {"kind": "thinking", "signature": "s", "redacted": "AAEC"},
        {"kind": "thinking", "redacted": "AAEC", "text": "leak"},
        {"kind": "thinking", "signature": "", "redacted": ""},
        {"kind": "thinking", "redacted": "not base64!"},
    ],
)
def test_thinking_must_be_signed_xor_redacted(part: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError):
        decode_messages(one_part(part, role="assistant"), "test")


def test_thinking_xor_holds_for_python_construction_too() -> None:
    with pytest.raises(ValidationError, match="xor"):
        ThinkingPart(signature="s", redacted=b"r")


# --- document: exactly one source, no empty chunk -----------------------------------------------


@pytest.mark.parametrize(
    "source",
    [{"bytes": "QQ=="}, {"text": "t"}, {"chunks": ["a", "b"]}, {"uri": "s3://b/k.pdf"}],
)
def test_document_with_exactly_one_source_is_valid(source: dict[str, Any]) -> None:
    part = decode_one({"kind": "document", "name": "d", **source})
    assert isinstance(part, DocumentPart)
    assert encode_messages([Message(role="user", parts=(part,))]) == one_part(
        {"kind": "document", "name": "d", **source}
    ).replace(b" ", b"")


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "d"},
        {"name": "d", "text": "t", "uri": "u"},
        {"name": "d", "bytes": "QQ==", "chunks": ["a"]},
        {"name": "d", "text": ""},
        {"name": "d", "text": "", "uri": "u"},
        {"name": "d", "chunks": []},
        {"name": "d", "chunks": ["a", ""]},
        {"name": "", "text": "t"},
        {"text": "t"},
        {"name": "d", "text": "t", "cite": "yes"},
        {"name": "d", "text": "t", "pages": 3},
    ],
)
def test_document_violations_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError):
        decode_messages(one_part({"kind": "document", **fields}), "test")


# --- citations: nested keys exact ---------------------------------------------------------------


def citation_part(citation: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "citations", "text": "t", "citations": [citation]}


def test_citation_with_every_key_is_valid() -> None:
    part = decode_one(
        citation_part(
            {
                "title": "T",
                "source": "S",
                "location": {"document_page": {"document_index": 1, "start": 2, "end": 3}},
                "source_content": ["x"],
            }
        )
    )
    assert part == CitationsPart(
        text="t",
        citations=(
            Citation(
                title="T",
                source="S",
                location=CitationLocation(document_page=CitationSpan(document_index=1, start=2, end=3)),
                source_content=("x",),
            ),
        ),
    )


@pytest.mark.parametrize(
    "citation",
    [
        {"title": "T", "url": "u"},
        {"Title": "T"},
        {"location": {}},
        {"location": {"document_char": {"document_index": 0, "start": 0, "end": 1}, "x": 1}},
        {"location": {"document_char": {"document_index": 0, "start": 0}}},
        {"location": {"document_char": {"document_index": 0, "start": 0, "end": 1, "page": 2}}},
        {
            "location": {
                "document_char": {"document_index": 0, "start": 0, "end": 1},
                "document_page": {"document_index": 0, "start": 0, "end": 1},
            }
        },
        {"source_content": "not a list"},
    ],
)
def test_citation_nested_keys_are_exact(citation: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError):
        decode_messages(one_part(citation_part(citation)), "test")


def test_citations_key_is_required() -> None:
    with pytest.raises(TranscriptError):
        decode_messages(one_part({"kind": "citations", "text": "t"}), "test")


# --- tool results -------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [None, "text", 3, True, [1, "a"], {"nested": {"list": [None, False]}}])
def test_tool_result_content_is_any_json(content: Any) -> None:
    part = decode_one({"kind": "tool_result", "tool_use_id": "a", "content": content})
    assert isinstance(part, ToolResultPart) and part.content == content


def test_failed_tool_result_is_its_error_text() -> None:
    part = decode_one({"kind": "tool_result", "tool_use_id": "a", "content": "boom", "is_error": True})
    assert part == ToolResultPart(tool_use_id="a", content="boom", is_error=True)


def test_bounded_tool_result_keeps_small_content_exactly() -> None:
    assert bounded_tool_result({"v": Decimal("1.10")}, False) == {"v": Decimal("1.10")}
    assert bounded_tool_result(None, False) is None


def test_bounded_tool_result_at_the_limit_is_kept() -> None:
    content = "x" * (TOOL_RESULT_MAX_BYTES - 2)  # two quotes make it exactly 64 KiB
    assert len(encode_json_value(content)) == TOOL_RESULT_MAX_BYTES
    assert bounded_tool_result(content, False) == content


def test_bounded_tool_result_over_the_limit_is_omitted() -> None:
    content = "x" * (TOOL_RESULT_MAX_BYTES - 1)
    assert bounded_tool_result(content, False) == {"omitted": True, "reason": "size_limit"}


def test_bounded_tool_result_counts_utf8_bytes_not_characters() -> None:
    content = "é" * (TOOL_RESULT_MAX_BYTES // 2)  # 2 bytes each: over the limit by the quotes
    assert bounded_tool_result(content, False)["omitted"] is True


def test_bounded_tool_result_carries_preview_and_bounds() -> None:
    result = bounded_tool_result(
        ["row"] * 20000, False, preview="first rows", bounds={"returned": 0, "total": 20000}
    )
    assert result == {
        "omitted": True,
        "reason": "size_limit",
        "preview": "first rows",
        "bounds": {"returned": 0, "total": 20000},
    }
    assert encode_json_value(result).startswith(b'{"omitted":true,"reason":"size_limit"')


def test_bounded_tool_result_refuses_an_oversized_preview() -> None:
    with pytest.raises(TranscriptError, match="64 KiB"):
        bounded_tool_result("x" * 70000, False, preview="p" * 70000)


def test_failed_tool_gives_its_error_text() -> None:
    assert bounded_tool_result("timeout after 30s", True) == "timeout after 30s"


@pytest.mark.parametrize("content", [{"partial": 1}, None, "", 3])
def test_result_and_error_together_is_an_error(content: Any) -> None:
    with pytest.raises(TranscriptError):
        bounded_tool_result(content, True)


def test_bounded_tool_result_refuses_non_json() -> None:
    with pytest.raises(TranscriptError):
        bounded_tool_result({"when": object()}, False)


# --- property: arbitrary valid parts round trip --------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
words = st.text(max_size=10)
non_empty = st.text(min_size=1, max_size=10)
blobs = st.binary(min_size=1, max_size=16)

spans = st.builds(
    CitationSpan,
    document_index=st.integers(0, 5),
    start=st.integers(0, 99),
    end=st.integers(0, 99),
)
locations = st.one_of(
    st.builds(CitationLocation, document_char=spans),
    st.builds(CitationLocation, document_chunk=spans),
    st.builds(CitationLocation, document_page=spans),
)
citations = st.builds(
    Citation,
    title=words,
    source=words,
    location=st.none() | locations,
    source_content=st.lists(words, max_size=2).map(tuple),
)
document_sources = st.one_of(
    blobs.map(lambda b: {"bytes": b}),
    non_empty.map(lambda t: {"text": t}),
    st.lists(non_empty, min_size=1, max_size=3).map(lambda c: {"chunks": tuple(c)}),
    non_empty.map(lambda u: {"uri": u}),
)
documents = st.builds(
    lambda source, name, fmt, context, cite: DocumentPart(
        name=name, format=fmt, context=context, cite=cite, **source
    ),
    document_sources,
    non_empty,
    words,
    words,
    st.booleans(),
)
tool_results = st.one_of(
    st.builds(ToolResultPart, tool_use_id=non_empty, content=json_values),
    st.builds(ToolResultPart, tool_use_id=non_empty, content=non_empty, is_error=st.just(True)),
)
parts = st.one_of(
    st.builds(
        ThinkingPart,
        text=words,
        signature=non_empty,
        index=st.integers(0, 9),
        final=st.booleans(),
    ),
    st.builds(ThinkingPart, redacted=blobs, index=st.integers(0, 9), final=st.booleans()),
    st.builds(TextPart, text=words),
    st.builds(ImagePart, format=st.sampled_from(["png", "jpeg", "gif", "webp"]), bytes=blobs),
    documents,
    st.builds(CitationsPart, text=words, citations=st.lists(citations, max_size=2).map(tuple)),
    st.builds(ToolUsePart, id=non_empty, name=non_empty, input=json_objects, thought_signature=words),
    tool_results,
    st.just(CacheCheckpointPart()),
)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant"]),
    parts=st.lists(parts, max_size=4).map(tuple),
    meta=st.none() | json_objects,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=4))
def test_any_valid_transcript_round_trips(transcript: list[Message]) -> None:
    payload = encode_messages(transcript)
    decoded = decode_messages(payload, "property")
    assert decoded == transcript
    assert encode_messages(decoded) == payload


@settings(max_examples=300, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_any_fractional_or_exponent_decimal_keeps_its_digits(number: Decimal) -> None:
    payload = b'[{"role":"user","parts":[{"kind":"tool_result","tool_use_id":"a","content":'
    payload += encode_json_value(number) + b"}]}]"
    part = decode_messages(payload, "property")[0].parts[0]
    assert isinstance(part, ToolResultPart)
    assert part.content == number
    if number.as_tuple().exponent != 0:
        assert str(part.content) == str(number)
