"""The recorder's domain logic: a finished turn in, two history rows and a summary fold out.

`TranscriptRecorder.record(turn)`:

1. Records the turn as two rows through `MemoryStore.append_history_turn`: what the user said
   and what the agent answered, word for word. No tool calls, raw tool payloads or reasoning
   ever reach it (a `TurnCompleted` carries none). The turn id is the run id, so a redelivered
   `TurnCompleted` writes nothing new. Agents that opt out of memory are recorded too: the
   session history is continuity, not cross-session memory. A turn whose principal was
   forgotten after it was said is refused by the store (`PRINCIPAL_FORGOTTEN`) and settled:
   nothing is kept, nothing is dead-lettered.
2. Folds what fell out of the literal window into the session summary, exactly once: the rows
   after the summary's cursor and before the window (whole turns), in batches; each batch is
   `summarize(summary so far + batch)` through the model port, capped, and saved with the
   cursor on the batch's last row, version + 1, in one conditional write. MEMORY_CONFLICT
   means another copy saved first: reload and recompute from what it saved, so a row is folded
   once and never again, and the cursor only moves forward.

A fold that cannot finish (the model fails, times out, refuses, or other copies keep winning)
never undoes or blocks the recording: the rows stay after the cursor and the next turn's fold
takes them (the context source shows them word for word meanwhile).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from quipu.contracts.errors import ErrorCode, StoreRefusedError
from quipu.contracts.memory import HistoryAppendResult, HistoryTurn, MemoryScope, SessionSummary
from quipu.contracts.runs import TurnCompleted
from quipu.contracts.wire import to_millisecond
from quipu.services.domain.memory.context import history_principal
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.summary import (
    DEFAULT_WINDOW_MESSAGES,
    Summarizer,
    SummaryError,
    rows_to_fold,
    utterances,
    window_start,
)
from quipu.services.domain.models.port import ModelError
from quipu.services.kit.delivery import PermanentError
from quipu.services.kit.logging import get_logger

logger = get_logger(__name__)


def history_scope(turn: TurnCompleted) -> MemoryScope:
    """Whose history the turn is: the tenant, the principal (or the session's own anonymous one,
    `session:<id>`) and the agent."""
    return MemoryScope(
        tenant_id=turn.tenant_id,
        principal_id=history_principal(turn.principal_id, turn.session_id),
        agent_id=turn.agent_id,
    )


def history_turn(turn: TurnCompleted) -> HistoryTurn:
    """The two rows of a finished turn, keyed by its run id."""
    return HistoryTurn(
        session_id=turn.session_id,
        turn_id=turn.run_id,
        scope=history_scope(turn),
        user_text=turn.user_text,
        assistant_text=turn.assistant_text,
        created_at=to_millisecond(turn.occurred_at),
    )


def fold_key(session_id: str, first_seq: int, last_seq: int) -> str:
    """The summarizer call's key: the same rows always make the same call."""
    return f"summary/{session_id}/{first_seq}-{last_seq}"


@dataclass(frozen=True)
class Recorded:
    """What recording one turn did."""

    appended: HistoryAppendResult | None
    """The turn's rows; None when the turn's principal was forgotten meanwhile (nothing written)."""
    summaries: tuple[SessionSummary, ...] = ()
    """Summaries this call saved, in order (none when nothing left the window, or another copy folded)."""
    fold_error: str = ""
    """Why the fold stopped early (the rows wait for the next turn's fold); empty when it finished."""


class TranscriptRecorder:
    """Records finished turns and keeps the session summary behind the literal window."""

    def __init__(
        self,
        memory: MemoryStore,
        summarizer: Summarizer,
        *,
        window_messages: int = DEFAULT_WINDOW_MESSAGES,
        fold_batch_messages: int = 40,
        fold_attempts: int = 5,
        model_timeout_s: float = 60.0,
    ) -> None:
        self.memory = memory
        self.summarizer = summarizer
        self.window_messages = window_messages
        self.fold_batch_messages = max(2, fold_batch_messages - fold_batch_messages % 2)
        self.fold_attempts = fold_attempts
        self.model_timeout_s = model_timeout_s

    async def record(self, turn: TurnCompleted) -> Recorded:
        """Record the turn (idempotent on its run id), then fold what left the window."""
        if not turn.session_id:
            raise PermanentError(f"turn {turn.run_id!r} has no session: there is no history to keep")
        try:
            appended = await self.memory.append_history_turn(history_turn(turn))
        except StoreRefusedError as error:
            if error.code is ErrorCode.PRINCIPAL_FORGOTTEN:
                # Forget erased this turn, or came after it was said: keeping nothing is the effect.
                logger.info("turn not recorded: its principal was forgotten", run_id=turn.run_id)
                return Recorded(appended=None)
            raise PermanentError(f"turn {turn.run_id!r}: {error.code.value}: {error.message}") from error
        summaries, fold_error = await self.fold(turn.session_id, to_millisecond(turn.occurred_at))
        logger.info(
            "turn recorded",
            session_id=turn.session_id,
            run_id=turn.run_id,
            inserted=appended.inserted,
            first_seq=appended.first_seq,
            folds=len(summaries),
            cursor=summaries[-1].cursor if summaries else None,
        )
        return Recorded(appended=appended, summaries=tuple(summaries), fold_error=fold_error)

    async def fold(self, session_id: str, at: datetime) -> tuple[list[SessionSummary], str]:
        """Fold every row between the cursor and the window, batch by batch; `at` stamps the saves.

        Returns the summaries saved and, when it stopped early, why.
        """
        saved: list[SessionSummary] = []
        conflicts = 0
        while True:
            shown = await self.memory.load_session_memory(session_id, self.window_messages)
            summary = shown.summary
            cursor = summary.cursor if summary is not None else 0
            start = window_start(shown.tail)
            if start - 1 <= cursor:
                return saved, ""
            limit = min(self.fold_batch_messages, start - 1 - cursor)
            rows = rows_to_fold(await self.memory.list_history(session_id, cursor, limit), cursor, start)
            if not rows:
                return saved, f"no whole turn after the cursor {cursor}"
            existing = summary.text if summary is not None else ""
            key = fold_key(session_id, rows[0].seq, rows[-1].seq)
            try:
                written = await asyncio.wait_for(
                    self.summarizer.summarize(existing, utterances(rows), key), self.model_timeout_s
                )
            except (ModelError, SummaryError, TimeoutError) as error:
                reason = f"{type(error).__name__}: {error}"
                logger.warning("summary fold postponed", session_id=session_id, key=key, reason=reason)
                return saved, reason
            candidate = SessionSummary(
                session_id=session_id,
                text=written.text,
                cursor=rows[-1].seq,
                version=summary.version + 1 if summary is not None else 1,
                model=written.model,
                updated_at=at,
            )
            try:
                saved.append(await self.memory.save_summary(candidate))
            except StoreRefusedError as error:
                if error.code is not ErrorCode.MEMORY_CONFLICT:
                    logger.warning("summary not saved", session_id=session_id, error=str(error))
                    return saved, f"{error.code.value}: {error.message}"
                conflicts += 1
                logger.info("summary saved by another copy; reloading", session_id=session_id, key=key)
                if conflicts >= self.fold_attempts:
                    return saved, f"gave up after {conflicts} conflicting saves"
