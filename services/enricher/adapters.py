"""The enricher's I/O: applying index updates through the store, bounded in time and in tries.

Best effort by design (ZeroClaw ADR-010): each store call has a deadline; a transient failure
(UNAVAILABLE, a timeout, a lost connection) is tried again a few times with backoff; after that
the change is given up as a PermanentError, which the delivery wrapper dead-letters before the
offset moves on. So the enricher never retries forever and never holds its partition hostage;
what it missed is still in the authority, where retrieval falls back to, and a reindex rebuilds
it. A fact that is gone by the time its change arrives is nothing to index: logged, not an error.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from quipu.contracts.errors import ErrorCode, QuipuError, StoreRefusedError, is_retryable
from quipu.contracts.memory import FactChanged
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.reindex import IndexMaintenance, Principal, ReindexReport, reindex
from quipu.services.enricher.logic import DropEntries, UpsertEntry, index_update
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.kit.delivery import PermanentError
from quipu.services.kit.logging import get_logger

logger = get_logger(__name__)

Sleep = Callable[[float], Awaitable[None]]
"""Waits between two tries (tests pass one that does not wait)."""


class Enricher:
    """Applies committed fact changes to the derived index, and rebuilds it from the authority."""

    def __init__(
        self,
        store: IndexMaintenance,
        settings: EnricherSettings,
        *,
        clock: Callable[[], datetime] = utc_now_ms,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._sleep = sleep

    async def on_fact_changed(self, change: FactChanged) -> None:
        """Upsert or drop the fact's entry; raises PermanentError when the change must be dead-lettered."""
        update = index_update(change, self._clock())
        log = logger.bind(
            event_id=change.event_id,
            tenant_id=change.scope.tenant_id or None,
            fact_id=change.fact_id,
            version=change.version,
            kind=change.kind.value,
        )
        if isinstance(update, UpsertEntry):
            entry = update.entry
            try:
                await self._try(lambda: self._store.upsert_index_entry(entry))
            except _FactGoneError:
                log.info("fact gone before its change was indexed; nothing to index")
                return
            log.debug("index entry upserted", terms=entry.length)
            return
        drop: DropEntries = update
        await self._try(lambda: self._store.delete_index_entries(drop.scope, drop.fact_ids))
        log.debug("index entries dropped")

    async def reindex(self, principals: Iterable[Principal]) -> ReindexReport:
        """Rebuild the entries of these principals from the authority (see `kit.memory.reindex`)."""
        report = await reindex(self._store, principals, self._clock)
        logger.info("reindexed", **report.model_dump())
        return report

    async def _try(self, call: Callable[[], Awaitable[None]]) -> None:
        attempts = self._settings.retry_attempts
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(self._settings.store_reply_timeout_s):
                    await call()
                return
            except StoreRefusedError as error:
                if error.code is ErrorCode.FACT_NOT_FOUND:
                    raise _FactGoneError from error
                raise PermanentError(f"the store refused the index update: {error}") from error
            except Exception as error:
                if not is_retryable(error):
                    raise
                last: Exception = error
            logger.info("index update failed; trying again", attempt=attempt, error=repr(last))
            if attempt < attempts:
                delay = self._settings.retry_delay_s * 2 ** (attempt - 1)
                await self._sleep(random.uniform(0, delay))
        raise PermanentError(f"index update given up after {attempts} tries: {last!r}")


class _FactGoneError(QuipuError):
    """Raised when the store no longer holds the fact (deleted or forgotten since the change)."""
