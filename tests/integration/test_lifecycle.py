"""A service stops within its shutdown grace after SIGTERM, however its shutdown hooks behave."""

from __future__ import annotations

import asyncio
import os
import signal

from faststream import FastStream

from quipu.services.kit.broker import make_broker
from quipu.services.kit.lifecycle import serve
from quipu.services.kit.settings import ConsumerSettings, KafkaSettings
from tests.timing import eventually, scaled


async def test_sigterm_ends_a_service_whose_drain_never_finishes_within_its_grace(
    kafka_settings: KafkaSettings,
) -> None:
    draining = asyncio.Event()
    closed: list[str] = []

    async def drain_forever() -> None:
        # A message in flight that ignores its grace (waiting on a topic that will never exist).
        draining.set()
        await asyncio.Event().wait()

    async def close() -> None:
        closed.append("closed")

    broker = make_broker(kafka_settings, client_id="lifecycle-test")
    app = FastStream(broker, on_shutdown=[drain_forever], after_shutdown=[close])
    settings = ConsumerSettings(shutdown_grace_s=scaled(1.0))
    served = asyncio.create_task(serve(app, settings, exit_watchdog=False))

    async def started() -> bool:
        return broker.running or served.done()

    await eventually(started, within=20.0, what="the app started")
    os.kill(os.getpid(), signal.SIGTERM)
    await eventually(lambda: _done(served), within=settings.shutdown_grace_s + 3.0, what="serve returned")
    assert draining.is_set()
    served.result()  # no exception: an overrun is logged, not raised
    assert closed == [], "a stop abandoned at the grace does not wait for what came after the drain"
    await broker.stop()


async def _done(task: asyncio.Task[None]) -> bool:
    return task.done()
