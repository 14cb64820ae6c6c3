"""Sessions (§6.2, §12 "Sessions"): create/end idempotency, SESSION_ENDED, LoadSessionStatus."""

from __future__ import annotations

import unicodedata

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import SessionOwner, SessionStatus
from quipu.services.domain.store.protocol import Store
from tests.conformance.builders import (
    ms,
    open_session,
    ordinary,
    refused,
    session_with_root,
    sub_ms,
    uid,
)


async def test_create_session_inserts_an_active_session(store: Store) -> None:
    session_id = uid("session")
    created = await store.create_session(session_id, ms(7))
    assert created.session_id == session_id
    assert created.status is SessionStatus.ACTIVE
    assert created.created_at == ms(7)
    assert created.ended_at is None
    assert await store.load_session_status(session_id) == created


async def test_create_session_again_returns_the_stored_session_unchanged(store: Store) -> None:
    session_id = uid("session")
    first = await store.create_session(session_id, ms(7))
    again = await store.create_session(session_id, ms(9000))
    assert again == first
    assert again.created_at == ms(7)
    assert (await store.load_session_status(session_id)).created_at == ms(7)


async def test_a_session_keeps_the_owner_of_its_first_creation(store: Store) -> None:
    session_id = uid("session")
    ana = SessionOwner(tenant_id="t1", principal_id="ana")
    created = await store.create_session(session_id, ms(7), ana)
    assert created.owner == ana
    again = await store.create_session(session_id, ms(8), SessionOwner(tenant_id="t2", principal_id="bo"))
    assert again.owner == ana
    ended = await store.end_session(session_id, ms(9))
    assert ended.owner == ana
    assert (await store.load_session_status(session_id)).owner == ana


async def test_a_session_created_without_an_owner_has_none(store: Store) -> None:
    session_id = uid("session")
    assert (await store.create_session(session_id, ms(7))).owner is None
    assert (await store.load_session_status(session_id)).owner is None


async def test_end_session_ends_it_once_and_keeps_the_first_ended_at(store: Store) -> None:
    session_id = await open_session(store)
    ended = await store.end_session(session_id, ms(50))
    assert ended.status is SessionStatus.ENDED
    assert ended.ended_at == ms(50)
    assert ended.created_at == ms(0)
    again = await store.end_session(session_id, ms(99))
    assert again == ended
    loaded = await store.load_session_status(session_id)
    assert loaded.status is SessionStatus.ENDED
    assert loaded.ended_at == ms(50)


async def test_create_session_on_an_ended_session_is_session_ended(store: Store) -> None:
    session_id = await open_session(store)
    await store.end_session(session_id, ms(5))
    await refused(ErrorCode.SESSION_ENDED, store.create_session(session_id, ms(0)))
    assert (await store.load_session_status(session_id)).status is SessionStatus.ENDED


async def test_end_session_of_a_missing_session_is_session_not_found(store: Store) -> None:
    session_id = uid("missing")
    await refused(ErrorCode.SESSION_NOT_FOUND, store.end_session(session_id, ms(1)))
    # ...and it did not create the session as a side effect.
    await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status(session_id))


async def test_load_session_status_of_a_missing_session_is_session_not_found(store: Store) -> None:
    await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status(uid("missing")))


async def test_create_session_with_an_empty_id_is_invalid(store: Store) -> None:
    await refused(ErrorCode.INVALID_ARGUMENT, store.create_session("", ms(0)))


async def test_session_timestamps_with_sub_millisecond_parts_are_invalid(store: Store) -> None:
    session_id = uid("session")
    await refused(ErrorCode.INVALID_ARGUMENT, store.create_session(session_id, sub_ms(0)))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status(session_id))
    await store.create_session(session_id, ms(0))
    await refused(ErrorCode.INVALID_ARGUMENT, store.end_session(session_id, sub_ms(3, 999)))
    assert (await store.load_session_status(session_id)).status is SessionStatus.ACTIVE


async def test_session_ids_are_compared_byte_for_byte(store: Store) -> None:
    # §2: identifiers are case-sensitive and never normalised (NFC "é" ≠ NFD "e + ◌́").
    base = uid("Sesión")
    nfc = unicodedata.normalize("NFC", base)
    nfd = unicodedata.normalize("NFD", base)
    assert nfc != nfd
    await store.create_session(nfc, ms(0))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status(nfd))
    await refused(ErrorCode.SESSION_NOT_FOUND, store.load_session_status(nfc.upper()))
    await store.end_session(nfc, ms(1))
    # A differently-cased id is another session: still creatable.
    other = await store.create_session(nfc.lower(), ms(2))
    assert other.status is SessionStatus.ACTIVE


async def test_ending_a_session_lets_running_runs_write_and_reports_ended(store: Store) -> None:
    session_id, run = await session_with_root(store)
    before = await store.append_run_record(ordinary(run, "before-end"))
    assert before.session_status == SessionStatus.ACTIVE.value
    await store.end_session(session_id, ms(10))
    after = await store.append_run_record(ordinary(run, "after-end"))
    assert after.inserted is True
    assert after.session_status == SessionStatus.ENDED.value
