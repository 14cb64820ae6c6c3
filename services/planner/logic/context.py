"""A request's context: the history window, the seed, and compaction of history over the budget."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from quipu.contracts.envelope import derive_id
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.lifecycle import Failure
from quipu.contracts.store import Record
from quipu.contracts.transcript import Message, TextPart
from quipu.services.domain.memory.context import ContextBlocks
from quipu.services.domain.memory.summary import summary_block, summary_of_block
from quipu.services.planner.logic.keys import CONTEXT_OVERFLOW, HISTORY_COMPACTED_TYPE, compacted_key
from quipu.services.planner.logic.payloads import Compaction
from quipu.services.planner.logic.view import RunView, is_user_text, text_of


def history_window(turns: Sequence[tuple[str, str]], max_messages: int) -> list[Message]:
    """The last whole turns, as user/assistant text messages, at most `max_messages` of them."""
    keep = max(0, max_messages // 2)
    window = list(turns)[-keep:] if keep else []
    messages: list[Message] = []
    for said, answered in window:
        messages.append(Message(role="user", parts=(TextPart(text=said),)))
        messages.append(Message(role="assistant", parts=(TextPart(text=answered),)))
    return messages


def history_turns(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Index ranges `[start, end)` of the earlier turns a request may drop, oldest first.

    The history is every non-system message before the current turn's user text (the last
    user message with text: tool results carry none), cut into turns at each user text.
    """
    current = next((index for index in range(len(messages) - 1, -1, -1) if is_user_text(messages[index])), -1)
    starts = [index for index in range(max(current, 0)) if is_user_text(messages[index])]
    return [(start, end) for start, end in zip(starts, [*starts[1:], current], strict=True)]


def compacted_summary_note(dropped_turns: int) -> str:
    """What a compacted summary block covers."""
    plural = "s" if dropped_turns != 1 else ""
    return (
        f"the session's summary and the {dropped_turns} oldest turn{plural} of the history, "
        "compacted to fit this request"
    )


def summary_text(messages: Sequence[Message]) -> str:
    """The summary in a request's summary block (empty when it has none)."""
    for message in messages:
        if message.role == "system":
            found = summary_of_block(text_of(message))
            if found is not None:
                return found
    return ""


def fit_messages(messages: Sequence[Message], drop: int, summary: str | None) -> list[Message]:
    """`messages` without the `drop` oldest history turns, the summary block replaced by `summary`.

    `summary` None removes the block; a new block goes after the other system blocks, directly
    above the history.
    """
    turns = history_turns(messages)[:drop]
    dropped = {index for start, end in turns for index in range(start, end)}
    kept = [
        message
        for index, message in enumerate(messages)
        if index not in dropped
        and not (message.role == "system" and summary_of_block(text_of(message)) is not None)
    ]
    if summary is None or not summary.strip():
        return kept
    block = Message(
        role="system", parts=(TextPart(text=summary_block(summary, compacted_summary_note(drop))),)
    )
    position = next((index for index, message in enumerate(kept) if message.role != "system"), len(kept))
    return [*kept[:position], block, *kept[position:]]


def compacted_messages(messages: Sequence[Message], compaction: Compaction | None) -> list[Message]:
    """The run's messages as its latest compaction lets a request see them."""
    if compaction is None:
        return list(messages)
    return fit_messages(messages, compaction.dropped_turns, compaction.summary)


def dropped_messages(messages: Sequence[Message], first: int, last: int) -> list[Message]:
    """The messages of history turns `first` to `last - 1` (the ones a compaction summarises)."""
    turns = history_turns(messages)[first:last]
    return [message for start, end in turns for message in messages[start:end]]


def compaction_record(view: RunView, compaction: Compaction, at: datetime) -> Record:
    """The `history_compacted` record of a compaction."""
    return view.record(compacted_key(compaction.step), HISTORY_COMPACTED_TYPE, compaction.encode(), at)


def compaction_event(view: RunView, compaction: Compaction, at: datetime) -> RunEvent:
    """The `history_compacted` event: how many turns were compacted, tokens before and after."""
    key = compacted_key(compaction.step)
    return RunEvent(
        event_id=derive_id(view.run_id, key),
        occurred_at=at,
        type=StreamEventType.HISTORY_COMPACTED,
        event_key=key,
        run_id=view.run_id,
        session_id=view.session_id,
        timestamp=at,
        payload={
            "step": compaction.step,
            "dropped_turns": compaction.dropped_turns,
            "tokens_before": compaction.tokens_before,
            "tokens_after": compaction.tokens_after,
        },
    )


def overflow_failure(needed: int, budget: int, why: str = "") -> Failure:
    """The failure of a turn that cannot fit its request budget even without any history."""
    return Failure(
        message=why
        or (
            f"the current turn alone needs {needed} input tokens, over the request budget of "
            f"{budget}: it cannot be sent even with every earlier turn dropped"
        ),
        kind=CONTEXT_OVERFLOW,
        retryable=False,
    )


def seed_messages(blocks: ContextBlocks) -> list[Message]:
    """The `seed` record's messages: system blocks (as system messages) then the history."""
    system = [Message(role="system", parts=(TextPart(text=text),)) for text in blocks.system_blocks if text]
    return [*system, *blocks.history]
