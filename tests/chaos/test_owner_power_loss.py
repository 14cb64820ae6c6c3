"""Power loss: the storage owner and its database SIGKILLed together, mid-stream.

The owner acknowledges a command (reply, offset commit) only after its transaction committed with
`w=majority, j=True` (services/storage_owner/mongo.py TransactionPolicy). Once the offset is
committed the command is never delivered again, so a committed write the database then loses is
lost for good. Every acknowledged write must survive the database's crash.

The database here is a private SecantusDB started by `EmbeddedStack` (so exactly as the stack starts
its own, deploy/local/stack.py `_spawn_secantus`), and once more by hand with `--sync-on-commit`: SecantusDB
acknowledges journaled commits before they are on disk unless that flag is given (PLATFORM_NOTES;
tests/integration/test_mongo_store.py measured it). Both processes are killed three times while
commands stream in; both restart on the same storage; every command must be applied exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import BOOTSTRAP_ENV, FLAVOUR_ENV, EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.store_client import KafkaStore
from tests.owner_support import (
    Owner,
    RawPublisher,
    ReplyReader,
    answered,
    assert_every_answer_succeeded_and_agrees,
    assert_sessions_hold_exactly_their_records,
    database_answering,
    plan_sessions,
    wait_until_serving,
    wait_while_progressing,
)
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(scaled(300)))]

SESSIONS = 10
APPENDS = 12
CRASHES_AFTER_REPLIES = (40, 80, 120)
"""Three power losses in one stream: each one loses acknowledged commits on a database that does not
sync them (measured: about half of single crashes do), so the three together almost always do."""
STALL_S = 20.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Database:
    """A SecantusDB whose storage directory outlives its processes: killed and started again.

    `as_the_stack_starts_it`: started by `EmbeddedStack` itself (only its database), so the test
    follows whatever deploy/local/stack.py does; otherwise by hand with `--sync-on-commit`, the
    control that shows what a durable configuration does.
    """

    def __init__(self, bootstrap: str, storage: Path, *, as_the_stack_starts_it: bool) -> None:
        self.bootstrap = bootstrap
        self.storage = storage
        self.as_the_stack_starts_it = as_the_stack_starts_it
        self.uri = ""
        self._embedded: EmbeddedStack | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port = _free_port()

    async def start(self) -> None:
        """Start on the same storage; `uri` names the new process."""
        if self.as_the_stack_starts_it:
            self._embedded = EmbeddedStack(
                environ={BOOTSTRAP_ENV: self.bootstrap, FLAVOUR_ENV: "tansu"},
                mongo_storage_path=self.storage,
                create_registry_topics=False,
            )
            await self._embedded.astart()
            self.uri = self._embedded.mongo_uri
            return
        self._process = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the wait below is async
            [
                sys.executable,
                "-m",
                "secantus",
                "--host",
                "127.0.0.1",
                "--port",
                str(self._port),
                "--storage-path",
                str(self.storage),
                "--log-level",
                "WARNING",
                "--sync-on-commit",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.uri = f"mongodb://127.0.0.1:{self._port}/?retryWrites=false"
        await database_answering(self.uri)

    async def kill(self) -> None:
        """SIGKILL, and wait until the process is gone (its storage may then be reopened)."""
        if self._embedded is not None:
            for pid in self._embedded.pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            await self._embedded.astop()  # reaps the killed process, removes its work directory
            self._embedded = None
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            await asyncio.to_thread(self._process.wait)


@pytest.fixture(
    params=[
        pytest.param(True, id="as-the-embedded-stack-starts-it"),
        pytest.param(False, id="sync-on-commit"),
    ]
)
async def database(
    request: pytest.FixtureRequest, stack: EmbeddedStack, tmp_path: Path
) -> AsyncIterator[Database]:
    storage = tmp_path / "data"
    storage.mkdir()
    database = Database(stack.bootstrap, storage, as_the_stack_starts_it=request.param)
    await database.start()
    try:
        yield database
    finally:
        await database.kill()


async def test_a_power_loss_mid_stream_loses_no_acknowledged_command(
    stack: EmbeddedStack, database: Database, tmp_path: Path
) -> None:
    name = f"opl{uuid.uuid4().hex[:8]}"
    prefix = f"{name}."
    await create_topics(stack.bootstrap, prefix)
    owner = Owner(stack, prefix, name, tmp_path / "owner.log")
    owner.environment["QUIPU_MONGO_URI"] = database.uri
    settings = stack.kafka_settings(topic_prefix=prefix)
    commands_topic, replies_topic = (
        prefix + Topic.STORAGE_COMMANDS.value,
        prefix + Topic.STORAGE_REPLIES.value,
    )
    plans = plan_sessions(f"{name}-", SESSIONS, APPENDS)
    stream = [session.commands[step] for step in range(APPENDS + 3) for session in plans]
    ids = [command.correlation_id for command in stream]
    owner.start()
    try:
        async with (
            KafkaStore(settings, reply_timeout_s=scaled(10.0)) as store,
            ReplyReader(stack.bootstrap, replies_topic) as replies,
            RawPublisher(stack.bootstrap) as publisher,
        ):
            await wait_until_serving(store, owner)
            for command in stream:
                await publisher.send_command(commands_topic, command, replies_topic)
            for crash_after in CRASHES_AFTER_REPLIES:

                def reached(_: object, at: int = crash_after) -> bool:
                    return answered(replies, ids) >= at

                await replies.wait_for(reached, within=30.0)
                await owner.kill()  # the machine goes down: the owner and the database at once
                await database.kill()
                assert answered(replies, ids) < len(stream), "the crash came too late"
                await database.start()
                owner.environment["QUIPU_MONGO_URI"] = database.uri
                owner.start()
            try:
                await wait_while_progressing(
                    replies,
                    lambda: answered(replies, ids) == len(ids),
                    lambda: answered(replies, ids),
                    stall_s=STALL_S,
                )
            except AssertionError as error:
                raise AssertionError(f"{error}\nowner log:\n{owner.log_tail()}") from None
            assert_every_answer_succeeded_and_agrees(stream, replies.replies())
            await assert_sessions_hold_exactly_their_records(store, plans)
    finally:
        await owner.stop()
        with contextlib.suppress(Exception):
            await delete_topics(stack.bootstrap, prefix)
