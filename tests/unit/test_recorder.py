"""The transcript recorder on the in-memory memory store: two rows per turn, the window, the fold.

What a user would see: the session's history rows (exactly what was said), the rolling summary
and its cursor, and what the summarizer model was given. The model is instrumented: every
summarizer request is parsed back into the turns it was shown, so "each message is summarised
exactly once" is counted, not assumed.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import HistoryAppendResult, HistoryRole, HistoryTurn, MemoryScope, SessionSummary
from quipu.contracts.runs import TurnCompleted
from quipu.contracts.transcript import TextPart
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.summary import Summarizer, read_summarizer_request
from quipu.services.domain.models.estimate import estimate_text_tokens
from quipu.services.domain.models.port import (
    ModelError,
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    Usage,
)
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.kit.delivery import PermanentError
from quipu.services.transcript_recorder.logic import TranscriptRecorder, fold_key
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings

SESSION = "s-recorder"
_MARK = re.compile(r"\b([ua])(\d+)\b")


def said(number: int) -> str:
    return f"u{number} I would like parcel number {number} delivered on a weekday."


def answered(number: int) -> str:
    return f"a{number} Noted, parcel {number} will be delivered on a weekday."


def turn_completed(number: int, session_id: str = SESSION, **fields: Any) -> TurnCompleted:
    values: dict[str, Any] = {
        "session_id": session_id,
        "run_id": f"{session_id}-run-{number}",
        "agent_id": "assistant",
        "principal_id": "ana",
        "user_text": said(number),
        "assistant_text": answered(number),
        "occurred_at": datetime(2026, 1, 1, 12, 0, number % 60, 123456, tzinfo=UTC),
        **fields,
    }
    return TurnCompleted(**values)


class SummaryModel:
    """A summarizer model that writes one sentence per folded user message and counts what it read."""

    name = "summary-model"

    def __init__(self, *, sentence: str = "The user asked for parcel {n}.") -> None:
        self.sentence = sentence
        self.requests: list[ModelRequest] = []
        self.reads: Counter[str] = Counter()
        """"u7" / "a7" -> how many summarizer requests contained that message."""
        self.failures: list[ModelError] = []

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        fold = read_summarizer_request(request)
        assert fold is not None
        self.requests.append(request)
        if self.failures:
            raise self.failures.pop(0)
        marks = [f"{role}{n}" for utterance in fold.new for role, n in _MARK.findall(utterance.text)]
        self.reads.update(set(marks))
        added = " ".join(self.sentence.format(n=mark[1:]) for mark in marks if mark.startswith("u"))
        text = f"{fold.existing} {added}".strip()
        return ModelResponse(
            parts=[TextPart(text=f'{{"summary": "{text}"}}')],
            stop_reason=StopReason.END_TURN,
            usage=Usage(input_tokens=1, output_tokens=1),
            model=self.name,
        )

    async def count_tokens(self, request: ModelRequest) -> int:
        return 0


def make_recorder(
    memory: InMemoryMemoryStore | None = None,
    model: Any = None,
    **options: Any,
) -> tuple[TranscriptRecorder, InMemoryMemoryStore, Any]:
    memory = memory or InMemoryMemoryStore()
    model = model or SummaryModel()
    max_tokens = options.pop("summary_max_tokens", 300)
    return TranscriptRecorder(memory, Summarizer(model, max_tokens), **options), memory, model


async def all_rows(memory: InMemoryMemoryStore, session_id: str = SESSION) -> list[Any]:
    return await memory.list_history(session_id, 0, 500)


# --- recording --------------------------------------------------------------------------------


async def test_a_turn_is_two_rows_of_exactly_what_was_said() -> None:
    recorder, memory, _ = make_recorder()
    recorded = await recorder.record(turn_completed(1))

    rows = await all_rows(memory)
    assert [(row.seq, row.role, row.text, row.turn_id) for row in rows] == [
        (1, HistoryRole.USER, said(1), f"{SESSION}-run-1"),
        (2, HistoryRole.ASSISTANT, answered(1), f"{SESSION}-run-1"),
    ]
    assert recorded.appended == HistoryAppendResult(first_seq=1, last_seq=2, inserted=True)
    # Stored at the message's time, truncated to the millisecond the store keeps.
    assert rows[0].created_at == datetime(2026, 1, 1, 12, 0, 1, 123000, tzinfo=UTC)


async def test_a_redelivered_turn_writes_nothing_new() -> None:
    recorder, memory, model = make_recorder()
    for number in range(1, 9):
        await recorder.record(turn_completed(number))
    rows_before = await all_rows(memory)
    summary_before = await memory.load_summary(SESSION)
    asked = len(model.requests)

    again = await recorder.record(turn_completed(8))
    older = await recorder.record(turn_completed(3))

    assert await all_rows(memory) == rows_before
    assert await memory.load_summary(SESSION) == summary_before
    assert len(model.requests) == asked  # nothing new left the window: no summarizer call
    assert again.appended == HistoryAppendResult(first_seq=15, last_seq=16, inserted=False)
    assert older.appended == HistoryAppendResult(first_seq=5, last_seq=6, inserted=False)
    assert again.summaries == older.summaries == ()


async def test_opt_out_agents_and_turns_without_a_principal_are_recorded_too() -> None:
    recorder, memory, _ = make_recorder()
    await recorder.record(turn_completed(1, agent_id="private_agent"))
    await recorder.record(turn_completed(1, session_id="s-anonymous", principal_id=""))

    assert [row.agent_id for row in await all_rows(memory)] == ["private_agent", "private_agent"]
    anonymous = await all_rows(memory, "s-anonymous")
    assert [row.principal_id for row in anonymous] == ["session:s-anonymous"] * 2


async def test_a_turn_without_a_session_or_of_another_principal_is_refused_for_good() -> None:
    recorder, _, _ = make_recorder()
    with pytest.raises(PermanentError, match="no session"):
        await recorder.record(turn_completed(1, session_id=""))
    await recorder.record(turn_completed(1))
    with pytest.raises(PermanentError, match="SESSION_PRINCIPAL_MISMATCH"):
        await recorder.record(turn_completed(2, principal_id="someone-else"))


async def test_a_turn_told_after_its_principal_was_forgotten_keeps_nothing() -> None:
    recorder, memory, model = make_recorder(window_messages=2)
    for number in range(1, 4):
        await recorder.record(turn_completed(number))
    await memory.forget_principal("", "ana")
    asked = len(model.requests)

    # A redelivered turn, and one said before the forget that had not been recorded yet: settled
    # (nothing dead-lettered), nothing written, no summary folded from them.
    assert (await recorder.record(turn_completed(2))).appended is None
    assert (await recorder.record(turn_completed(7))).appended is None
    assert await all_rows(memory) == []
    assert await memory.load_summary(SESSION) is None
    assert len(model.requests) == asked

    # The person comes back: what they say from now on is kept.
    back = await recorder.record(turn_completed(9, occurred_at=utc_now_ms() + timedelta(seconds=1)))
    assert back.appended == HistoryAppendResult(first_seq=1, last_seq=2, inserted=True)


# --- the window and the fold --------------------------------------------------------------------


async def test_nothing_is_folded_until_more_than_the_window_is_recorded() -> None:
    recorder, memory, model = make_recorder()
    for number in range(1, 7):  # 12 messages: exactly the window
        recorded = await recorder.record(turn_completed(number))
        assert recorded.summaries == ()
    assert await memory.load_summary(SESSION) is None
    assert model.requests == []

    recorded = await recorder.record(turn_completed(7))

    [summary] = recorded.summaries
    assert (summary.cursor, summary.version, summary.model) == (2, 1, "summary-model")
    assert summary.text == "The user asked for parcel 1."
    assert model.requests[0].call_key == fold_key(SESSION, 1, 2)
    assert summary.updated_at == datetime(2026, 1, 1, 12, 0, 7, 123000, tzinfo=UTC)


@pytest.mark.parametrize("window", [12, 13])
async def test_the_window_is_whole_turns_and_the_cursor_sits_just_before_it(window: int) -> None:
    recorder, memory, _ = make_recorder(window_messages=window)
    for number in range(1, 11):
        await recorder.record(turn_completed(number))

    summary = await memory.load_summary(SESSION)
    assert summary is not None
    # 20 rows, a window of 12 (13 is 6 whole turns too): rows 1-8 folded, 9-20 shown.
    assert summary.cursor == 8
    assert summary.text == " ".join(f"The user asked for parcel {n}." for n in range(1, 5))


async def test_every_message_is_summarised_exactly_once_and_the_cursor_only_moves_forward() -> None:
    recorder, memory, model = make_recorder()
    cursors: list[int] = []
    for number in range(1, 61):
        recorded = await recorder.record(turn_completed(number))
        cursors += [summary.cursor for summary in recorded.summaries]
        if number % 7 == 0:
            await recorder.record(turn_completed(number - 3))  # redeliveries along the way

    folded = {f"{side}{n}" for n in range(1, 55) for side in "ua"}  # turns 55-60 are the window
    assert set(model.reads) == folded
    assert set(model.reads.values()) == {1}
    assert cursors == list(range(2, 109, 2))
    summary = await memory.load_summary(SESSION)
    assert summary is not None
    assert (summary.cursor, summary.version) == (108, 54)


async def test_the_summary_is_capped_at_a_sentence_boundary() -> None:
    long_sentence = "The user asked for parcel {n} and explained at length why it matters to them."
    recorder, memory, _ = make_recorder(model=SummaryModel(sentence=long_sentence), summary_max_tokens=60)
    for number in range(1, 30):
        await recorder.record(turn_completed(number))

    summary = await memory.load_summary(SESSION)
    assert summary is not None
    assert estimate_text_tokens(summary.text) <= 60
    assert summary.text.endswith("why it matters to them.")
    # Sediment: what was recorded first stays; the newest folds no longer fit the cap.
    assert summary.text.startswith("The user asked for parcel 1 and")
    assert summary.cursor == 2 * (29 - 6)


async def test_a_recorder_far_behind_folds_in_batches_each_with_its_own_cursor() -> None:
    memory = InMemoryMemoryStore()
    for number in range(1, 21):  # recorded by someone else, never folded
        await memory.append_history_turn(
            HistoryTurn(
                session_id=SESSION,
                turn_id=f"{SESSION}-run-{number}",
                scope=MemoryScope(principal_id="ana", agent_id="assistant"),
                user_text=said(number),
                assistant_text=answered(number),
                created_at=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )
    recorder, _, model = make_recorder(memory, fold_batch_messages=8)

    recorded = await recorder.record(turn_completed(21))

    # 42 rows, window 12: rows 1-30 leave it, in batches of 8 rows (4 turns).
    assert [summary.cursor for summary in recorded.summaries] == [8, 16, 24, 30]
    assert [summary.version for summary in recorded.summaries] == [1, 2, 3, 4]
    assert set(model.reads.values()) == {1}
    assert len(model.reads) == 30


# --- failures and races -------------------------------------------------------------------------


async def test_a_failed_fold_never_blocks_recording_and_the_next_turn_catches_up() -> None:
    recorder, memory, model = make_recorder()
    for number in range(1, 7):
        await recorder.record(turn_completed(number))
    model.failures = [ModelError("overloaded", kind="overloaded", retryable=True)]

    recorded = await recorder.record(turn_completed(7))

    assert recorded.appended is not None and recorded.appended.inserted
    assert recorded.summaries == ()
    assert "overloaded" in recorded.fold_error
    assert await memory.load_summary(SESSION) is None

    recorded = await recorder.record(turn_completed(8))

    [summary] = recorded.summaries
    assert summary.cursor == 4  # turns 1 and 2, in one fold
    assert summary.text == "The user asked for parcel 1. The user asked for parcel 2."
    # The failed call was asked about turn 1; the fold that worked took turns 1 and 2 together.
    assert [request.call_key for request in model.requests] == [
        fold_key(SESSION, 1, 2),
        fold_key(SESSION, 1, 4),
    ]


class SlowModel(SummaryModel):
    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        await asyncio.sleep(1)
        return await super().complete(request, on_text)


async def test_a_fold_past_its_timeout_is_postponed() -> None:
    recorder, memory, _ = make_recorder(model=SlowModel(), model_timeout_s=0.05)
    for number in range(1, 8):
        recorded = await recorder.record(turn_completed(number))
    assert recorded.fold_error.startswith("TimeoutError")
    assert await memory.load_summary(SESSION) is None
    assert len(await all_rows(memory)) == 14


class RacingStore(InMemoryMemoryStore):
    """Lets another recorder fold first, right before this one's save."""

    def __init__(self) -> None:
        super().__init__()
        self.rival: TranscriptRecorder | None = None
        self.conflicts = 0

    async def save_summary(self, summary: SessionSummary) -> SessionSummary:
        rival, self.rival = self.rival, None
        if rival is not None:
            await rival.fold(summary.session_id, summary.updated_at)
        try:
            return await super().save_summary(summary)
        except StoreError as error:
            self.conflicts += error.code is ErrorCode.MEMORY_CONFLICT
            raise


