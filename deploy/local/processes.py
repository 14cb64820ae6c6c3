"""The embedded stack's server processes: each started in a process group of its own that dies
with its parent, reaped (SIGTERM, then SIGKILL), on a free loopback port, and waited for until
it answers."""

from __future__ import annotations

import asyncio
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
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

# Through a standard logger: silent below WARNING until the application configures
# logging (quipu.services.kit.logging), instead of structlog's default print to stdout.
log = structlog.wrap_logger(logging.getLogger(__name__))
_POLL_SECONDS = 0.02
_LOG_TAIL_BYTES = 4000
WORKDIR_PREFIX = "quipu-stack-"
OWNER_FILE = "owner.pid"

T = TypeVar("T")


@dataclass
class Child:
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


def free_port() -> int:
    """A loopback port free right now (another process may still take it: callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def remove_stale_workdirs() -> None:
    """Remove the temporary directories of stacks whose process died without stopping them."""
    for workdir in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text())
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


def spawn(name: str, argv: Sequence[str], log_path: Path, port: int) -> Child:
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
    return Child(name=name, process=process, port=port, log_path=log_path)


def reap_child(child: Child, timeout: float) -> None:
    """Wait for a child sent SIGTERM; SIGKILL its process group if it takes too long."""
    try:
        child.process.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("embedded_stack.kill", server=child.name, pid=child.process.pid)
        signal_group(child, signal.SIGKILL)
        child.process.wait(timeout)
    # Grandchildren (none today) would still hold the group: make sure they go too.
    signal_group(child, signal.SIGKILL)


def signal_group(child: Child, signum: signal.Signals) -> None:
    """Signal the child's whole process group; a group that is gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, signum)


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
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


async def until(deadline: float, attempt: Callable[[], Awaitable[bool]]) -> None:
    """Call `attempt` until it returns True; raise TimeoutError at `deadline` (monotonic)."""
    while not await attempt():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(_POLL_SECONDS)


async def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback port."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def listening_or_dead(child: Child) -> bool:
    """True once the child listens on its port, or has exited."""
    return child.process.poll() is not None or await port_open(child.port)


async def kafka_answers(bootstrap: str) -> bool:
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


async def mongo_answers(uri: str) -> bool:
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
