"""What forget leaves behind: marks that name what it erased without keeping any of it.

A forget records when it happened for the person, and one mark for every turn it erased. The
marks are digests of identifiers (no words, no identifier in clear) and the forget's time, so
they can outlive the person's data: a write that would bring back a forgotten turn, or words
said before the forget, meets its mark and is refused (`PRINCIPAL_FORGOTTEN`).

A turn's mark is needed only while a late copy of that turn can still arrive: a redelivery or a
consumer behind, at most as old as the topics' retention. Each forget drops the turn marks of
forgets older than `DEFAULT_TURN_MARKS_KEEP` (a setting of the owner), so the marks stay bounded;
a person's mark (one per person) is kept.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TURN_MARKS_KEEP = timedelta(days=30)
"""How long a turn's mark outlives its forget: keep it above every topic's retention."""


def digest(*parts: str) -> str:
    """A stable hex id made of `parts` (document ids that must not show the parts themselves)."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def person_mark(tenant_id: str, principal_id: str) -> str:
    """The id of a person's forget mark (when they were last forgotten)."""
    return digest("forgotten", tenant_id, principal_id)


def turn_mark(tenant_id: str, principal_id: str, session_id: str, turn_id: str) -> str:
    """The id of the mark of one erased turn of the person."""
    return digest("forgotten-turn", tenant_id, principal_id, session_id, turn_id)


class Forgetting(BaseModel):
    """What the marks say of one write: when its person was last forgotten, and whether it names
    an erased turn."""

    model_config = ConfigDict(frozen=True)

    forgotten_at: datetime | None = Field(
        default=None, description="When the person was last forgotten (None: never)."
    )
    erased_turn: bool = Field(default=False, description="Whether one of the turns asked about was erased.")

    def refuses(self, said_at: datetime | None) -> bool:
        """Whether a write of words said at `said_at` (None: undated) must be refused."""
        if self.erased_turn:
            return True
        return said_at is not None and self.forgotten_at is not None and said_at <= self.forgotten_at
