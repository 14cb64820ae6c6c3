"""Anthropic Messages encoding of a transcript and decoding of response content (§10)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import anthropic
import httpx2
import pytest

from quipu.contracts.transcript import (
    CacheCheckpointPart,
    Citation,
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
)
from quipu.services.domain.transcript import (
    anthropic_tool_id_aliases,
    decode_anthropic_content,
    encode_anthropic_messages,
    tool_result_text,
)
from tests.support.transcripts import assistant, result, system, text, user


def use(tool_id: str, **tool_input: Any) -> ToolUsePart:
    return ToolUsePart(id=tool_id, name="calc", input=tool_input)


def blocks_of(messages: list[Message]) -> list[list[dict[str, Any]]]:
    return [m["content"] for m in encode_anthropic_messages(messages)[1]]


# --- system -------------------------------------------------------------------------------------


def test_system_messages_become_text_blocks_outside_the_conversation() -> None:
    system_blocks, conversation = encode_anthropic_messages(
        [system(text("You are terse."), text("Use SI units.")), user(text("hi"))]
    )
    assert system_blocks == [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Use SI units."},
    ]
    assert conversation == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize(
    "part",
    [
        ThinkingPart(signature="s"),
        ToolUsePart(id="a", name="n", input={}),
        ToolResultPart(tool_use_id="a", content=None),
        CacheCheckpointPart(),
    ],
)
def test_system_messages_carry_text_only(part: Part) -> None:
    with pytest.raises(TranscriptError, match="system messages carry text only"):
        encode_anthropic_messages([system(text("s"), part), user(text("hi"))])


# --- thinking -----------------------------------------------------------------------------------


def test_signed_thinking_becomes_a_thinking_block() -> None:
    messages = [user(text("q")), assistant(ThinkingPart(text="", signature="sig", final=True))]
    assert blocks_of(messages)[1] == [{"type": "thinking", "thinking": "", "signature": "sig"}]


def test_redacted_thinking_becomes_redacted_thinking_data() -> None:
    messages = [user(text("q")), assistant(ThinkingPart(redacted=b"EmwKAhgB"))]
    assert blocks_of(messages)[1] == [{"type": "redacted_thinking", "data": "EmwKAhgB"}]


def test_redacted_bytes_that_did_not_come_from_the_api_are_refused() -> None:
    messages = [user(text("q")), assistant(ThinkingPart(redacted=b"\xff\xfe"))]
    with pytest.raises(TranscriptError, match="redacted thinking"):
        encode_anthropic_messages(messages)


def test_thinking_outside_assistant_messages_is_an_error() -> None:
    with pytest.raises(TranscriptError, match="only allowed in assistant"):
        encode_anthropic_messages([user(ThinkingPart(signature="s"), text("q"))])


def test_unsigned_unredacted_thinking_is_an_error_even_if_built_unchecked() -> None:
    bare = ThinkingPart.model_construct(text="t", signature="", redacted=b"", index=0, final=False)
    # A validated Message re-runs the part's invariant, so the message must be unchecked too.
    unchecked = Message.model_construct(role="assistant", parts=(bare,), meta=None)
    with pytest.raises(TranscriptError, match="neither signed nor redacted"):
        encode_anthropic_messages([user(text("q")), unchecked])


# --- order --------------------------------------------------------------------------------------


def test_parts_keep_their_order() -> None:
    messages = [
        user(text("q")),
        assistant(ThinkingPart(text="t", signature="s"), text("calling"), use("a"), use("b")),
        user(result("b"), text("between"), result("a")),
    ]
    kinds = [[block["type"] for block in blocks] for blocks in blocks_of(messages)]
    assert kinds == [
        ["text"],
        ["thinking", "text", "tool_use", "tool_use"],
        ["tool_result", "text", "tool_result"],
    ]


# --- tool results -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("plain text", "plain text"),
        ('{"already":"json"}', '{"already":"json"}'),
        (None, ""),
        (3, "3"),
        (True, "true"),
        ([1, "a"], '[1,"a"]'),
        ({"v": Decimal("1.10"), "s": "é"}, '{"v":1.10,"s":"é"}'),
    ],
)
def test_tool_result_content_becomes_a_string(content: Any, expected: str) -> None:
    messages = [user(text("q")), assistant(use("a")), user(result("a", content))]
    assert blocks_of(messages)[2] == [
        {"type": "tool_result", "tool_use_id": "a", "content": expected, "is_error": False}
    ]
    assert tool_result_text(content) == expected


def test_failed_tool_result_keeps_is_error() -> None:
    messages = [user(text("q")), assistant(use("a")), user(result("a", "boom", is_error=True))]
    assert blocks_of(messages)[2] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "boom", "is_error": True}
    ]


def test_tool_use_input_numbers_are_sent_as_equal_floats() -> None:
    messages = [user(text("q")), assistant(use("a", x=Decimal("1.10"), n=[2, Decimal("1E+2")]))]
    block = blocks_of(messages)[1][0]
    assert block == {"type": "tool_use", "id": "a", "name": "calc", "input": {"x": 1.1, "n": [2, 100.0]}}
    assert isinstance(block["input"]["x"], float)


def test_tool_use_number_no_float_can_carry_is_refused_not_rounded() -> None:
    messages = [user(text("q")), assistant(use("a", x=Decimal("0.1000000000000000000001")))]
    with pytest.raises(TranscriptError, match="cannot be sent exactly"):
        encode_anthropic_messages(messages)


def test_tool_parts_in_the_wrong_role_are_errors() -> None:
    with pytest.raises(TranscriptError, match="tool_use is only allowed in assistant"):
        encode_anthropic_messages([user(use("a"))])
    with pytest.raises(TranscriptError, match="tool_result is only allowed in user"):
        encode_anthropic_messages([assistant(result("a"))])


# --- rejected parts -----------------------------------------------------------------------------

REJECTED: list[Part] = [
    ImagePart(format="png", bytes=b"\x89PNG"),
    DocumentPart(name="spec", text="# Spec"),
    CitationsPart(text="t", citations=(Citation(title="T"),)),
    CacheCheckpointPart(),
]


@pytest.mark.parametrize("part", REJECTED, ids=lambda p: p.kind)
@pytest.mark.parametrize("wrap", [user, assistant], ids=["user", "assistant"])
def test_unsupported_parts_are_errors_never_dropped(part: Part, wrap: Any) -> None:
    with pytest.raises(TranscriptError, match=f"{part.kind} parts cannot be sent"):
        encode_anthropic_messages([user(text("q")), wrap(text("before"), part)])


def test_message_without_parts_is_an_error() -> None:
    with pytest.raises(TranscriptError, match="at least one part"):
        encode_anthropic_messages([user()])


# --- tool id aliasing ---------------------------------------------------------------------------


def test_safe_ids_are_sent_unchanged() -> None:
    longest = "A" * 64
    messages = [
        user(text("q")),
        assistant(use("toolu_01-Ab"), use(longest)),
        user(result("toolu_01-Ab"), result(longest)),
    ]
    assert anthropic_tool_id_aliases(messages) == {}
    blocks = blocks_of(messages)
    assert [b["id"] for b in blocks[1]] == ["toolu_01-Ab", longest]
    assert [b["tool_use_id"] for b in blocks[2]] == ["toolu_01-Ab", longest]


def test_unsafe_ids_get_aliases_that_skip_safe_ids_present() -> None:
    messages = [
        user(text("q")),
        # t1 and t3 are real (safe) ids in this request: aliases must not take them.
        assistant(use("t1"), use("call:1"), use("t3"), use("B" * 65), use("x\n")),
        user(result("t1"), result("call:1"), result("t3"), result("B" * 65), result("x\n")),
    ]
    assert anthropic_tool_id_aliases(messages) == {"call:1": "t2", "B" * 65: "t4", "x\n": "t5"}
    blocks = blocks_of(messages)
    assert [b["id"] for b in blocks[1]] == ["t1", "t2", "t3", "t4", "t5"]
    assert [b["tool_use_id"] for b in blocks[2]] == ["t1", "t2", "t3", "t4", "t5"]


def test_alias_skips_a_safe_id_that_appears_only_later_or_only_in_a_result() -> None:
    messages = [
        user(text("q")),
        assistant(use("a b")),
        user(result("a b")),
        assistant(use("t1")),
        user(result("t1"), result("t2")),
    ]
    aliases = anthropic_tool_id_aliases(messages)
    assert aliases == {"a b": "t3"}


def test_aliasing_leaves_the_transcript_with_canonical_ids() -> None:
    messages = [user(text("q")), assistant(use("ns/tool#1")), user(result("ns/tool#1"))]
    snapshot = [m.model_copy(deep=True) for m in messages]
    encode_anthropic_messages(messages)
    assert messages == snapshot
    part = messages[1].parts[0]
    assert isinstance(part, ToolUsePart) and part.id == "ns/tool#1"


def test_aliases_are_deterministic_per_request() -> None:
    messages = [user(text("q")), assistant(use("é1"), use("é2")), user(result("é1"), result("é2"))]
    assert encode_anthropic_messages(messages) == encode_anthropic_messages(messages)
    assert anthropic_tool_id_aliases(messages) == {"é1": "t1", "é2": "t2"}


# --- decoding response content ------------------------------------------------------------------


def test_response_blocks_map_to_parts_in_order() -> None:
    parts = decode_anthropic_content(
        [
            {"type": "thinking", "thinking": "first", "signature": "s1"},
            {"type": "redacted_thinking", "data": "opaque=="},
            {"type": "text", "text": "hi", "citations": None},
            {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"x": 1.5}, "caller": None},
        ]
    )
    assert parts == [
        ThinkingPart(text="first", signature="s1", index=0, final=False),
        ThinkingPart(redacted=b"opaque==", index=1, final=True),
        TextPart(text="hi"),
        ToolUsePart(id="toolu_1", name="calc", input={"x": Decimal("1.5")}),
    ]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
        {"type": "text", "text": "cited", "citations": [{"type": "char_location"}]},
        {"type": "thinking", "thinking": "no signature", "signature": ""},
        {"type": "thinking", "thinking": "missing signature"},
        {"type": "redacted_thinking", "data": 5},
        {"type": "tool_use", "id": "", "name": "calc", "input": {}},
        {"type": "tool_use", "id": "t", "name": "calc", "input": "not an object"},
        {"text": "no type"},
    ],
)
def test_unmappable_response_blocks_are_errors(block: dict[str, Any]) -> None:
    with pytest.raises(TranscriptError, match="content block 1"):
        decode_anthropic_content([{"type": "text", "text": "ok"}, block])


# --- through the real SDK -----------------------------------------------------------------------

RESPONSE_CONTENT = [
    {"type": "thinking", "thinking": "Let me add.", "signature": "EqQBCkYIBxgCKkA"},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
    {"type": "text", "text": "Adding now."},
    {"type": "tool_use", "id": "toolu_01A", "name": "calc", "input": {"a": 1.25, "b": [2, 0.1]}},
]


def fake_messages_api(seen: list[dict[str, Any]]) -> httpx2.MockTransport:
    # anthropic 2.x sends through httpx2 and refuses plain httpx clients.
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        body = {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": RESPONSE_CONTENT,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 20},
        }
        return httpx2.Response(200, json=body)

    return httpx2.MockTransport(handle)


def test_sdk_sends_the_encoding_and_its_response_decodes_back_exactly() -> None:
    seen: list[dict[str, Any]] = []
    client = anthropic.Anthropic(api_key="test", http_client=httpx2.Client(transport=fake_messages_api(seen)))
    transcript = [
        system(text("Be exact.")),
        user(text("add 1.25 and 2")),
        assistant(ThinkingPart(text="t", signature="sig"), use("call:7", a=Decimal("1.25"))),
        user(result("call:7", {"sum": Decimal("3.25")})),
    ]
    system_blocks, conversation = encode_anthropic_messages(transcript)

    # Plain dicts stand in for the SDK's TypedDicts; the SDK serialises them as sent.
    response = client.messages.create(  # type: ignore[call-overload]
        model="claude-test",
        max_tokens=2048,
        system=system_blocks,
        messages=conversation,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )

    sent = seen[0]
    assert sent["system"] == [{"type": "text", "text": "Be exact."}]
    assert sent["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "t1",
        "name": "calc",
        "input": {"a": 1.25},
    }
    assert sent["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": '{"sum":3.25}',
        "is_error": False,
    }

    parts = decode_anthropic_content([block.model_dump() for block in response.content])
    _, again = encode_anthropic_messages([user(text("q")), assistant(*parts)])
    assert again[1]["content"] == RESPONSE_CONTENT