async def test_a_conflicting_save_reloads_and_keeps_what_the_other_copy_saved() -> None:
    memory = RacingStore()
    recorder, _, model = make_recorder(memory)
    rival, _, rival_model = make_recorder(memory)
    for number in range(1, 7):
        await recorder.record(turn_completed(number))
    memory.rival = rival

    recorded = await recorder.record(turn_completed(7))

    assert memory.conflicts == 1
    assert recorded.summaries == ()  # nothing left to fold after the reload
    assert recorded.fold_error == ""
    summary = await memory.load_summary(SESSION)
    assert summary is not None
    assert (summary.cursor, summary.version) == (2, 1)
    assert rival_model.reads == Counter({"u1": 1, "a1": 1})
    # The next turn folds only what came after the rival's cursor.
    model.reads.clear()
    await recorder.record(turn_completed(8))
    assert model.reads == Counter({"u2": 1, "a2": 1})


async def test_two_copies_racing_on_one_session_save_every_row_once() -> None:
    memory = InMemoryMemoryStore()
    first, _, first_model = make_recorder(memory)
    second, _, second_model = make_recorder(memory)
    for number in range(1, 41):
        await asyncio.gather(first.record(turn_completed(number)), second.record(turn_completed(number)))

    summary = await memory.load_summary(SESSION)
    assert summary is not None
    assert summary.cursor == 80 - 12
    assert summary.text == " ".join(f"The user asked for parcel {n}." for n in range(1, 35))
    assert len(await all_rows(memory)) == 80
    # Both copies read what left the window; the summary holds each turn once (above).
    read = set(first_model.reads) | set(second_model.reads)
    assert read == {f"{side}{n}" for n in range(1, 35) for side in "ua"}


async def test_the_scripted_model_summarises_deterministically() -> None:
    recorder, memory, _ = make_recorder(model=ScriptedModel())
    for number in range(1, 8):
        await recorder.record(turn_completed(number))
    summary = await memory.load_summary(SESSION)

    again, memory_again, _ = make_recorder(model=ScriptedModel())
    for number in range(1, 8):
        await again.record(turn_completed(number))

    assert summary is not None
    assert summary == await memory_again.load_summary(SESSION)
    assert summary.model == "scripted"
    assert "u1" in summary.text


def test_settings_keep_batches_to_whole_turns() -> None:
    assert TranscriptRecorderSettings().window_messages == 12
    assert TranscriptRecorderSettings().summary_max_tokens == 300
    with pytest.raises(ValueError, match="even"):
        TranscriptRecorderSettings(fold_batch_messages=7)
