"""Whose a session's turn may be: one rule over the runtime store and the memory store together.

A session has one owner. The runtime store records it on the session (`Session.owner`, from the
credential of the gateway caller that created it; none when a worker or the CLI created it); the
memory store binds the session's history to one tenant and principal (`claim_session`). Before a
turn's run starts, the two must agree and the turn must be that owner's: `SessionClaimRule` claims
the history for the recorded owner, or for the turn's person when none is recorded, and refuses a
turn of anybody else (docs/store-contract.md §13).

The rule reads one store and writes the other, so it is sound only where both are at hand: inside
the storage owner (`ClaimSessionForTurn`, one command) or in a process that holds both stores
itself. It takes the person only from the stores' data and the turn's scope, which the caller
derives from the turn's credentials.
"""

from __future__ import annotations

from typing import Protocol

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.contracts.store import SessionOwner
from quipu.services.domain.memory.context import history_principal
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.validation import require_principal
from quipu.services.domain.store.protocol import Store
from quipu.services.domain.store.validation import require_id


class SessionClaims(Protocol):
    """Admits a turn into its session by the session's one owner (a rule over both stores)."""

    async def claim_session_for_turn(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        """Claim the session's history for its recorded owner, else for `scope`, and return the
        history's owner; SESSION_PRINCIPAL_MISMATCH when that owner is not `scope`'s tenant and
        principal (nothing is written then); SESSION_NOT_FOUND, SESSION_PURGED as LoadSessionStatus."""
        ...


def recorded_owner(session_id: str, recorded: SessionOwner) -> tuple[str, str]:
    """The tenant and principal of the history of a session with a recorded owner (one recorded
    without a principal is the session's anonymous one)."""
    return recorded.tenant_id, history_principal(recorded.principal_id, session_id)


def require_turn_of(owner: tuple[str, str], turn: MemoryScope, session_id: str) -> None:
    """A turn is admitted only into a session owned by its own tenant and principal."""
    if owner != (turn.tenant_id, turn.principal_id):
        raise StoreError(
            ErrorCode.SESSION_PRINCIPAL_MISMATCH, f"session {session_id} belongs to another principal"
        )


class SessionClaimRule:
    """`SessionClaims` over a runtime store and a memory store: a read of one, then a claim in the other.

    No transaction spans the two, and none is needed: the recorded owner is written once and never
    changes, and the history's claim is itself idempotent and first-wins, so a retry (or a second
    planner racing this one) reaches the same owner and the same answer.
    """

    def __init__(self, store: Store, memory: MemoryStore) -> None:
        self._store = store
        self._memory = memory

    async def claim_session_for_turn(self, session_id: str, scope: MemoryScope) -> MemoryScope:
        """See `SessionClaims.claim_session_for_turn`; every check runs before the claim writes."""
        require_id("session_id", session_id)
        require_principal(scope)
        recorded = (await self._store.load_session_status(session_id)).owner
        if recorded is not None:
            # Before the claim: a turn of anybody else writes nothing, not even the owner's claim.
            require_turn_of(recorded_owner(session_id, recorded), scope, session_id)
        return await self._memory.claim_session(session_id, scope)
