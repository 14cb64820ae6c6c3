"""The enricher on the in-memory store: what each fact change does to the derived index, and how
it fails (bounded, dead-lettered, never blocking). The same app runs on the real broker in
tests/integration/test_enricher.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import (
    Fact,
    FactChanged,
    FactChangeKind,
    FactOperation,
    FactOperationKind,
    IndexEntry,
    MemoryScope,
    Provenance,
)
from quipu.contracts.topics import Topic
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.ranking import build_index_entry
from quipu.services.domain.memory.reindex import IndexMaintenance, Principal
from quipu.services.domain.memory.retrieval_eval import ManualClock
from quipu.services.enricher.adapters import Enricher
from quipu.services.enricher.app import EnricherDeps, check_timeouts, create_app
from quipu.services.enricher.handlers import FACT_CHANGED
from quipu.services.enricher.logic import DropEntries, UpsertEntry, check_change, index_update
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.delivery import Delivery, PermanentError, RetryPolicy
from quipu.services.kit.settings import KafkaSettings
from tests.timing import scaled

ANA = MemoryScope(tenant_id="acme", principal_id="ana")
PROVENANCE = Provenance(session_id="s-1", turn_id="t-1")
FAST = EnricherSettings(retry_attempts=3, store_reply_timeout_s=0.2, retry_delay_s=0.0)


async def _no_wait(_: float) -> None:
    return None


async def entries_of(store: InMemoryMemoryStore, scope: MemoryScope = ANA) -> dict[str, IndexEntry]:
    """The principal's derived entries (the protocol has no listing; the transaction port has)."""
    entries = await store._transactions.run(
        lambda tx: tx.principal_index(scope.tenant_id, scope.principal_id)
    )
    return {entry.fact_id: entry for entry in entries}


async def write(
    store: InMemoryMemoryStore,
    kind: FactOperationKind,
    fact_id: str,
    text: str = "",
    scope: MemoryScope = ANA,
) -> FactChanged:
    operation = FactOperation(kind=kind, fact_id=fact_id, text=text, provenance=PROVENANCE)
    key = f"{kind.value}/{fact_id}/{text}"
    [change] = await store.apply_fact_operations(scope, [operation], key)
    return change


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> InMemoryMemoryStore:
    return InMemoryMemoryStore(clock=clock)


@pytest.fixture
def enricher(store: InMemoryMemoryStore, clock: ManualClock) -> Enricher:
    return Enricher(store, FAST, clock=clock, sleep=_no_wait)


# --- logic ----------------------------------------------------------------------------------------


def _change(**fields: Any) -> FactChanged:
    values: dict[str, Any] = {
        "kind": FactChangeKind.CREATED,
        "fact_id": "f-1",
        "scope": ANA,
        "version": 1,
        "text": "Prefers aisle seats on flights.",
        **fields,
    }
    return FactChanged(**values)


def test_a_created_fact_becomes_the_entry_a_reindex_would_build(clock: ManualClock) -> None:
    change = _change()
    update = index_update(change, clock())
    assert isinstance(update, UpsertEntry)
    fact = Fact(
        fact_id="f-1",
        scope=ANA,
        text=change.text,
        created_at=clock(),
        updated_at=clock(),
        provenance=PROVENANCE,
    )
    assert update.entry == build_index_entry(fact, clock())
    assert update.entry.terms == {"prefers": 1, "aisle": 1, "seats": 1, "flights": 1}
    assert update.entry.length == 4


def test_a_deleted_fact_drops_its_entry(clock: ManualClock) -> None:
    update = index_update(_change(kind=FactChangeKind.DELETED, text="", version=2), clock())
    assert update == DropEntries(scope=ANA, fact_ids=["f-1"])


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"scope": MemoryScope(tenant_id="acme", principal_id="")}, "no principal"),
        ({"fact_id": ""}, "no fact"),
        ({"version": 0}, "version 0"),
        ({"text": "   "}, "no text"),
        ({"kind": FactChangeKind.UPDATED, "text": ""}, "no text"),
        ({"text": "x" * 2001}, "longer"),
    ],
)
def test_a_malformed_change_is_permanent(fields: dict[str, Any], complaint: str) -> None:
    with pytest.raises(PermanentError, match=complaint):
        check_change(_change(**fields))


# --- applying changes -----------------------------------------------------------------------------


