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

Every consuming service is one `service_app`: it declares how it opens what its handlers use and
how it subscribes, and the kit builds the broker and its delivery, runs the steps in order
(subscribe; on start open; on stop drain, then close what was opened) and holds what was opened
for the handlers (`Running`). Its `ServiceDefinition` says how it runs alone
(`python -m quipu.services.<name>`, `quipu serve`) or beside the others (`quipu up`, the demo).

    def create_app(kafka, settings, deps=None) -> FastStream:
        async def open_planner(broker, opened) -> Planner:
            store = await opened.start(KafkaStore(kafka))
            return Planner(store, ...)

        return service_app(kafka, settings, name="planner", attempts=settings.retry_attempts,
                           open=open_planner, subscribe=lambda broker, delivery, planner: [...])

    DEFINITION = ServiceDefinition("planner", PlannerSettings, lambda c, s: create_app(c.kafka, s))
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from faststream import FastStream
from faststream.kafka import KafkaBroker

from quipu.services.kit.broker import broker_delivery, make_broker
from quipu.services.kit.concurrent_delivery import ConcurrentConsumer
from quipu.services.kit.consumers import stop_consumer
from quipu.services.kit.delivery import Delivery
from quipu.services.kit.fetch_pace import FetchPace
from quipu.services.kit.keys import MessageSeals
from quipu.services.kit.logging import configure_logging, get_logger
from quipu.services.kit.settings import ConsumerSettings, KafkaSettings, MongoSettings, ServiceSettings

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


@functools.cache
def _freeze_start_up() -> None:
    gc.collect()
    gc.freeze()


def settle_heap(young_threshold: int) -> None:
    """Once the process's first service has started: what start-up built (modules, schemas,
    registries) lives as long as the process, so, garbage collected first, it is frozen out of the
    collector's scans (`gc.freeze`), which walked all of it at every full collection (~80 ms of a
    stalled loop each, a few a minute under load); and the youngest generation is collected every
    `young_threshold` allocations instead of Python's 700 (0 keeps Python's). Process-wide: the
    services of one process share the setting."""
    _freeze_start_up()
    if young_threshold > 0:
        _, middle, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, oldest)


# --- the service application: open → subscribe → serve → drain → close ---------------------------

T = TypeVar("T")
SettingsT = TypeVar("SettingsT", bound=ConsumerSettings)


class Client(Protocol):
    """A client a service starts when it opens and stops when it closes (a store client, ...)."""

    async def start(self) -> None:
        """Connect; raise when it cannot."""

    async def stop(self) -> None:
        """Disconnect and release what it holds."""


ClientT = TypeVar("ClientT", bound=Client)


class Running(Generic[T]):
    """What a service's handlers call (its planner, its recorder, ...), from open until close.

    The subscribers are declared before the app starts, so they are handed this, not the thing.
    """

    def __init__(self, service: str) -> None:
        self._service = service
        self._value: T | None = None

    def get(self) -> T:
        """The running thing; RuntimeError before the service opened it or after it closed."""
        if self._value is None:
            raise RuntimeError(f"the {self._service} is not started")
        return self._value

    def set(self, value: T | None) -> None:
        """Hold `value` (None once closed)."""
        self._value = value


