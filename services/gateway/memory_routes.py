"""The gateway's memory routes: a person sees, exports and deletes what Quipu remembers about them.

    GET    /v1/principals/{principal_id}/facts               current facts, with provenance
    DELETE /v1/principals/{principal_id}/facts/{fact_id}     delete one fact (and its index entry)
    GET    /v1/principals/{principal_id}/export              everything remembered, as JSON
    DELETE /v1/principals/{principal_id}                     forget the person entirely
    POST   /v1/memory/reindex                                rebuild the derived index

Memory is reached through any `MemoryStore` (the owner's Kafka client in production, the
in-memory store in tests). A caller reaches their own principal; an admin every principal of
their tenant; nothing of another tenant (404). `tenant_id` defaults to the caller's; `agent_id` narrows a
listing to one agent's facts plus the principal-wide ones. Deleting a fact also drops its index
entry at once, without waiting for the enricher (search would drop the stale entry anyway: it
rehydrates every hit from the authority).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

import structlog
from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import Fact, MemoryScope, PrincipalExport
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.reindex import Principal, ReindexReport, principals_from_changes, reindex
from quipu.services.gateway import access
from quipu.services.gateway.access import Caller
from quipu.services.gateway.auth import Admin, MemoryReader, MemoryWriter
from quipu.services.gateway.logic import ErrorResponse, GatewayError
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore

logger = structlog.get_logger(__name__)

PrincipalSource = Callable[[str | None], Awaitable[list[Principal]]]
"""Every principal with memory (of one tenant, or of all with None): what a full reindex covers."""


@dataclass
class MemoryDeps:
    """What the memory routes use: the store, and where a full reindex finds every principal."""

    store: MemoryStore
    principals: PrincipalSource


def over_kafka(transport: KafkaStore, kafka: KafkaSettings) -> MemoryDeps:
    """Memory through the owner, sharing the gateway's store transport; principals from `memory.changes`."""

    async def principals(tenant_id: str | None) -> list[Principal]:
        return await principals_from_changes(kafka, tenant_id=tenant_id)

    return MemoryDeps(KafkaMemoryStore(transport), principals)


# --- bodies ---------------------------------------------------------------------------------------


class FactList(BaseModel):
    """The current facts of a principal, each with where it came from."""

    scope: MemoryScope = Field(description="Whose facts (agent empty: every agent).")
    facts: list[Fact] = Field(description="Current facts in the order they were first recorded.")


class FactDeleted(BaseModel):
    """A deleted fact."""

    fact_id: str = Field(description="The fact.")
    version: int = Field(description="Version of the deletion (its previous wording is in the audit).")


class PrincipalForgotten(BaseModel):
    """A principal erased: facts, audit, profile, history, summaries and index entries."""

    tenant_id: str = Field(description="Tenant of the principal.")
    principal_id: str = Field(description="The person.")
    erased: int = Field(description="Documents erased.")


