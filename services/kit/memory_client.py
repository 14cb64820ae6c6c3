"""The `MemoryStore` as every service but the owner sees it: memory commands over Kafka.

It rides on `KafkaStore.call` (the same request/reply transport, retries and UNAVAILABLE), so a
service that already holds a runtime store client shares it: `KafkaMemoryStore(store_client)`.
`KafkaMemoryStore.connect(settings)` builds and owns a transport of its own instead.
"""

from __future__ import annotations

from typing import Any

from quipu.contracts.memory import (
    Fact,
    FactChanged,
    FactOperation,
    HistoryAppendResult,
    HistoryMessage,
    HistoryTurn,
    IndexEntry,
    MemoryScope,
    PrincipalExport,
    Profile,
    ScoredFact,
    SessionMemory,
    SessionSummary,
)
from quipu.contracts.memory_commands import (
    AppendHistoryTurn,
    ApplyFactOperations,
    ClaimSession,
    ClaimSessionForTurn,
    DeleteFact,
    DeleteIndexEntries,
    ExportPrincipal,
    FactAudit,
    ForgetPrincipal,
    HistoryTail,
    ListFacts,
    ListHistory,
    LoadProfile,
    LoadSessionMemory,
    LoadSummary,
    MemoryOperation,
    SaveProfile,
    SaveSummary,
    SearchAuthority,
    SearchIndex,
    UpsertIndexEntry,
)
from quipu.contracts.sealed import SealedFor
from quipu.services.kit.settings import KafkaSettings, StoreClientSettings
from quipu.services.kit.store_client import KafkaStore


class KafkaMemoryStore:
    """A `MemoryStore`, and the owner's `SessionClaims`, whose every call is a memory command to the
    storage owner."""

    def __init__(self, transport: KafkaStore, *, owns_transport: bool = False) -> None:
        self._transport = transport
        self._owns_transport = owns_transport

    @classmethod
    def connect(cls, settings: KafkaSettings, **options: Any) -> KafkaMemoryStore:
        """A client with its own transport (`options` as for `KafkaStore`); start it or use `async with`."""
        return cls(KafkaStore(settings, **options), owns_transport=True)

    @classmethod
    def for_service(cls, settings: KafkaSettings, client: StoreClientSettings) -> KafkaMemoryStore:
        """A client with its own transport, waiting and resending as the service's store settings say."""
        return cls(KafkaStore.for_service(settings, client), owns_transport=True)

    async def start(self) -> None:
        """Start the transport when this client owns it."""
        if self._owns_transport:
            await self._transport.start()

    async def stop(self) -> None:
        """Stop the transport when this client owns it."""
        if self._owns_transport:
            await self._transport.stop()

    async def __aenter__(self) -> KafkaMemoryStore:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    @property
    def turn_claims(self) -> KafkaMemoryStore:
        """This client: `claim_session_for_turn` is one command the owner applies (`MemoryStore`)."""
        return self

    async def _call(self, command: MemoryOperation) -> Any:
        return await self._transport.call(command)

    # --- the MemoryStore protocol ---------------------------------------------------------------

    async def append_history_turn(self, turn: HistoryTurn) -> HistoryAppendResult:
        result: HistoryAppendResult = await self._call(
            AppendHistoryTurn(turn=turn, tenant_id=turn.scope.tenant_id)
        )
        return result

    async def claim_session(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        result: MemoryScope = await self._call(
            ClaimSession(session_id=session_id, scope=scope, tenant_id=scope.tenant_id)
        )
        return result

    async def claim_session_for_turn(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        """Admit a turn by its session's owner in one command: the owner holds the recorded owner
        and the history both (`SessionClaims`, services/domain/session_claims.py)."""
        result: MemoryScope = await self._call(
            ClaimSessionForTurn(session_id=session_id, scope=scope, tenant_id=scope.tenant_id)
        )
        return result

    async def list_history(self, session_id: str, after_seq: int, limit: int) -> list[HistoryMessage]:
        result: list[HistoryMessage] = await self._call(
            ListHistory(session_id=session_id, after_seq=after_seq, limit=limit)
        )
        return result

    async def history_tail(self, session_id: str, count: int) -> list[HistoryMessage]:
        result: list[HistoryMessage] = await self._call(HistoryTail(session_id=session_id, count=count))
        return result

    async def load_summary(self, session_id: str) -> SessionSummary | None:
        result: SessionSummary | None = await self._call(LoadSummary(session_id=session_id))
        return result

    async def load_session_memory(self, session_id: str, count: int) -> SessionMemory:
        result: SessionMemory = await self._call(LoadSessionMemory(session_id=session_id, count=count))
        return result

    async def save_summary(self, summary: SessionSummary) -> SessionSummary:
        result: SessionSummary = await self._call(SaveSummary(summary=summary))
        return result

    async def apply_fact_operations(
        self, scope: MemoryScope, operations: list[FactOperation], idempotency_key: str
    ) -> list[FactChanged]:
        result: list[FactChanged] = await self._call(
            ApplyFactOperations(
                scope=scope, operations=operations, idempotency_key=idempotency_key, tenant_id=scope.tenant_id
            )
        )
        return result

    async def list_facts(self, scope: MemoryScope) -> list[Fact]:
        result: list[Fact] = await self._call(ListFacts(scope=scope, tenant_id=scope.tenant_id))
        return result

    async def fact_audit(self, scope: MemoryScope) -> list[Fact]:
        result: list[Fact] = await self._call(FactAudit(scope=scope, tenant_id=scope.tenant_id))
        return result

    async def delete_fact(self, scope: MemoryScope, fact_id: str) -> FactChanged:
        result: FactChanged = await self._call(
            DeleteFact(scope=scope, fact_id=fact_id, tenant_id=scope.tenant_id)
        )
        return result

    async def save_profile(self, profile: Profile) -> Profile:
        result: Profile = await self._call(SaveProfile(profile=profile, tenant_id=profile.scope.tenant_id))
        return result

    async def load_profile(self, scope: MemoryScope) -> Profile | None:
        result: Profile | None = await self._call(LoadProfile(scope=scope, tenant_id=scope.tenant_id))
        return result

    async def upsert_index_entry(self, entry: IndexEntry) -> None:
        await self._call(UpsertIndexEntry(entry=entry, tenant_id=entry.scope.tenant_id))

    async def delete_index_entries(self, scope: MemoryScope, fact_ids: list[str]) -> None:
        await self._call(DeleteIndexEntries(scope=scope, fact_ids=fact_ids, tenant_id=scope.tenant_id))

    async def search_index(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        result: list[ScoredFact] = await self._call(
            SearchIndex(scope=scope, query=query, k=k, tenant_id=scope.tenant_id)
        )
        return result

    async def search_authority(self, scope: MemoryScope, query: str, k: int) -> list[ScoredFact]:
        result: list[ScoredFact] = await self._call(
            SearchAuthority(scope=scope, query=query, k=k, tenant_id=scope.tenant_id)
        )
        return result

    async def export_principal(self, scope: MemoryScope) -> PrincipalExport:
        result: PrincipalExport = await self._call(ExportPrincipal(scope=scope, tenant_id=scope.tenant_id))
        return result

    async def forget_principal(self, tenant_id: str, principal_id: str) -> int:
        scope = MemoryScope(tenant_id=tenant_id, principal_id=principal_id)
        result: int = await self._call(ForgetPrincipal(scope=scope, tenant_id=tenant_id))
        # Else this process would seal the person's next words under the key just shredded.
        self._transport.drop_key(SealedFor(tenant_id=tenant_id, principal_id=principal_id))
        return result
