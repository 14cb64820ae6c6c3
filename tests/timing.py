"""One time scale for every deadline a test waits on.

Tests wait for conditions, never for time; what they bound is how long a condition may take to
hold. Every such bound is written for a quiet 2-core machine and multiplied here by
`QUIPU_TEST_TIME_SCALE` (default 1), so a busy CI host stretches all of them at once instead of
tripping the shortest. Under pytest-xdist (`make test` runs two workers) the scale is multiplied by
the number of workers as well: they share the same cores, so each test runs on a machine as busy
as that many suites make it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

TIME_SCALE_ENV = "QUIPU_TEST_TIME_SCALE"
WORKER_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"
"""Set by pytest-xdist in each of its workers: how many run side by side."""


def time_scale() -> float:
    """The factor every test deadline is multiplied by: `QUIPU_TEST_TIME_SCALE` (at least 1) times
    the number of pytest-xdist workers (1 without xdist)."""
    return _at_least_one(TIME_SCALE_ENV) * _at_least_one(WORKER_COUNT_ENV)


def _at_least_one(variable: str) -> float:
    try:
        return max(1.0, float(os.environ.get(variable, "1")))
    except ValueError:
        return 1.0


def scaled(seconds: float) -> float:
    """`seconds` on a quiet machine, stretched by the time scale."""
    return seconds * time_scale()


async def eventually(
    check: Callable[[], Awaitable[bool]], *, within: float, what: str, interval: float = 0.02
) -> None:
    """Wait until `check()` holds, for at most `scaled(within)` seconds; else fail naming `what`."""
    deadline = time.monotonic() + scaled(within)
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {scaled(within):.1f} s")
        await asyncio.sleep(interval)
