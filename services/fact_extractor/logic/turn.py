"""One recorded turn as the extractor reads it, and the extraction request it makes of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quipu.contracts.memory import Fact, HistoryMessage, HistoryRecorded
from quipu.contracts.transcript import Message, TextPart
from quipu.services.domain.models.port import ModelRequest
from quipu.services.fact_extractor.logic.proposals import (
    EXTRACTION_SYSTEM,
    FACT_OPERATIONS_SCHEMA,
    fenced_json,
)


@dataclass(frozen=True)
class TurnRows:
    """The history rows one extraction reads: what the user said, around it."""

    user: HistoryMessage
    """The user's row of the turn (its seq is the event's first_seq)."""
    assistant: HistoryMessage | None = None
    """The answer of the turn."""
    previous_assistant: HistoryMessage | None = None
    """The assistant message the user was answering (a confirmation confirms it)."""


def turn_number(event: HistoryRecorded) -> int:
    """The turn's position in its session, from 1 (two rows per turn, the user's first)."""
    return (event.first_seq + 1) // 2


def extraction_request(
    event: HistoryRecorded, rows: TurnRows, facts: Sequence[Fact], max_tokens: int
) -> ModelRequest:
    """The structured-output call that proposes operations for one turn."""
    data = {
        "saved_facts": [
            {"fact_id": fact.fact_id, "text": fact.text, "updated": fact.updated_at.date().isoformat()}
            for fact in facts
        ],
        "turn": {
            "assistant_before": rows.previous_assistant.text if rows.previous_assistant else "",
            "user_said": rows.user.text,
            "assistant_answered": rows.assistant.text if rows.assistant else "",
        },
    }
    prompt = f"<data>\n{fenced_json(data)}\n</data>\nPropose the operations on the saved facts."
    return ModelRequest(
        system=EXTRACTION_SYSTEM,
        messages=[Message(role="user", parts=(TextPart(text=prompt),))],
        max_tokens=max_tokens,
        output_schema=FACT_OPERATIONS_SCHEMA,
        call_key=f"facts/{event.turn_id}",
    )
