"""Listings, pages and cursors (§6.8; §12 "Pages and cursors: limits, cap, INVALID_CURSOR, session
commit order"), and ListRunsBySession."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import Page, RunMeta, RunStart, RunStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    all_run_records,
    all_session_records,
    child_start,
    keys,
    ms,
    open_session,
    ordinary,
    proceed,
    refused,
    resending,
    root_start,
    running_one_shot,
    running_root,
    session_with_root,
    suspend,
    terminal,
    uid,
)

MAX_LIMIT = 500
STEP_RECORDS = 100  # the most records one AppendRunRecords takes (§6.4)

Lister = Callable[[Store, str, str, int], Awaitable[Page]]


def _list_run(store: Store, run_id: str, cursor: str, limit: int) -> Awaitable[Page]:
    return store.list_run_records(run_id, cursor, limit)


def _list_session(store: Store, session_id: str, cursor: str, limit: int) -> Awaitable[Page]:
    return store.list_session_run_records(session_id, cursor, limit)


async def _run_with_records(store: Store, count: int) -> tuple[str, RunStart]:
    """A session whose only run has `count` records (run_started included)."""
    session_id, run = await session_with_root(store)
    for index in range(count - 1):
        await store.append_run_record(ordinary(run, f"event-{index:04d}"))
    return session_id, run


async def _append_many(store: Store, run: RunStart, count: int) -> None:
    """Append `count` ordinary records, as full steps: one command for every `STEP_RECORDS` of them
    (one per record cost the Kafka store a round trip through the owner each)."""
    for start in range(0, count, STEP_RECORDS):
        end = min(start + STEP_RECORDS, count)
        step = [ordinary(run, f"bulk-{index:04d}") for index in range(start, end)]
        await resending(partial(store.append_run_records, step))


LISTINGS = ["run", "session"]


def _listing(which: str, session_id: str, run: RunStart) -> tuple[Lister, str]:
    return (_list_run, run.run_id) if which == "run" else (_list_session, session_id)


# --- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1], ids=["zero", "negative"])
@pytest.mark.parametrize("which", LISTINGS)
async def test_limit_below_one_is_invalid_argument(store: Store, which: str, limit: int) -> None:
    session_id, run = await _run_with_records(store, 2)
    lister, scope = _listing(which, session_id, run)
    await refused(ErrorCode.INVALID_ARGUMENT, lister(store, scope, "", limit))


async def test_limit_above_500_is_capped(store: Store) -> None:
    session_id, run = await session_with_root(store)
    await _append_many(store, run, 502)  # 503 records with run_started
    for lister, scope in ((_list_run, run.run_id), (_list_session, session_id)):
        for limit in (501, 10_000):
            first = await lister(store, scope, "", limit)
            assert len(first.records) == MAX_LIMIT
            assert first.next_cursor != ""
            rest = await lister(store, scope, first.next_cursor, limit)
            assert len(rest.records) == 3
            assert rest.next_cursor == ""
            everything = first.records + rest.records
            assert len({(r.run_id, r.event_key) for r in everything}) == 503


@pytest.mark.parametrize("which", LISTINGS)
async def test_next_cursor_is_empty_when_nothing_followed(store: Store, which: str) -> None:
    session_id, run = await _run_with_records(store, 5)
    lister, scope = _listing(which, session_id, run)
    assert (await lister(store, scope, "", 10)).next_cursor == ""
    # A page that exactly reaches the end: nothing followed it (§3), so no cursor either.
    exact = await lister(store, scope, "", 5)
    assert len(exact.records) == 5
    assert exact.next_cursor == ""
    partial = await lister(store, scope, "", 4)
    assert partial.next_cursor != ""
    last = await lister(store, scope, partial.next_cursor, 4)
    assert len(last.records) == 1
    assert last.next_cursor == ""


@pytest.mark.parametrize("which", LISTINGS)
async def test_paging_walks_every_record_once_in_order(store: Store, which: str) -> None:
    session_id, run = await _run_with_records(store, 9)
    lister, scope = _listing(which, session_id, run)
    whole = (await lister(store, scope, "", 100)).records
    walked = []
    cursor = ""
    while True:
        page = await lister(store, scope, cursor, 2)
        assert 1 <= len(page.records) <= 2
        walked.extend(page.records)
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    assert walked == whole
    assert [r.event_key for r in whole] == ["started", *[f"event-{i:04d}" for i in range(8)]]
    assert [r.id for r in whole] == [str(i) for i in range(1, 10)]


@pytest.mark.parametrize("which", LISTINGS)
async def test_later_appends_never_change_an_earlier_page(store: Store, which: str) -> None:
    session_id, run = await _run_with_records(store, 3)
    lister, scope = _listing(which, session_id, run)
    first = await lister(store, scope, "", 2)
    for index in range(3):
        await store.append_run_record(ordinary(run, f"later-{index}"))
    again = await lister(store, scope, "", 2)
    assert again.records == first.records
    following = await lister(store, scope, first.next_cursor, 10)
    assert [r.event_key for r in following.records] == ["event-0001", "later-0", "later-1", "later-2"]


async def test_a_cursor_is_not_bound_to_its_page_size(store: Store) -> None:
    # Reading: "bound to one listing" means one run or session, not one limit.
    _, run = await _run_with_records(store, 7)
    first = await store.list_run_records(run.run_id, "", 2)
    second = await store.list_run_records(run.run_id, first.next_cursor, 3)
    assert [r.id for r in second.records] == ["3", "4", "5"]


# --- INVALID_CURSOR -------------------------------------------------------------------------------

MALFORMED = ["garbage", "!!!", "0", "1", "2", "-1", "null", "{}", " ", "="]


@pytest.mark.parametrize("cursor", MALFORMED)
@pytest.mark.parametrize("which", LISTINGS)
async def test_malformed_cursor_is_invalid_cursor(store: Store, which: str, cursor: str) -> None:
    session_id, run = await _run_with_records(store, 4)
    lister, scope = _listing(which, session_id, run)
    await refused(ErrorCode.INVALID_CURSOR, lister(store, scope, cursor, 2))


def _other_char(char: str) -> str:
    if char.isdigit():
        return str((int(char) + 1) % 10)
    if char.isalpha():
        alphabet = "abcdefghijklmnopqrstuvwxyz"
        index = alphabet.index(char.lower())
        swapped = alphabet[(index + 1) % 26]
        return swapped.upper() if char.isupper() else swapped
    return "A"


def _alter_at(cursor: str, position: int) -> str:
    return cursor[:position] + _other_char(cursor[position]) + cursor[position + 1 :]


ALTERATIONS: dict[str, Callable[[str], str]] = {
    "first_char": lambda c: _alter_at(c, 0),
    "middle_char": lambda c: _alter_at(c, len(c) // 2),
    "second_quarter_char": lambda c: _alter_at(c, len(c) // 4),
    "truncated": lambda c: c[: len(c) // 2],
    "doubled": lambda c: c + c,
}


@pytest.mark.parametrize("alteration", list(ALTERATIONS), ids=list(ALTERATIONS))
@pytest.mark.parametrize("which", LISTINGS)
async def test_altered_cursor_is_invalid_cursor(store: Store, which: str, alteration: str) -> None:
    session_id, run = await _run_with_records(store, 6)
    lister, scope = _listing(which, session_id, run)
    cursor = (await lister(store, scope, "", 2)).next_cursor
    altered = ALTERATIONS[alteration](cursor)
    assert altered != cursor
    await refused(ErrorCode.INVALID_CURSOR, lister(store, scope, altered, 2))


async def test_foreign_cursors_are_invalid_cursor(store: Store) -> None:
    session_id, run = await _run_with_records(store, 4)
    other_run = await running_root(store, session_id)
    for index in range(3):
        await store.append_run_record(ordinary(other_run, f"other-{index}"))
    other_session, third_run = await _run_with_records(store, 4)

    run_cursor = (await store.list_run_records(run.run_id, "", 1)).next_cursor
    session_cursor = (await store.list_session_run_records(session_id, "", 1)).next_cursor
    assert run_cursor and session_cursor

    # A run cursor for another run, or for a session listing.
    await refused(ErrorCode.INVALID_CURSOR, store.list_run_records(other_run.run_id, run_cursor, 1))
    await refused(ErrorCode.INVALID_CURSOR, store.list_run_records(third_run.run_id, run_cursor, 1))
    await refused(ErrorCode.INVALID_CURSOR, store.list_session_run_records(session_id, run_cursor, 1))
    # A session cursor for another session, or for a run listing.
    await refused(ErrorCode.INVALID_CURSOR, store.list_session_run_records(other_session, session_cursor, 1))
    await refused(ErrorCode.INVALID_CURSOR, store.list_run_records(run.run_id, session_cursor, 1))
    # The genuine cursors still work where they belong.
    assert (await store.list_run_records(run.run_id, run_cursor, 1)).records[0].id == "2"
    assert len((await store.list_session_run_records(session_id, session_cursor, 1)).records) == 1


# --- listing scope and order ----------------------------------------------------------------------


async def test_listings_of_missing_scopes(store: Store) -> None:
    await refused(ErrorCode.RUN_NOT_FOUND, store.list_run_records(uid("ghost"), "", 10))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.list_session_run_records(uid("ghost"), "", 10))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.list_runs_by_session(uid("ghost"), []))


async def test_empty_session_lists_nothing(store: Store) -> None:
    session_id = await open_session(store)
    page = await store.list_session_run_records(session_id, "", 10)
    assert page.records == []
    assert page.next_cursor == ""
    assert await store.list_runs_by_session(session_id, []) == []


async def test_session_listing_follows_commit_order_across_runs(store: Store) -> None:
    session_id = await open_session(store)
    other_session = await open_session(store)
    first = await running_root(store, session_id)
    second = await running_root(store, session_id)
    await store.append_run_record(ordinary(second, "b-1"))
    await store.append_run_record(ordinary(first, "a-1"))
    child = await proceed(store, child_start(session_id, second))
    await store.append_run_record(ordinary(first, "a-2"))
    await store.append_run_record(ordinary(child, "c-1"))
    await store.append_run_record(ordinary(second, "b-2"))
    # Noise that must not show up: another session, a sessionless run.
    stranger = await running_root(store, other_session)
    await store.append_run_record(ordinary(stranger, "x-1"))
    sessionless = await running_one_shot(store)
    await store.append_run_record(ordinary(sessionless, "y-1"))
    await store.record_run_terminal(terminal(second))

    assert keys(await all_session_records(store, session_id, limit=3)) == [
        (first.run_id, "started"),
        (second.run_id, "started"),
        (second.run_id, "b-1"),
        (first.run_id, "a-1"),
        (second.run_id, f"link:{child.run_id}"),
        (child.run_id, "started"),
        (first.run_id, "a-2"),
        (child.run_id, "c-1"),
        (second.run_id, "b-2"),
        (second.run_id, "terminal"),
    ]
    # Per-run listings keep per-run order and ids.
    assert [r.event_key for r in await all_run_records(store, second.run_id)] == [
        "started",
        "b-1",
        f"link:{child.run_id}",
        "b-2",
        "terminal",
    ]


async def test_list_runs_by_session_in_start_order_with_status_filter(store: Store) -> None:
    session_id = await open_session(store)
    other_session = await open_session(store)
    # Reading: "start order" is the order in which starts were accepted; started_at values are
    # deliberately out of order so a store sorting by started_at is caught.
    suspended = await running_root(store, session_id, started_at=ms(300))
    completed = await running_root(store, session_id, started_at=ms(100))
    running = await running_root(store, session_id, started_at=ms(200))
    child = await proceed(store, child_start(session_id, running, started_at=ms(50)))
    await suspend(store, suspended)
    successor = await proceed(
        store,
        root_start(session_id, predecessor_run_id=suspended.run_id, started_at=ms(10)),
    )
    await store.record_run_terminal(terminal(completed))
    await running_root(store, other_session)
    await running_one_shot(store)

    def ids(metas: list[RunMeta]) -> list[str]:
        return [meta.run_id for meta in metas]

    everything = [suspended.run_id, completed.run_id, running.run_id, child.run_id, successor.run_id]
    assert ids(await store.list_runs_by_session(session_id, [])) == everything
    assert ids(await store.list_runs_by_session(session_id, [RunStatus.RUNNING])) == [
        running.run_id,
        child.run_id,
        successor.run_id,
    ]
    assert ids(await store.list_runs_by_session(session_id, [RunStatus.COMPLETED, RunStatus.SUSPENDED])) == [
        suspended.run_id,
        completed.run_id,
    ]
    assert await store.list_runs_by_session(session_id, [RunStatus.FAILED]) == []
    metas = await store.list_runs_by_session(session_id, [RunStatus.SUSPENDED])
    assert metas == [await store.load_run(suspended.run_id)]
