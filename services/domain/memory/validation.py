"""The shape checks of memory commands and their limits: INVALID_ARGUMENT, before any I/O.

Identifiers and timestamps are checked as the runtime store checks them (`store.validation`).
"""

from __future__ import annotations

from collections.abc import Sequence

from quipu.contracts.errors import invalid
from quipu.contracts.memory import FactOperation, FactOperationKind, MemoryScope
from quipu.services.domain.store.validation import require_id

MAX_HISTORY_PAGE = 500
MAX_SEARCH_RESULTS = 100
MAX_FACT_TEXT = 2000
MAX_OPERATIONS = 100


def require_principal(scope: MemoryScope) -> None:
    """Memory always belongs to a person."""
    require_id("scope.principal_id", scope.principal_id)


def require_results(k: int) -> None:
    """Searches return between 1 and MAX_SEARCH_RESULTS facts."""
    if not 1 <= k <= MAX_SEARCH_RESULTS:
        raise invalid(f"k must be between 1 and {MAX_SEARCH_RESULTS}")


def check_operations(operations: Sequence[FactOperation]) -> None:
    """Shape of a batch: ids present and distinct, texts present and short."""
    if len(operations) > MAX_OPERATIONS:
        raise invalid(f"at most {MAX_OPERATIONS} operations per batch")
    seen: set[str] = set()
    for operation in operations:
        require_id("fact_id", operation.fact_id)
        if operation.fact_id in seen:
            raise invalid(f"fact {operation.fact_id} appears twice in one batch")
        seen.add(operation.fact_id)
        if operation.kind is not FactOperationKind.DELETE:
            if not operation.text.strip():
                raise invalid(f"{operation.kind.value} of {operation.fact_id} needs a text")
            if len(operation.text) > MAX_FACT_TEXT:
                raise invalid(f"fact text longer than {MAX_FACT_TEXT} characters")
