"""Who may reach what: the caller a credential names, and the ownership checks every route makes.

A caller is a principal within a tenant, with scopes. A session belongs to the principal whose
credential created it; a run belongs to its session's owner (a one-shot run to the owner the
gateway stamped in its labels); memory belongs to its principal. A tenant's `admin` reaches
everything of that tenant, but turns and answers speak for a person, so only the session's own
principal adds them. Anything another caller may not reach answers exactly as if it did not
exist (404), so ids of other people's sessions and runs reveal nothing.

Pure functions: handlers load what a check needs and call these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import RunMeta, Session, SessionOwner
from quipu.services.gateway.logic import INVALID_REQUEST, GatewayError


class Scope(StrEnum):
    """What a credential may do."""

    RUNS_READ = "runs:read"
    RUNS_WRITE = "runs:write"
    MEMORY_READ = "memory:read"
    MEMORY_WRITE = "memory:write"
    ADMIN = "admin"


FORBIDDEN = "FORBIDDEN"
"""Code of a request whose credential lacks the scope, or that speaks for someone else."""

OWNER_LABELS = ("quipu.tenant_id", "quipu.principal_id")
"""Labels the gateway stamps on every run it requests (reserved: a caller cannot set them)."""
RESERVED_LABEL_PREFIX = "quipu."


@dataclass(frozen=True)
class Caller:
    """An authenticated caller."""

    tenant_id: str
    principal_id: str
    scopes: frozenset[Scope]
    credential: str
    """Which credential (`key:<id>` or `jwt:<issuer>`), for logs; never the secret."""

    @property
    def admin(self) -> bool:
        """An admin of its tenant."""
        return Scope.ADMIN in self.scopes

    @property
    def owner(self) -> SessionOwner:
        """The owner recorded on what this caller creates."""
        return SessionOwner(tenant_id=self.tenant_id, principal_id=self.principal_id)

    def require(self, scope: Scope) -> None:
        """Refuse with 403 unless the credential has `scope` (admin has every scope of its tenant)."""
        if scope not in self.scopes and not self.admin:
            raise GatewayError(403, FORBIDDEN, f"this credential lacks the {scope.value!r} scope")


def reaches(caller: Caller, owner: SessionOwner | None, *, default_tenant: str) -> bool:
    """Whether `caller` may see and administer what `owner` owns (None: nobody; its tenant's admins)."""
    tenant = owner.tenant_id if owner is not None else default_tenant
    if tenant != caller.tenant_id:
        return False
    return caller.admin or (owner is not None and owner.principal_id == caller.principal_id)


def require_session(caller: Caller, session: Session, *, default_tenant: str) -> Session:
    """The session, or 404 as if it did not exist when `caller` may not reach it."""
    if not reaches(caller, session.owner, default_tenant=default_tenant):
        raise unknown_session(session.session_id)
    return session


def require_own_session(caller: Caller, session: Session, *, default_tenant: str) -> Session:
    """A session the caller adds turns to: their own (an admin of the tenant may see it, not speak in it)."""
    require_session(caller, session, default_tenant=default_tenant)
    if session.owner != caller.owner:
        raise GatewayError(
            403,
            FORBIDDEN,
            f"session {session.session_id!r} belongs to another principal: turns speak for its owner",
        )
    return session


def unknown_session(session_id: str) -> GatewayError:
    """The answer for a session that does not exist, or that the caller may not reach."""
    return GatewayError(404, ErrorCode.SESSION_NOT_FOUND.value, f"session {session_id!r} was not found")


def unknown_run(run_id: str) -> GatewayError:
    """The answer for a run that does not exist, or that the caller may not reach."""
    return GatewayError(404, ErrorCode.RUN_NOT_FOUND.value, f"run {run_id!r} was not found")


class AcceptedRuns:
    """Runs this gateway copy accepted lately, until the planner starts them (bounded, in memory).

    Between a 202 and the planner's start the store knows nothing of the run; under load that
    lasts seconds. Every copy learns the runs the others accept from `runs.requested`
    (`RequestedRuns` follows it), so a copy behind the same load balancer answers 202 too, from
    the moment it has read the request (milliseconds after the publish).
    """

    def __init__(self, keep_s: float = 300.0, most: int = 10_000) -> None:
        self._keep_s = keep_s
        self._most = most
        self._runs: dict[str, tuple[SessionOwner, str, float]] = {}

    def add(self, run_id: str, owner: SessionOwner, session_id: str, now: float) -> None:
        """Remember an accepted run (the oldest are forgotten first)."""
        self._runs.pop(run_id, None)
        self._runs[run_id] = (owner, session_id, now)
        while len(self._runs) > self._most:
            del self._runs[next(iter(self._runs))]

    def session_of(self, run_id: str, owner: SessionOwner, now: float) -> str | None:
        """The session of a run `owner` had accepted lately, else None."""
        found = self._runs.get(run_id)
        if found is None or found[0] != owner or now - found[2] > self._keep_s:
            return None
        return found[1]


async def nothing_to_learn() -> None:
    """A gateway alone (tests' in-memory deps) accepts every run it knows of itself."""


def accepted_elsewhere(value: bytes) -> tuple[str, SessionOwner, str] | None:
    """(run id, owner, session id) of a run request a gateway copy accepted, read from its record on
    `runs.requested` (ids and labels travel in clear, sealed or not); None for anything else: a
    request no gateway stamped with an owner, or bytes that are not one. Never raises."""
    try:
        body = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    labels, run_id, session_id = body.get("labels"), body.get("run_id"), body.get("session_id", "")
    if not isinstance(labels, dict) or not isinstance(run_id, str) or not isinstance(session_id, str):
        return None
    tenant, principal = (labels.get(label) for label in OWNER_LABELS)
    if not run_id or not isinstance(tenant, str) or not isinstance(principal, str) or not principal:
        return None
    return run_id, SessionOwner(tenant_id=tenant, principal_id=principal), session_id


def labelled_owner(meta: RunMeta) -> SessionOwner | None:
    """The owner the gateway stamped on a run's labels, if it did."""
    tenant, principal = (meta.labels.get(label) for label in OWNER_LABELS)
    if tenant is None or not principal:
        return None
    return SessionOwner(tenant_id=tenant, principal_id=principal)


def owner_labels(caller: Caller, labels: dict[str, str]) -> dict[str, str]:
    """The caller's labels with the owner stamped in; a caller's own `quipu.` label is refused (400)."""
    reserved = sorted(label for label in labels if label.startswith(RESERVED_LABEL_PREFIX))
    if reserved:
        raise GatewayError(
            400, INVALID_REQUEST, f"labels starting with {RESERVED_LABEL_PREFIX!r} are reserved"
        )
    return {**labels, OWNER_LABELS[0]: caller.tenant_id, OWNER_LABELS[1]: caller.principal_id}


def require_principal(caller: Caller, principal_id: str, tenant_id: str | None) -> str:
    """The tenant of a memory request: the caller's own principal, or any of its tenant as its admin.

    Another tenant, or another principal without admin, is 404 (nothing of theirs is revealed).
    """
    tenant = caller.tenant_id if tenant_id is None else tenant_id
    if tenant != caller.tenant_id or (principal_id != caller.principal_id and not caller.admin):
        raise GatewayError(404, "PRINCIPAL_NOT_FOUND", f"nothing is known of principal {principal_id!r} here")
    return tenant


def require_admin_tenant(caller: Caller, tenant_id: str | None) -> str:
    """A tenant-wide operation's tenant: the caller's own (as its admin)."""
    caller.require(Scope.ADMIN)
    if tenant_id is not None and tenant_id != caller.tenant_id:
        raise GatewayError(403, FORBIDDEN, "an admin acts in its own tenant only")
    return caller.tenant_id