async def test_created_updated_deleted_keep_the_entry_in_step_with_the_fact(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Flies out of Lisbon airport.")
    await enricher.on_fact_changed(created)
    assert (await entries_of(store))["f-1"].fact_version == 1
    assert [hit.fact.fact_id for hit in await store.search_index(ANA, "Lisbon flights", 5)] == ["f-1"]

    updated = await write(store, FactOperationKind.UPDATE, "f-1", "Flies out of Porto airport.")
    await enricher.on_fact_changed(updated)
    entry = (await entries_of(store))["f-1"]
    assert entry.fact_version == 2 and "porto" in entry.terms and "lisbon" not in entry.terms
    assert await store.search_index(ANA, "Lisbon", 5) == []
    assert [hit.fact.fact_id for hit in await store.search_index(ANA, "Porto", 5)] == ["f-1"]

    deleted = await write(store, FactOperationKind.DELETE, "f-1")
    await enricher.on_fact_changed(deleted)
    assert await entries_of(store) == {}
    assert await store.search_index(ANA, "Porto", 5) == []


async def test_an_old_version_arriving_late_changes_nothing(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Drinks coffee black.")
    updated = await write(store, FactOperationKind.UPDATE, "f-1", "Drinks green tea.")
    await enricher.on_fact_changed(updated)
    await enricher.on_fact_changed(created)  # redelivered, out of order
    await enricher.on_fact_changed(updated)  # and again
    entry = (await entries_of(store))["f-1"]
    assert entry.fact_version == 2 and "tea" in entry.terms and "coffee" not in entry.terms


async def test_a_change_for_a_fact_deleted_since_resurrects_nothing(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    await write(store, FactOperationKind.DELETE, "f-1")
    await enricher.on_fact_changed(created)  # the enricher was behind: harmless, not an error
    assert await entries_of(store) == {}


async def test_a_change_for_a_forgotten_principal_resurrects_nothing(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    await store.forget_principal(ANA.tenant_id, ANA.principal_id)
    await enricher.on_fact_changed(created)
    assert await entries_of(store) == {}


async def test_a_change_naming_another_principal_is_not_indexed_for_them(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    forged = created.model_copy(update={"scope": MemoryScope(tenant_id="acme", principal_id="bruno")})
    await enricher.on_fact_changed(forged)
    bruno = MemoryScope(tenant_id="acme", principal_id="bruno")
    assert await entries_of(store, bruno) == {}
    assert await store.search_index(bruno, "Madrid", 5) == []


async def test_a_version_the_fact_never_had_is_dead_lettered(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    created = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    with pytest.raises(PermanentError, match="refused"):
        await enricher.on_fact_changed(created.model_copy(update={"version": 7}))


# --- failures: bounded, never forever ---------------------------------------------------------------


class FlakyStore:
    """An IndexMaintenance that fails (or hangs) a given number of times before working."""

    def __init__(
        self, inner: InMemoryMemoryStore, failures: int, failure: Callable[[], Awaitable[None]]
    ) -> None:
        self.inner = inner
        self.failures = failures
        self.failure = failure
        self.calls = 0

    async def _maybe_fail(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            await self.failure()

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        return await self.inner.list_facts(scope)

    async def fact_audit(self, scope: MemoryScope) -> list[Fact]:
        return await self.inner.fact_audit(scope)

    async def upsert_index_entry(self, entry: IndexEntry) -> None:
        await self._maybe_fail()
        await self.inner.upsert_index_entry(entry)

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        await self._maybe_fail()
        await self.inner.delete_index_entries(scope, fact_ids)


async def _unavailable() -> None:
    raise StoreError(ErrorCode.UNAVAILABLE, "owner away")


async def _hang() -> None:
    await asyncio.sleep(60)


async def test_a_transient_failure_is_tried_again(store: InMemoryMemoryStore, clock: ManualClock) -> None:
    flaky = FlakyStore(store, failures=2, failure=_unavailable)
    enricher = Enricher(flaky, FAST, clock=clock, sleep=_no_wait)
    await enricher.on_fact_changed(await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid."))
    assert flaky.calls == 3 and "f-1" in await entries_of(store)


@pytest.mark.parametrize("failure", [_unavailable, _hang], ids=["unavailable", "hanging"])
async def test_a_lasting_failure_is_given_up_after_the_last_try(
    store: InMemoryMemoryStore, clock: ManualClock, failure: Callable[[], Awaitable[None]]
) -> None:
    flaky = FlakyStore(store, failures=1000, failure=failure)
    enricher = Enricher(flaky, FAST, clock=clock, sleep=_no_wait)
    change = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    # A hanging try is cut at store_reply_timeout_s; were it not, three tries would hang a minute each.
    async with asyncio.timeout(scaled(10)):
        with pytest.raises(PermanentError, match="given up after 3 tries"):
            await enricher.on_fact_changed(change)
    assert flaky.calls == 3
    # The authoritative write is untouched and still retrievable from the authority.
    assert [hit.fact.fact_id for hit in await store.search_authority(ANA, "Madrid", 5)] == ["f-1"]


def test_tries_must_fit_the_poll_interval() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9", max_poll_interval_ms=10_000)
    with pytest.raises(ValueError, match="max_poll_interval_ms"):
        check_timeouts(kafka, EnricherSettings(retry_attempts=5, store_reply_timeout_s=5.0))
    check_timeouts(kafka, EnricherSettings(retry_attempts=2, store_reply_timeout_s=1.0))


# --- delivery: the dead-letter topic, and the consumer keeps going ------------------------------------


class Consumed:
    """A consumed message as Delivery sees it."""

    def __init__(self, body: bytes, offset: int) -> None:
        self.body = body
        self.headers: dict[str, Any] = {}
        self.raw_message = type("Record", (), {"topic": "memory.changes", "partition": 0, "offset": offset})()
        self.acked = False
        self.nacked = False

    async def ack(self) -> None:
        self.acked = True

    async def nack(self) -> None:
        self.nacked = True


async def test_malformed_changes_are_dead_lettered_and_the_next_ones_applied(
    store: InMemoryMemoryStore, enricher: Enricher
) -> None:
    dead: list[tuple[bytes, str, dict[str, str]]] = []

    async def dead_letter(body: bytes, *, topic: str, key: bytes | None, headers: dict[str, str]) -> None:
        dead.append((body, topic, headers))

    delivery = Delivery(dead_letter, RetryPolicy(attempts=1))
    good = await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid.")
    bodies = [
        b"not json",
        json.dumps(
            {"kind": "exploded", "fact_id": "f-1", "scope": {"principal_id": "ana"}, "version": 1}
        ).encode(),
        _change(scope=MemoryScope(principal_id=""), fact_id="f-2").model_dump_json().encode(),
        good.model_dump_json().encode(),
    ]
    messages = [Consumed(body, offset) for offset, body in enumerate(bodies)]
    for message in messages:
        await delivery.handle(message, FACT_CHANGED, enricher.on_fact_changed)
    assert all(message.acked and not message.nacked for message in messages)
    assert [(body, topic) for body, topic, _ in dead] == [
        (body, Topic.MEMORY_CHANGES.dlq) for body in bodies[:3]
    ]
    assert [headers["x-dlq-reason"] for _, _, headers in dead] == [
        "invalid_payload",
        "invalid_payload",
        "permanent_error",
    ]
    assert "f-1" in await entries_of(store)


# --- what the enricher can see ----------------------------------------------------------------------


class Recording:
    """Any attribute access is recorded; calls go to the in-memory store."""

    def __init__(self, inner: InMemoryMemoryStore) -> None:
        self._inner = inner
        self.used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.used.add(name)
        return getattr(self._inner, name)


async def test_the_enricher_reads_fact_texts_only_never_history(
    store: InMemoryMemoryStore, clock: ManualClock
) -> None:
    recording = Recording(store)
    port: IndexMaintenance = recording
    enricher = Enricher(port, FAST, clock=clock, sleep=_no_wait)
    await enricher.on_fact_changed(await write(store, FactOperationKind.NEW, "f-1", "Lives in Madrid."))
    await enricher.on_fact_changed(await write(store, FactOperationKind.DELETE, "f-1"))
    await enricher.reindex([Principal(tenant_id="acme", principal_id="ana")])
    assert recording.used == {"upsert_index_entry", "delete_index_entries", "list_facts", "fact_audit"}


def test_the_enricher_subscribes_to_memory_changes_only() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9", flavour="tansu", topic_prefix="t.")
    app = create_app(kafka, deps=EnricherDeps(store=InMemoryMemoryStore()))
    assert app.broker is not None
    topics = {
        str(getattr(name, "name", name))
        for subscriber in app.broker.subscribers
        for name in getattr(subscriber, "topics", ())
    }
    assert topics == {"t." + Topic.MEMORY_CHANGES.value}