class ReindexRequest(BaseModel):
    """Rebuild the derived index from the authority: one principal, or every one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    principal_id: str | None = Field(
        default=None, min_length=1, max_length=256, description="Only this principal; omitted: every one."
    )
    tenant_id: str | None = Field(
        default=None,
        max_length=256,
        description="The caller's own tenant (the only one an admin reindexes); omitted: the caller's.",
    )


# --- dependencies -----------------------------------------------------------------------------------


def _memory(request: Request) -> MemoryDeps:
    memory: MemoryDeps | None = getattr(request.app.state, "memory", None)
    if memory is None:
        raise GatewayError(503, ErrorCode.UNAVAILABLE.value, "memory is not reachable from this gateway")
    return memory


Memory = Annotated[MemoryDeps, Depends(_memory)]
TenantQuery = Annotated[
    str | None, Query(max_length=256, description="Tenant of the principal: the caller's own (the default).")
]
AgentQuery = Annotated[
    str, Query(max_length=256, description="Only this agent's facts and the principal-wide ones.")
]


def _scope(caller: Caller, principal_id: str, tenant_id: str | None, agent_id: str = "") -> MemoryScope:
    tenant = access.require_principal(caller, principal_id, tenant_id)
    return MemoryScope(tenant_id=tenant, principal_id=principal_id, agent_id=agent_id)


_ERRORS: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 503)
}

router = APIRouter(prefix="/v1", responses=_ERRORS, tags=["memory"])


# --- routes -----------------------------------------------------------------------------------------


@router.get("/principals/{principal_id}/facts", response_model=FactList)
async def list_facts(
    memory: Memory,
    caller: MemoryReader,
    principal_id: str,
    tenant_id: TenantQuery = None,
    agent_id: AgentQuery = "",
) -> FactList:
    """What Quipu remembers about the person now, with the session and turn each fact came from."""
    scope = _scope(caller, principal_id, tenant_id, agent_id)
    return FactList(scope=scope, facts=await memory.store.list_facts(scope))


@router.delete("/principals/{principal_id}/facts/{fact_id}", response_model=FactDeleted)
async def delete_fact(
    memory: Memory,
    caller: MemoryWriter,
    principal_id: str,
    fact_id: str,
    tenant_id: TenantQuery = None,
    agent_id: AgentQuery = "",
) -> FactDeleted:
    """Delete one fact: it leaves retrieval and future prompts at once; its wording stays in the audit."""
    scope = _scope(caller, principal_id, tenant_id, agent_id)
    try:
        change = await memory.store.delete_fact(scope, fact_id)
    except StoreError as error:
        if error.code is ErrorCode.FACT_NOT_FOUND:
            raise GatewayError(404, error.code.value, error.message) from error
        raise
    # The authority has committed; the entry is derived, so failing to drop it fails nothing.
    try:
        await memory.store.delete_index_entries(scope, [fact_id])
    except StoreError as error:
        logger.warning(
            "index entry of a deleted fact left to the enricher", fact_id=fact_id, error=str(error)
        )
    return FactDeleted(fact_id=change.fact_id, version=change.version)


@router.get("/principals/{principal_id}/export", response_model=PrincipalExport)
async def export_principal(
    memory: Memory,
    caller: MemoryReader,
    response: Response,
    principal_id: str,
    tenant_id: TenantQuery = None,
    agent_id: AgentQuery = "",
) -> PrincipalExport:
    """Everything remembered about the person: facts, previous versions and the profile (JSON)."""
    scope = _scope(caller, principal_id, tenant_id, agent_id)
    exported = await memory.store.export_principal(scope)
    response.headers["Content-Disposition"] = 'attachment; filename="quipu-memory-export.json"'
    return exported


@router.delete("/principals/{principal_id}", response_model=PrincipalForgotten)
async def forget_principal(
    memory: Memory, caller: MemoryWriter, principal_id: str, tenant_id: TenantQuery = None
) -> PrincipalForgotten:
    """Forget the person: facts, audit, profile, history, summaries and index entries, for every agent."""
    tenant = access.require_principal(caller, principal_id, tenant_id)
    erased = await memory.store.forget_principal(tenant, principal_id)
    return PrincipalForgotten(tenant_id=tenant, principal_id=principal_id, erased=erased)


@router.post("/memory/reindex", response_model=ReindexReport)
async def reindex_memory(
    memory: Memory, caller: Admin, body: Annotated[ReindexRequest | None, Body()] = None
) -> ReindexReport:
    """Rebuild the derived index from the authority (the caller's tenant, as its admin)."""
    wanted = body or ReindexRequest()
    tenant = access.require_admin_tenant(caller, wanted.tenant_id)
    if wanted.principal_id is not None:
        principals = [Principal(tenant_id=tenant, principal_id=wanted.principal_id)]
    else:
        try:
            principals = await memory.principals(tenant)
        except TimeoutError as error:
            raise GatewayError(503, ErrorCode.UNAVAILABLE.value, str(error)) from error
    report = await reindex(memory.store, principals)
    logger.info("reindexed", **report.model_dump())
    return report
