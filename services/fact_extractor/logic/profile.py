"""The profile: when it is due, what the model is asked for it, and the lines that are kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quipu.contracts.memory import Fact, HistoryRecorded, Profile
from quipu.contracts.transcript import Message, TextPart
from quipu.services.domain.memory.safety import SensitiveCategory, sensitive_category
from quipu.services.domain.models.port import ModelRequest
from quipu.services.fact_extractor.logic.proposals import PROFILE_SCHEMA, PROFILE_SYSTEM, fenced_json
from quipu.services.fact_extractor.logic.turn import turn_number
from quipu.services.fact_extractor.logic.validation import clean_text, normalized


@dataclass(frozen=True)
class ProfileLimits:
    """The bounds of a profile (from the service settings)."""

    max_lines: int = 8
    max_line_chars: int = 200
    max_chars: int = 800


def profile_due(event: HistoryRecorded, every_turns: int) -> bool:
    """Whether this turn rewrites the profile: every `every_turns`-th turn of a session (0: never)."""
    return every_turns > 0 and turn_number(event) % every_turns == 0


def profile_request(
    event: HistoryRecorded,
    previous: Profile | None,
    facts: Sequence[Fact],
    user_said: Sequence[str],
    max_tokens: int,
) -> ModelRequest:
    """The structured-output call that rewrites the profile from the user's recent words."""
    data = {
        "previous_profile": previous.text if previous is not None else "",
        "saved_facts": [fact.text for fact in facts],
        "user_said_recently": list(user_said),
    }
    prompt = f"<data>\n{fenced_json(data)}\n</data>\nRewrite the profile."
    return ModelRequest(
        system=PROFILE_SYSTEM,
        messages=[Message(role="user", parts=(TextPart(text=prompt),))],
        max_tokens=max_tokens,
        output_schema=PROFILE_SCHEMA,
        call_key=f"profile/{event.turn_id}",
    )


@dataclass(frozen=True)
class ProfileText:
    """The profile text that may be saved, and why lines were left out."""

    text: str
    refused: list[SensitiveCategory]
    dropped: int
    """Lines left out for being malformed, empty, too long, repeated or past the caps."""


def profile_text(lines: Sequence[Any], limits: ProfileLimits) -> ProfileText:
    """The model's lines, cleaned, filtered line by line and capped."""
    kept: list[str] = []
    refused: list[SensitiveCategory] = []
    dropped = 0
    seen: set[str] = set()
    size = 0
    for line in lines:
        text = clean_text(line).lstrip("-*• ").strip() if isinstance(line, str) else ""
        if not text or len(text) > limits.max_line_chars or normalized(text) in seen:
            dropped += 1
            continue
        category = sensitive_category(text)
        if category is not None:
            refused.append(category)
            continue
        if len(kept) >= limits.max_lines or size + len(text) + 1 > limits.max_chars:
            dropped += 1
            continue
        kept.append(text)
        seen.add(normalized(text))
        size += len(text) + 1
    return ProfileText(text="\n".join(kept), refused=refused, dropped=dropped)