class Opened:
    """What a service opened at startup, closed at shutdown in reverse order (last opened first)."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], Awaitable[object]]] = []

    async def start(self, client: ClientT) -> ClientT:
        """Start `client` and stop it when the service closes; returns it."""
        await client.start()
        self.on_close(client.stop)
        return client

    def on_close(self, close: Callable[[], Awaitable[object]]) -> None:
        """Call `close` when the service closes (before whatever was opened earlier)."""
        self._closers.append(close)

    async def close(self) -> None:
        """Close everything, last opened first."""
        while self._closers:
            await self._closers.pop()()


OpenStep = Callable[[KafkaBroker, Opened], Awaitable[T]]
"""Builds what the handlers use; clients it opens go through `Opened`, so they are closed."""

SubscribeStep = Callable[[KafkaBroker, Delivery, Running[T]], Sequence[ConcurrentConsumer]]
"""Declares the subscribers on the broker; returns the consumers to drain on shutdown."""


def service_app(
    kafka: KafkaSettings,
    settings: ConsumerSettings,
    *,
    name: str,
    attempts: int,
    open: OpenStep[T],
    subscribe: SubscribeStep[T],
    client_id: str | None = None,
    seals: MessageSeals | None = None,
    running: Running[T] | None = None,
) -> FastStream:
    """The FastStream application of a consuming service.

    `name` is the service's (`planner`); `client_id` (default `name`) names its Kafka clients;
    `attempts` are the delivery's tries of one message; `seals` open its sealed messages (and are
    closed with the service, last). On start `open` runs before the broker connects; on stop the
    consumers `subscribe` returned get `settings.drain_grace_s` to finish what they hold, while the
    broker can still publish and commit; once the broker has stopped, what `open` opened is closed.
    Every subscriber's consumer fetches less often while it has nothing to read (kit.fetch_pace).
    `running` is for a service that hands what it opens to something built before it opens (the
    owner's keyring).
    """
    broker = make_broker(kafka, client_id=client_id or name)
    delivery = broker_delivery(broker, kafka, attempts=attempts, opener=seals)
    running = running if running is not None else Running(name.replace("-", " "))
    consumers = subscribe(broker, delivery, running)
    opened = Opened()

    # Hooks, not a lifespan: `app.start()` (in-process use, tests) runs hooks, only `app.run()` lifespans.
    async def open_service() -> None:
        running.set(await open(broker, opened))

    paces: list[FetchPace] = []

    async def pace_consumers() -> None:
        settle_heap(settings.gc_young_threshold)
        # Once started: FastStream makes a subscriber's consumer when the subscriber starts.
        on_call = [each.kafka_consumer() for each in consumers if each.on_call]
        for subscriber in broker.subscribers:
            consumer = getattr(subscriber, "consumer", None)
            if consumer is not None:
                paces.append(FetchPace(consumer, kafka, on_call=any(consumer is each for each in on_call)))
                paces[-1].start()

    async def drain() -> None:
        await asyncio.gather(*(pace.stop() for pace in paces))
        paces.clear()
        await asyncio.gather(*(consumer.drain(settings.drain_grace_s) for consumer in consumers))
        # FastStream stops each subscriber's consumer with a plain `stop()`, which a rebalance
        # landing in the same turn hangs (kit.consumers); once stopped here, its stop is a no-op.
        kafka_consumers = [getattr(subscriber, "consumer", None) for subscriber in broker.subscribers]
        await asyncio.gather(*(stop_consumer(each) for each in kafka_consumers if each is not None))

    async def close() -> None:
        await opened.close()
        if seals is not None:
            await seals.close()  # after the clients that seal with it
        running.set(None)

    return FastStream(
        broker,
        on_startup=[open_service],
        after_startup=[pace_consumers],
        on_shutdown=[drain],
        after_shutdown=[close],
    )


@dataclass(frozen=True)
class Connections:
    """What a service reaches besides its own settings: Kafka, and MongoDB for the one that may."""

    kafka: KafkaSettings
    mongo: MongoSettings | None = None


@dataclass(frozen=True)
class ServiceDefinition(Generic[SettingsT]):
    """How a consuming service is built from its settings, so one launcher runs any of them."""

    name: str
    """The service's name: bound to its logs, its Kafka client id."""
    settings: type[SettingsT]
    """Its settings, read from the environment (`QUIPU_<SERVICE>_...`)."""
    create: Callable[[Connections, SettingsT], FastStream]
    """Its application over `Connections` and its settings."""
    reaches_mongo: bool = False
    """Whether it is given MongoDB's settings (only the storage owner)."""

    def app(self, connections: Connections) -> FastStream:
        """The application, with its settings read from the environment now."""
        return self.create(connections, self.settings())

    def main(self) -> None:
        """Run alone: read the settings once, configure logging, serve until SIGTERM (`serve`)."""
        configure_logging(ServiceSettings(service_name=self.name))
        settings = self.settings()
        # QUIPU_MONGO_URI is read only where it is needed: no other service holds it.
        mongo = MongoSettings() if self.reaches_mongo else None
        app = self.create(Connections(KafkaSettings(), mongo), settings)
        asyncio.run(serve(app, settings))
