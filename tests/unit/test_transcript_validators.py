"""ValidatePlannerTranscript and ValidateThinkingFirst (STORE_CONTRACT §10)."""

from __future__ import annotations

import pytest

from quipu.contracts.transcript import (
    Message,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    TranscriptError,
)
from quipu.services.domain.transcript import validate_planner_transcript, validate_thinking_first
from tests.support.transcripts import assistant, result, text, user


def use(tool_id: str) -> ToolUsePart:
    return ToolUsePart(id=tool_id, name="lookup", input={"q": tool_id})


def thinking() -> ThinkingPart:
    return ThinkingPart(text="plan", signature="sig")


# --- ValidatePlannerTranscript: passing ---------------------------------------------------------


def test_plain_conversation_is_valid() -> None:
    validate_planner_transcript(
        [Message(role="system", parts=(text("s"),)), user(text("q")), assistant(text("a"))]
    )


def test_empty_transcript_is_valid() -> None:
    validate_planner_transcript([])


def test_tool_round_trip_is_valid_with_results_in_any_order_and_extra_user_parts() -> None:
    messages = [
        user(text("q")),
        assistant(thinking(), text("calling"), use("a"), use("b")),
        user(result("b"), text("note"), result("a")),
        assistant(text("done")),
    ]
    validate_planner_transcript(messages)


def test_contiguous_assistant_messages_form_one_group() -> None:
    messages = [
        user(text("q")),
        assistant(thinking(), use("a")),
        assistant(use("b")),
        user(result("a"), result("b")),
    ]
    validate_planner_transcript(messages)


def test_successive_groups_each_answered_are_valid() -> None:
    messages = [
        user(text("q")),
        assistant(use("a")),
        user(result("a")),
        assistant(use("b")),
        user(result("b", None)),
        assistant(text("done")),
    ]
    validate_planner_transcript(messages)


def test_validator_does_not_modify_messages() -> None:
    messages = [user(text("q")), assistant(use("a")), user(result("a"))]
    before = list(messages)
    validate_planner_transcript(messages)
    assert messages == before


# --- ValidatePlannerTranscript: failing ---------------------------------------------------------


def test_missing_result_is_an_error() -> None:
    messages = [user(text("q")), assistant(use("a"), use("b")), user(result("a"))]
    with pytest.raises(TranscriptError, match=r"missing tool_result.*'b'"):
        validate_planner_transcript(messages)


def test_tool_use_at_the_end_without_results_is_an_error() -> None:
    with pytest.raises(TranscriptError, match="followed at once"):
        validate_planner_transcript([user(text("q")), assistant(use("a"))])


def test_result_not_immediately_after_the_group_is_an_error() -> None:
    messages = [
        user(text("q")),
        assistant(use("a")),
        user(text("interjection")),
        user(result("a")),
    ]
    with pytest.raises(TranscriptError, match="missing tool_result"):
        validate_planner_transcript(messages)


def test_group_followed_by_system_message_is_an_error() -> None:
    messages = [
        user(text("q")),
        assistant(use("a")),
        Message(role="system", parts=(text("s"),)),
        user(result("a")),
    ]
    with pytest.raises(TranscriptError, match="followed at once"):
        validate_planner_transcript(messages)


def test_duplicate_use_id_in_one_group_is_an_error() -> None:
    messages = [user(text("q")), assistant(use("a"), use("a")), user(result("a"))]
    with pytest.raises(TranscriptError, match="duplicate tool_use id 'a'"):
        validate_planner_transcript(messages)


def test_duplicate_use_id_across_groups_is_an_error() -> None:
    messages = [
        user(text("q")),
        assistant(use("a")),
        user(result("a")),
        assistant(use("a")),
        user(result("a")),
    ]
    with pytest.raises(TranscriptError, match="duplicate tool_use id 'a'"):
        validate_planner_transcript(messages)


def test_duplicate_result_is_an_error() -> None:
    messages = [user(text("q")), assistant(use("a")), user(result("a"), result("a"))]
    with pytest.raises(TranscriptError, match="duplicate tool_result"):
        validate_planner_transcript(messages)


def test_result_for_an_unknown_use_is_an_error() -> None:
    messages = [user(text("q")), assistant(use("a")), user(result("a"), result("zz"))]
    with pytest.raises(TranscriptError, match="'zz' answers no tool use"):
        validate_planner_transcript(messages)


def test_orphan_result_without_any_group_is_an_error() -> None:
    with pytest.raises(TranscriptError, match="without a preceding tool-use group"):
        validate_planner_transcript([user(result("a"))])


def test_orphan_result_after_a_plain_assistant_reply_is_an_error() -> None:
    messages = [user(text("q")), assistant(text("no tools")), user(result("a"))]
    with pytest.raises(TranscriptError, match=r"message 2.*without a preceding"):
        validate_planner_transcript(messages)


def test_result_inside_an_assistant_message_is_an_orphan() -> None:
    messages = [user(text("q")), assistant(text("x"), result("a"))]
    with pytest.raises(TranscriptError, match="without a preceding"):
        validate_planner_transcript(messages)


def test_tool_use_in_a_user_message_is_an_error() -> None:
    with pytest.raises(TranscriptError, match="outside an assistant message"):
        validate_planner_transcript([user(use("a"))])


def test_empty_ids_are_an_error_even_when_models_were_built_unchecked() -> None:
    # model_construct skips validation; the validator must not rely on the model having run.
    empty_use = ToolUsePart.model_construct(id="", name="n", input={})
    with pytest.raises(TranscriptError, match="empty id"):
        validate_planner_transcript([assistant(empty_use), user(result("x"))])
    empty_result = ToolResultPart.model_construct(tool_use_id="", content=None, is_error=False)
    with pytest.raises(TranscriptError, match="empty tool_use_id"):
        validate_planner_transcript([assistant(use("a")), user(empty_result)])


# --- ValidateThinkingFirst ----------------------------------------------------------------------


def test_thinking_first_passes_when_tool_messages_start_with_thinking() -> None:
    validate_thinking_first(
        [
            user(text("q")),
            assistant(thinking(), text("calling"), use("a")),
            user(result("a")),
            assistant(text("answer without tools needs no thinking")),
        ]
    )


def test_thinking_first_accepts_redacted_thinking() -> None:
    validate_thinking_first([assistant(ThinkingPart(redacted=b"x"), use("a"))])


def test_thinking_first_fails_when_text_comes_first() -> None:
    messages = [user(text("q")), assistant(text("calling"), thinking(), use("a"))]
    with pytest.raises(TranscriptError, match=r"message 1.*start with thinking"):
        validate_thinking_first(messages)


def test_thinking_first_fails_without_thinking() -> None:
    with pytest.raises(TranscriptError, match="start with thinking"):
        validate_thinking_first([assistant(use("a"))])


def test_thinking_first_checks_each_message_of_a_group() -> None:
    messages = [assistant(thinking(), use("a")), assistant(use("b"))]
    with pytest.raises(TranscriptError, match="message 1"):
        validate_thinking_first(messages)
