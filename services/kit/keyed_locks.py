"""One asyncio lock per key, kept only while somebody holds or awaits it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class KeyedLocks(Generic[K]):
    """Holders of one key run one at a time, in arrival order (asyncio locks are FIFO); other keys
    run beside them. A key's lock is dropped when its last holder leaves, so keys do not pile up."""

    def __init__(self) -> None:
        self._locks: dict[K, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[Callable[[], None]]:
        """Run the block alone among the holders of `key`, after those that came before; what it
        is given lets the next holder in before the block ends (once: later calls do nothing)."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        held = False

        def let_go() -> None:
            nonlocal held
            if held:
                held = False
                lock.release()

        try:
            await lock.acquire()
            held = True
            yield let_go
        finally:
            let_go()
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Keys held or awaited now."""
        return len(self._locks)
