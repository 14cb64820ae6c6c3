"""Rebuilding the derived retrieval index from the authority (ZeroClaw ADR-010: a rebuildable index).

The enricher keeps the index up to date from `memory.changes`; this module rebuilds it from the
canonical facts whenever that is not enough (the enricher was down and its dead letters were
dropped, entries were lost, the tokenizer changed). The enricher, the gateway and the CLI all
call it, so one definition of "the entry of a fact" serves everyone (`rules.build_index_entry`).

For one principal: every current fact gets its entry (an entry of the same version is replaced,
so a rebuild after a tokenizer change takes effect), and every fact id found only in the audit
trail (deleted facts) has its entry dropped. Both are idempotent and safe beside a running
enricher: the store keeps the highest version, and a deleted fact id is never used again.

"Every principal" is not something the authority can list through `MemoryStore`, so the caller
names them: `principals_from_changes` reads them off `memory.changes` (keyed by principal; every
principal that ever had a fact had a change), which is a superset of those with facts today.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.memory import Fact, IndexEntry, MemoryScope
from quipu.contracts.topics import Topic
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.ranking import build_index_entry
from quipu.services.kit.sealing import SealError, sealed_parts
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.topic_replay import TopicMissingError, read_to_end


class IndexMaintenance(Protocol):
    """The part of `MemoryStore` that maintaining the index needs: facts and entries, no history.

    The enricher holds nothing wider, so it cannot read a transcript even by mistake.
    """

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        """Current facts covered by the scope."""
        ...

    async def fact_audit(self, scope: MemoryScope) -> list[Fact]:
        """Previous versions of updated and deleted facts."""
        ...

    async def upsert_index_entry(self, entry: IndexEntry) -> None:
        """Store an entry; an older version never replaces a newer one."""
        ...

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        """Drop the principal's entries of these facts."""
        ...


class Principal(BaseModel):
    """A person whose memory is indexed: the index never crosses tenant and principal."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str = Field(default="", description="Tenant of the principal.")
    principal_id: str = Field(min_length=1, description="The person.")

    @property
    def scope(self) -> MemoryScope:
        """The scope covering every agent of the principal."""
        return MemoryScope(tenant_id=self.tenant_id, principal_id=self.principal_id)


class ReindexReport(BaseModel):
    """What a rebuild did."""

    model_config = ConfigDict(frozen=True)

    principals: int = Field(default=0, description="Principals rebuilt.")
    indexed: int = Field(default=0, description="Entries written (one per current fact).")
    dropped: int = Field(default=0, description="Entries dropped for deleted facts (ids in the audit only).")

    def __add__(self, other: ReindexReport) -> ReindexReport:
        return ReindexReport(
            principals=self.principals + other.principals,
            indexed=self.indexed + other.indexed,
            dropped=self.dropped + other.dropped,
        )


def deleted_fact_ids(current: Iterable[Fact], audit: Iterable[Fact]) -> list[str]:
    """Ids that appear in the audit trail but not among the current facts, sorted."""
    alive = {fact.fact_id for fact in current}
    return sorted({fact.fact_id for fact in audit} - alive)


async def reindex_principal(
    store: IndexMaintenance, principal: Principal, clock: Callable[[], datetime] = utc_now_ms
) -> ReindexReport:
    """Rebuild the principal's entries from its current facts; drop those of deleted facts."""
    scope = principal.scope
    facts = await store.list_facts(scope)
    audit = await store.fact_audit(scope)
    indexed_at = clock()
    for fact in facts:
        await store.upsert_index_entry(build_index_entry(fact, indexed_at))
    gone = deleted_fact_ids(facts, audit)
    if gone:
        await store.delete_index_entries(scope, gone)
    return ReindexReport(principals=1, indexed=len(facts), dropped=len(gone))


async def reindex(
    store: IndexMaintenance, principals: Iterable[Principal], clock: Callable[[], datetime] = utc_now_ms
) -> ReindexReport:
    """Rebuild every named principal, one after another (each is independent and idempotent)."""
    report = ReindexReport()
    for principal in dict.fromkeys(principals):
        report += await reindex_principal(store, principal, clock)
    return report


async def principals_from_changes(
    settings: KafkaSettings, *, tenant_id: str | None = None, within_s: float = 30.0
) -> list[Principal]:
    """Every principal named on `memory.changes`, read from the beginning up to its current end.

    Reads without a consumer group (nothing committed, nothing joined) until every partition's
    position reaches the high-watermark its last fetch reported (`kit.topic_replay`).
    Undecodable messages are skipped. `tenant_id` keeps one tenant's principals only. Sorted by
    tenant, then principal. Raises TimeoutError when the end is not reached in time.
    """
    found: dict[Principal, None] = {}

    def take(value: bytes) -> None:
        principal = _principal_of(value)
        if principal is not None and (tenant_id is None or principal.tenant_id == tenant_id):
            found[principal] = None

    try:
        await read_to_end(
            settings, Topic.MEMORY_CHANGES, take, within_s=within_s, client_id=f"{settings.client_id}-reindex"
        )
    except TopicMissingError as error:
        raise TimeoutError(str(error)) from error
    return sorted(found, key=lambda principal: (principal.tenant_id, principal.principal_id))


def _principal_of(value: bytes | None) -> Principal | None:
    # The scope is in clear on a sealed change too (contracts.sealed): no key is needed to read it.
    try:
        parts = sealed_parts(value or b"")
        change = parts[0] if parts is not None else json.loads(value or b"")
        scope = MemoryScope.model_validate(change["scope"])
    except (ValueError, KeyError, TypeError, RecursionError, SealError):
        return None
    if not scope.principal_id:
        return None
    return Principal(tenant_id=scope.tenant_id, principal_id=scope.principal_id)
