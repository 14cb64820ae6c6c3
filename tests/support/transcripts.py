"""Transcript messages as the tests write them: a message of a role holding parts, a text part, a
tool result.

    transcript = [user(text("6*7?")), assistant(use_part), user(result("toolu_1", 42))]
"""

from __future__ import annotations

from typing import Any

from quipu.contracts.transcript import Message, Part, TextPart, ToolResultPart


def user(*parts: Part) -> Message:
    """A user's message holding `parts`."""
    return Message(role="user", parts=parts)


def assistant(*parts: Part) -> Message:
    """An assistant's message holding `parts`."""
    return Message(role="assistant", parts=parts)


def system(*parts: Part) -> Message:
    """A system message holding `parts`."""
    return Message(role="system", parts=parts)


def text(value: str) -> TextPart:
    """A text part."""
    return TextPart(text=value)


def result(tool_id: str, content: Any = "ok", is_error: bool = False) -> ToolResultPart:
    """The result of tool use `tool_id`."""
    return ToolResultPart(tool_use_id=tool_id, content=content, is_error=is_error)
