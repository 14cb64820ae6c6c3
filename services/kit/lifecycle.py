"""How a service process runs and stops: SIGTERM ends it within its shutdown grace, wedged or not.

    asyncio.run(serve(create_app(KafkaSettings(), settings), settings))

`serve` starts the app (startup hooks, then the broker), waits for SIGTERM or SIGINT, then stops
it (drain, broker, after-shutdown hooks) within `shutdown_grace_s`: the consumers' drain gets
`ConsumerSettings.drain_grace_s` of it, the rest is for leaving the consumer groups and closing
clients, and the last `EXIT_RESERVE_S` for the interpreter to exit. A stop that overruns is
abandoned (what was not committed is delivered again, as after a crash), and a process that still
has not exited when the grace is over — a task that ignores cancellation, a thread that never
returns — is ended by a watchdog thread. A second signal ends the process at once.

FastStream's own `app.run()` waits for the stop however long it takes: with a 10 s grace, an owner
whose replies waited on aiokafka's metadata for a topic that does not exist took 13 s to exit, and
the planner waiting on that owner 12 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

from faststream import FastStream

from quipu.services.kit.logging import get_logger
from quipu.services.kit.settings import ConsumerSettings

logger = get_logger(__name__)

EXIT_OVERRAN = 70
"""Exit status of a process the watchdog ended because its stop overran the grace (EX_SOFTWARE)."""

EXIT_RESERVE_S = 0.5
"""The end of the grace kept for the interpreter to exit after the stop (or for the watchdog)."""


def exit_after(seconds: float, status: int = EXIT_OVERRAN) -> threading.Timer:
    """A started watchdog thread that ends the process in `seconds` unless it exits first."""
    timer = threading.Timer(seconds, os._exit, (status,))
    timer.daemon = True
    timer.start()
    return timer


async def serve(app: FastStream, settings: ConsumerSettings, *, exit_watchdog: bool = True) -> None:
    """Run `app` until SIGTERM or SIGINT, then stop it within `settings.shutdown_grace_s`.

    `exit_watchdog=False` leaves out the thread that ends the process when it overruns (for a
    caller that is not a service process of its own, such as a test).
    """
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stopping.is_set() and exit_watchdog:
            os._exit(EXIT_OVERRAN)  # asked twice: the operator does not want to wait
        stopping.set()

    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, on_signal)
    try:
        await app.start()
        await stopping.wait()
        grace_s = settings.shutdown_grace_s
        if exit_watchdog:
            exit_after(grace_s)
        logger.info("stopping", shutdown_grace_s=grace_s)
        began = time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, grace_s - EXIT_RESERVE_S)):
                await app.stop()
        except TimeoutError:
            logger.warning("shutdown overran its grace; exiting anyway", shutdown_grace_s=grace_s)
        else:
            logger.info("stopped", seconds=round(time.monotonic() - began, 3))
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
