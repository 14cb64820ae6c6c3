"""Transcript replay from run records (STORE_CONTRACT §10): order, paging, fatal errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.store import Page, Record
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_APPENDED,
    TRANSCRIPT_MESSAGES_SEEDED,
    Message,
    TextPart,
    TranscriptError,
    encode_messages,
)
from quipu.services.domain.transcript import (
    PAGE_LIMIT,
    build_messages_from_run_log,
    replay_run_log_events,
)

RUN = "run-1"


def say(role: str, text: str) -> Message:
    return Message(role=role, parts=(TextPart(text=text),))


def record(key: str, type_: str, payload: bytes, run_id: str = RUN) -> Record:
    return Record(
        event_key=key,
        run_id=run_id,
        agent_id="agent",
        type=type_,
        payload=payload,
        timestamp=datetime(2025, 1, 1, tzinfo=UTC),
    )


def transcript(key: str, type_: str, *messages: Message) -> Record:
    return record(key, type_, encode_messages(list(messages)))


def other(key: str) -> Record:
    return record(key, "run_phase_changed", b'{"phase":"planning"}')


class PagedRunLog:
    """A fake store with only ListRunRecords: integer cursors, `next_cursor=""` at the end."""

    def __init__(self, records: list[Record], *, cap: int = 500) -> None:
        self.records = records
        self.cap = cap
        self.calls: list[tuple[str, str, int]] = []

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        self.calls.append((run_id, cursor, limit))
        if not any(r.run_id == run_id for r in self.records):
            raise StoreError(ErrorCode.RUN_NOT_FOUND, run_id)
        start = int(cursor) if cursor else 0
        end = start + min(limit, self.cap)
        page = self.records[start:end]
        return Page(records=page, next_cursor=str(end) if end < len(self.records) else "")


# --- replay over loaded records -----------------------------------------------------------------


def test_replay_concatenates_seeded_then_appended_in_stored_order() -> None:
    records = [
        other("phase-1"),
        transcript("seed", TRANSCRIPT_MESSAGES_SEEDED, say("user", "earlier"), say("assistant", "ok")),
        transcript("turn-1", TRANSCRIPT_MESSAGES_APPENDED, say("user", "now")),
        other("phase-2"),
        transcript("turn-2", TRANSCRIPT_MESSAGES_APPENDED, say("assistant", "done")),
    ]
    assert replay_run_log_events(records) == [
        say("user", "earlier"),
        say("assistant", "ok"),
        say("user", "now"),
        say("assistant", "done"),
    ]


def test_replay_keeps_stored_order_even_when_a_seed_comes_late() -> None:
    # Replay never reorders: records are read as stored, whatever their type.
    records = [
        transcript("a", TRANSCRIPT_MESSAGES_APPENDED, say("user", "1")),
        transcript("s", TRANSCRIPT_MESSAGES_SEEDED, say("user", "2")),
    ]
    assert [m.parts[0] for m in replay_run_log_events(records)] == [
        TextPart(text="1"),
        TextPart(text="2"),
    ]


def test_replay_accepts_an_empty_transcript_record() -> None:
    assert replay_run_log_events([transcript("empty", TRANSCRIPT_MESSAGES_SEEDED)]) == []


def test_replay_without_transcript_record_is_fatal_and_names_the_run() -> None:
    with pytest.raises(TranscriptError, match=r"'run-1'.*no transcript record"):
        replay_run_log_events([other("phase-1"), other("phase-2")])


def test_replay_of_nothing_is_fatal() -> None:
    with pytest.raises(TranscriptError, match="no transcript record"):
        replay_run_log_events([])


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b'[{"role":"user","parts":[{"kind":"video"}]}]',
        b'{"role":"user","parts":[]}',
        b'[{"role":"user","parts":[]}] trailing',
    ],
)
def test_replay_decode_error_is_fatal_and_names_run_and_event_key(payload: bytes) -> None:
    records = [
        transcript("good", TRANSCRIPT_MESSAGES_SEEDED, say("user", "hi")),
        record("bad-key-7", TRANSCRIPT_MESSAGES_APPENDED, payload),
    ]
    with pytest.raises(TranscriptError) as raised:
        replay_run_log_events(records)
    assert "'run-1'" in str(raised.value)
    assert "'bad-key-7'" in str(raised.value)


def test_replay_ignores_other_records_even_when_their_payload_is_not_a_transcript() -> None:
    records = [
        record("x", "assistant_turn", b"opaque, not parsed"),
        transcript("t", TRANSCRIPT_MESSAGES_APPENDED, say("user", "hi")),
    ]
    assert replay_run_log_events(records) == [say("user", "hi")]


# --- building from a store ----------------------------------------------------------------------


async def test_build_pages_past_500_records_in_order() -> None:
    records = [other(f"filler-{n}") for n in range(1200)]
    # Transcript records on both sides of each page boundary and at the very ends.
    for position, text in [(0, "first"), (499, "end-1"), (500, "start-2"), (1001, "page-3")]:
        records[position] = transcript(f"t{position}", TRANSCRIPT_MESSAGES_APPENDED, say("user", text))
    records.append(transcript("last", TRANSCRIPT_MESSAGES_APPENDED, say("assistant", "last")))
    store = PagedRunLog(records)

    messages = await build_messages_from_run_log(store, RUN)

    assert [m.parts[0] for m in messages] == [
        TextPart(text=t) for t in ["first", "end-1", "start-2", "page-3", "last"]
    ]
    assert store.calls == [(RUN, "", 500), (RUN, "500", 500), (RUN, "1000", 500)]
    assert PAGE_LIMIT == 500


async def test_build_follows_a_store_that_returns_smaller_pages() -> None:
    records = [transcript(f"t{n}", TRANSCRIPT_MESSAGES_APPENDED, say("user", str(n))) for n in range(7)]
    store = PagedRunLog(records, cap=3)
    messages = await build_messages_from_run_log(store, RUN)
    assert [m.parts[0] for m in messages] == [TextPart(text=str(n)) for n in range(7)]
    assert len(store.calls) == 3


async def test_build_without_transcript_record_is_fatal() -> None:
    store = PagedRunLog([other(f"p{n}") for n in range(600)])
    with pytest.raises(TranscriptError, match=r"'run-1'.*no transcript record"):
        await build_messages_from_run_log(store, RUN)


async def test_build_decode_error_on_a_later_page_names_run_and_event_key() -> None:
    records = [other(f"p{n}") for n in range(700)]
    records[650] = record("broken-650", TRANSCRIPT_MESSAGES_SEEDED, b'[{"role":"user"}]')
    records[10] = transcript("ok", TRANSCRIPT_MESSAGES_SEEDED, say("user", "hi"))
    with pytest.raises(TranscriptError, match=r"'run-1'.*'broken-650'"):
        await build_messages_from_run_log(PagedRunLog(records), RUN)


async def test_build_lets_store_errors_through() -> None:
    with pytest.raises(StoreError) as raised:
        await build_messages_from_run_log(PagedRunLog([]), RUN)
    assert raised.value.code is ErrorCode.RUN_NOT_FOUND


async def test_build_refuses_a_record_of_another_run() -> None:
    records = [
        transcript("t", TRANSCRIPT_MESSAGES_SEEDED, say("user", "hi")),
        record("foreign", TRANSCRIPT_MESSAGES_APPENDED, b"[]", run_id="run-2"),
    ]
    with pytest.raises(TranscriptError, match="'foreign'"):
        await build_messages_from_run_log(PagedRunLog(records), RUN)


class StuckRunLog:
    """A broken store whose cursor never moves."""

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        return Page(
            records=[transcript("t", TRANSCRIPT_MESSAGES_SEEDED, say("user", "hi"))],
            next_cursor="same",
        )


async def test_build_stops_when_the_listing_makes_no_progress() -> None:
    with pytest.raises(TranscriptError, match="no progress"):
        await build_messages_from_run_log(StuckRunLog(), RUN)
