"""Fixtures shared by every test folder.

- `stack` (session): the embedded Tansu + SecantusDB (or the endpoints named by
  `QUIPU_KAFKA_BOOTSTRAP` / `QUIPU_MONGO_URI`), started once, stopped at the
  end of the session even when tests fail.
- `unique`: a short unique name for this test (topic prefix, group ids,
  database name).
- `topic_prefix`: every registry topic (and `.dlq`) created under a prefix of
  this test's own; deleted afterwards.
- `kafka_settings` / `mongo_settings`: settings pointing at the stack, isolated
  by `topic_prefix` / a database named `unique`.
- `quipu_wheel` (session): the wheel of this checkout, built once by pip (what a user installs).
- An autouse guard fails any test during which the event loop is blocked for
  longer than a threshold (2.5 s; `QUIPU_TEST_BLOCK_THRESHOLD` or the marker
  `event_loop_block_threshold(seconds)` change it; the marker
  `allow_event_loop_blocking` turns it off for a test).
- That threshold and pytest-timeout's per-test limit (the ini `timeout` or `--timeout`) are
  multiplied by the time scale (`QUIPU_TEST_TIME_SCALE` times the number of pytest-xdist workers),
  like every deadline in `tests/timing.py`; a module's own `timeout(...)` marker says
  `scaled(seconds)` itself.
- Under pytest-xdist every worker has its own `stack` (session fixtures are per worker);
  `quipu_wheel` is built once for all of them. A test file is one unit of work, and the folders
  that start whole service fleets (`FLEET_FOLDERS`) are one unit together.
- No test can reach a real model or any host off this machine: the model keys are removed from
  the environment before any test (and so from every child process a test starts), a socket
  may connect only to loopback addresses (the embedded broker, database and the local Messages-API
  server live there) and no host name but `localhost` is looked up; anything else fails the test
  at once, as pydantic-ai's `ALLOW_MODEL_REQUESTS = False` does.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import fcntl
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import pytest
from xdist.scheduler import LoadFileScheduling

from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.settings import KafkaSettings, MongoSettings
from tests.timing import scaled

if TYPE_CHECKING:
    from socket import _GetAddrInfoResult

    from _typeshed import ReadableBuffer

    SocketAddress = tuple[object, ...] | str | ReadableBuffer
    """What `socket.connect` takes: `(host, port, ...)`, a Unix path, or its bytes."""

BLOCK_THRESHOLD_ENV = "QUIPU_TEST_BLOCK_THRESHOLD"
# 2 s: on a loaded 2-core CI box aiokafka alone was seen holding the loop ~1.8 s decoding
# metadata; a real blocking call (a sync sleep, a sync client) still shows far above it.
DEFAULT_BLOCK_THRESHOLD = 2.5
"""Seconds the event loop may spend in one step before a test fails."""


MODEL_KEY_VARIABLES = ("ANTHROPIC_API_KEY", "QUIPU_MODEL_API_KEY")
"""Environment variables that would point a service at the real Messages API."""


class OffMachineConnectionError(RuntimeError):
    """Raised when a test opens a connection to an address that is not loopback."""


def refuse_off_machine(address: object) -> None:
    """Refuse an `(host, port, ...)` address whose host is not a loopback IP (Unix sockets pass)."""
    if not isinstance(address, tuple):
        return
    host = str(address[0]).split("%", 1)[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise OffMachineConnectionError(
            f"a test tried to connect to {host}: tests reach only loopback (no real model, no network)"
        )


def refuse_name_lookup(host: bytes | str | None) -> None:
    """Refuse to look up a host name other than `localhost`; IP literals pass (`connect` checks them).

    The lookup would itself leave the machine (DNS), and where there is no DNS the test would fail
    with the resolver's error instead of this guard's.
    """
    name = host.decode() if isinstance(host, bytes) else host
    if not name or name.lower() == "localhost":
        return
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        raise OffMachineConnectionError(
            f"a test tried to look up {name}: tests reach only loopback (no real model, no network)"
        ) from None


def _guard_connections() -> None:
    original_getaddrinfo = socket.getaddrinfo

    original_connect = socket.socket.connect
    original_connect_ex = socket.socket.connect_ex

    def connect(self: _socket.socket, address: SocketAddress) -> None:
        refuse_off_machine(address)
        original_connect(self, address)

    def connect_ex(self: _socket.socket, address: SocketAddress) -> int:
        refuse_off_machine(address)
        return original_connect_ex(self, address)

    def getaddrinfo(
        host: bytes | str | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,  # socket.getaddrinfo's name for it: callers may pass it by keyword
        proto: int = 0,
        flags: int = 0,
    ) -> _GetAddrInfoResult:
        refuse_name_lookup(host)
        return original_getaddrinfo(host, port, family, type, proto, flags)

    # asyncio, anyio and socket.create_connection all look it up in the socket module at call time.
    socket.getaddrinfo = getaddrinfo
    # mypy refuses any assignment to a method; replacing it for every socket is the point here.
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]


FLEET_FOLDERS = frozenset({"e2e", "chaos", "hostile"})
"""Test folders whose tests start whole service fleets in processes of their own (`quipu up`, a
fresh venv, SIGKILLs): under pytest-xdist they run one after another on one worker."""


class FleetsTogether(LoadFileScheduling):  # type: ignore[misc]  # xdist is untyped
    """`--dist loadfile`, except that the fleet folders' files are one unit of work together."""

    def _split_scope(self, nodeid: str) -> str:
        path: str = nodeid.split("::", 1)[0]
        folder = PurePosixPath(path).parts[1:2]
        return "fleets" if folder and folder[0] in FLEET_FOLDERS else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`--dist loadfile`): one unit of work per test file, so that its module
    fixtures start once, except that the fleet folders are one unit together: two fleets at once on
    two cores starve each other's deadlines, while a fleet beside the other worker's in-process tests
    does not. (xdist's `loadgroup` marks do not take under pytest 9.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    return FleetsTogether(config, log)


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout's, which reads `config.option.timeout`
def pytest_configure(config: pytest.Config) -> None:
    """Register this file's markers (the suite runs with --strict-markers); close the way out;
    stretch pytest-timeout's per-test limit by the time scale."""
    for name in MODEL_KEY_VARIABLES:
        os.environ.pop(name, None)
    _guard_connections()
    _scale_test_timeout(config)
    config.addinivalue_line(
        "markers",
        "event_loop_block_threshold(seconds): fail when the event loop blocks this long",
    )
    config.addinivalue_line("markers", "allow_event_loop_blocking: do not fail when the event loop blocks")


def _scale_test_timeout(config: pytest.Config) -> None:
    """The per-test limit (`--timeout`, else `PYTEST_TIMEOUT`, else the ini `timeout`) times the scale."""
    if not config.pluginmanager.hasplugin("timeout"):
        return
    limit = config.getoption("timeout", None) or os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout")
    if limit:
        config.option.timeout = scaled(float(limit))


# -- the embedded stack ------------------------------------------------------------------


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    """The broker and database for the whole session (`.bootstrap`, `.mongo_uri`, settings).

    Test commands (`configureFailPoint`) are on, for the fault tests.
    """
    embedded = EmbeddedStack(enable_test_commands=True)
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def quipu_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel .` builds of this checkout, once for the session (for all its workers).

    pip builds in the checkout itself (setuptools' `build/` and `*.egg-info`), so two workers of a
    pytest-xdist run must not build at once: the first builds under a lock in the run's shared
    temporary folder, the others take its wheel.
    """
    shared = _run_temporary_root(tmp_path_factory) / "wheel"
    shared.mkdir(exist_ok=True)
    with (shared / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(shared.glob("quipu-*.whl")):
            _build_wheel(shared)
    (wheel,) = shared.glob("quipu-*.whl")
    return wheel


def _build_wheel(folder: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(folder), "."],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=scaled(300), check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr


def _run_temporary_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder, shared by its xdist workers (each has a folder of its own in it)."""
    own = tmp_path_factory.getbasetemp()
    return own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own


@pytest.fixture
def unique() -> str:
    """A short name no other test uses: valid as a topic prefix, group id and database name."""
    return "q" + uuid.uuid4().hex[:12]


@pytest.fixture
async def topic_prefix(stack: EmbeddedStack, unique: str) -> AsyncIterator[str]:
    """A prefix under which every registry topic and its `.dlq` exist, for this test only."""
    prefix = f"{unique}."
    await create_topics(stack.bootstrap, prefix)
    yield prefix
    # Keeps the session's broker small; a failure here must not hide the test's outcome.
    with contextlib.suppress(Exception):
        await delete_topics(stack.bootstrap, prefix)


@pytest.fixture
def kafka_settings(stack: EmbeddedStack, topic_prefix: str) -> KafkaSettings:
    """Kafka settings for the stack's broker, isolated by this test's topic prefix."""
    return stack.kafka_settings(topic_prefix=topic_prefix)


@pytest.fixture
def mongo_settings(stack: EmbeddedStack, unique: str) -> MongoSettings:
    """MongoDB settings for the stack's server and a database named after this test."""
    return stack.mongo_settings(database=unique)


# -- the event-loop blocking guard -------------------------------------------------------


@dataclass
class Stall:
    """One stretch during which the event loop did not get back to its scheduler."""

    started: float
    seconds: float
    stack: str


class EventLoopWatchdog:
    """Notices, from a thread, when the event loop runs one step longer than `threshold`.

    A heartbeat task stamps the time every `interval`; a watchdog thread
    checks the stamp. When the loop is running but the stamp is older than
    the threshold, something holds the loop: the watchdog records the loop
    thread's stack at that moment (the culprit, not the victim). While the
    loop is not running at all (between pytest-asyncio's steps, during a sync
    test) nothing is measured, so fixture setup does not count as a stall.
    """

    def __init__(self, threshold: float, interval: float = 0.05) -> None:
        """Watch the running loop of the calling thread; call from inside it."""
        self.threshold = threshold
        self.interval = interval
        self.stalls: list[Stall] = []
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._done = threading.Event()
        self._heartbeat: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        """Start the heartbeat task and the watchdog thread."""
        self._heartbeat = self._loop.create_task(self._beat_forever())
        self._thread.start()

    async def stop(self) -> None:
        """Stop both; `stalls` is final afterwards."""
        self._done.set()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        await asyncio.to_thread(self._thread.join)

    async def _beat_forever(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self.interval)

    def _watch(self) -> None:
        quiet_since = time.monotonic()  # last moment the loop was known not to be held
        current: Stall | None = None
        while not self._done.wait(self.interval):
            now = time.monotonic()
            if not self._loop.is_running() or self._heartbeat_gone():
                quiet_since = now
            quiet_since = max(quiet_since, self._beat)
            held = now - quiet_since
            if current is None and held > self.threshold and self._waiting_in_selector():
                # The loop sits in its selector: no callback holds it, the process was starved
                # (CPU or another thread's GIL) on a busy machine. Not a stall of the loop's.
                quiet_since = now
            elif current is None and held > self.threshold:
                current = Stall(started=quiet_since, seconds=held, stack=self._loop_stack())
                self.stalls.append(current)
            elif current is not None:
                if quiet_since > current.started:  # the loop came back
                    current = None
                else:
                    current.seconds = held

    def _heartbeat_gone(self) -> bool:
        # A test that cancels every task kills the heartbeat too: measure nothing then.
        return self._heartbeat is None or self._heartbeat.done()

    def _waiting_in_selector(self) -> bool:
        frame = sys._current_frames().get(self._loop_thread)
        return (
            frame is not None
            and frame.f_code.co_name == "select"
            and os.path.basename(frame.f_code.co_filename) == "selectors.py"
        )

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"


def _block_threshold(node: pytest.Item) -> float | None:
    """The threshold for this test, or None when blocking is allowed."""
    if node.get_closest_marker("allow_event_loop_blocking") is not None:
        return None
    marker = node.get_closest_marker("event_loop_block_threshold")
    if marker is not None:
        return scaled(float(marker.args[0]))
    return scaled(float(os.environ.get(BLOCK_THRESHOLD_ENV, DEFAULT_BLOCK_THRESHOLD)))


@pytest.fixture(autouse=True)
async def _fail_on_blocked_event_loop(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail the test if the event loop was blocked longer than the threshold while it ran."""
    threshold = _block_threshold(request.node)
    if threshold is None:
        yield
        return
    watchdog = EventLoopWatchdog(threshold)
    watchdog.start()
    yield
    await watchdog.stop()
    if watchdog.stalls:
        worst = max(watchdog.stalls, key=lambda stall: stall.seconds)
        pytest.fail(
            f"the event loop was blocked for {worst.seconds:.2f} s (threshold {threshold} s; "
            f"{len(watchdog.stalls)} stall(s)). Loop thread at the time:\n{worst.stack}",
            pytrace=False,
        )
