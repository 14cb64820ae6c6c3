"""Pure logic of the enricher: what a committed fact change does to the derived index.

No broker, database or SDK here. A change is checked (a malformed one can never be applied and
goes to the dead-letter topic), then becomes one index update: created or updated → upsert the
entry built from the fact's text (terms from the shared tokenizer, length, version, scope);
deleted → drop the fact's entry. The store keeps the highest version, so an old change arriving
late is harmless, and it refuses entries for facts that are gone, so a late change never
resurrects a deleted or forgotten fact's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from quipu.contracts.memory import FactChanged, FactChangeKind, IndexEntry, MemoryScope
from quipu.services.domain.memory.ranking import term_frequencies
from quipu.services.domain.memory.validation import MAX_FACT_TEXT
from quipu.services.kit.delivery import PermanentError


@dataclass(frozen=True)
class UpsertEntry:
    """Store (or replace with a newer version) the entry of one fact."""

    entry: IndexEntry


@dataclass(frozen=True)
class DropEntries:
    """Drop the entries of these facts of one principal."""

    scope: MemoryScope
    fact_ids: list[str]


IndexUpdate = UpsertEntry | DropEntries
"""What one change does to the index."""


def check_change(change: FactChanged) -> None:
    """Refuse a change that can never be applied (PermanentError: it goes to the dead-letter topic)."""
    if not change.scope.principal_id:
        raise PermanentError(f"change {change.event_id} names no principal")
    if not change.fact_id:
        raise PermanentError(f"change {change.event_id} names no fact")
    if change.version < 1:
        raise PermanentError(f"change {change.event_id} has version {change.version}; versions start at 1")
    if change.kind is FactChangeKind.DELETED:
        return
    if not change.text.strip():
        raise PermanentError(f"{change.kind.value} change {change.event_id} carries no text")
    if len(change.text) > MAX_FACT_TEXT:
        raise PermanentError(f"change {change.event_id} carries a text longer than any fact may be")


def index_update(change: FactChanged, indexed_at: datetime) -> IndexUpdate:
    """The index update a valid change asks for (raises PermanentError for a malformed one)."""
    check_change(change)
    if change.kind is FactChangeKind.DELETED:
        return DropEntries(scope=change.scope, fact_ids=[change.fact_id])
    terms, length = term_frequencies(change.text)
    return UpsertEntry(
        IndexEntry(
            fact_id=change.fact_id,
            scope=change.scope,
            fact_version=change.version,
            terms=terms,
            length=length,
            indexed_at=indexed_at,
        )
    )
