"""The storage owner killed mid-stream: every command is still applied exactly once.

The owner commits a command's offset only after the write committed and the reply was published
(services/kit/delivery.py), so a SIGKILL can only make it apply a command *again* — never skip
one — and the store turns that second application into an exact retry. Clients whose commands
went unanswered resend them, identical, as `KafkaStore` does after a reply timeout.

The test fires 300 writes for 20 sessions (create, start, 12 appends, terminal each) at a real owner
process, SIGKILLs it part-way, resends what was unanswered in half of the sessions (the other half
must be recovered by redelivery alone), starts a new owner, waits until every command has an
answer, and reads back: each run holds exactly its 14 records with gapless ids 1..14
in order, no duplicate and none missing, and the database holds nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quipu.contracts.commands import AppendRunRecord
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.store_client import KafkaStore
from tests.conformance.builders import (
    all_run_records,
    ms,
    ordinary,
    root_start,
)
from tests.owner_support import (
    Owner,
    RawPublisher,
    ReplyReader,
    answered,
    assert_every_answer_succeeded_and_agrees,
    assert_sessions_hold_exactly_their_records,
    mongo_client,
    plan_sessions,
    wait_until_serving,
    wait_while_progressing,
)
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(scaled(300)))]

SESSIONS = 20
APPENDS = 12
COMMANDS_PER_SESSION = APPENDS + 3  # create, start, appends, terminal
KILL_AFTER_REPLIES = 100
STALL_S = 20.0
"""The restarted owner must answer something new at least this often until it has caught up (the
join alone takes 2-3 s; a transaction the kill orphaned holds a partition for the server's
transaction lifetime: 60 s on mongod and SecantusDB by default, see the last test)."""
ORPHAN_BUDGET_S = 30.0
"""From the restart to the answer of the one command whose transaction the kill orphaned."""


@dataclass
class Crashable:
    """An owner process that can be killed and started again, on a prefix and database of its own."""

    stack: EmbeddedStack
    prefix: str
    database: str
    owner: Owner

    def topic(self, name: str) -> str:
        return self.prefix + name


@pytest.fixture
async def crashable(stack: EmbeddedStack, tmp_path: Path) -> AsyncIterator[Crashable]:
    name = f"ocr{uuid.uuid4().hex[:8]}"
    prefix = f"{name}."
    await create_topics(stack.bootstrap, prefix)
    owner = Owner(stack, prefix, name, tmp_path / "owner.log", mongo_app_name=f"owner-{name}")
    try:
        yield Crashable(stack, prefix, name, owner)
    finally:
        await owner.stop()
        with contextlib.suppress(Exception):
            await delete_topics(stack.bootstrap, prefix)


async def test_sigkill_mid_stream_applies_every_command_exactly_once(crashable: Crashable) -> None:
    stack, settings = crashable.stack, crashable.stack.kafka_settings(topic_prefix=crashable.prefix)
    commands_topic = crashable.topic(Topic.STORAGE_COMMANDS.value)
    replies_topic = crashable.topic(Topic.STORAGE_REPLIES.value)
    plans = plan_sessions(f"{crashable.database}-", SESSIONS, APPENDS)
    # Sessions interleaved, as many workers would send them; each session's own order kept.
    stream = [session.commands[step] for step in range(COMMANDS_PER_SESSION) for session in plans]
    ids = [command.correlation_id for command in stream]
    assert len(stream) == SESSIONS * COMMANDS_PER_SESSION == 300

    began = time.monotonic()
    crashable.owner.start()
    async with (
        KafkaStore(settings, reply_timeout_s=scaled(10.0)) as store,
        ReplyReader(stack.bootstrap, replies_topic) as replies,
        RawPublisher(stack.bootstrap) as publisher,
    ):
        await wait_until_serving(store, crashable.owner)
        first_pid = crashable.owner.pid

        async def fire() -> None:
            for command in stream:
                await publisher.send_command(commands_topic, command, replies_topic)

        firing = asyncio.create_task(fire())
        await replies.wait_for(lambda _: answered(replies, ids) >= KILL_AFTER_REPLIES, within=30.0)
        await crashable.owner.kill()
        answered_at_kill = answered(replies, ids)
        await firing
        assert 0 < answered_at_kill < len(stream), f"the kill was not mid-stream ({answered_at_kill})"

        # The clients of half the sessions time out and resend what went unanswered, byte for byte
        # (duplicates the store must absorb); the other half's commands must come back by
        # redelivery alone (nothing consumed may be lost).
        await asyncio.sleep(0.2)  # replies the owner published just before dying
        resending = {session.session_id for session in plans[::2]}
        unanswered = [
            command
            for command in stream
            if command.correlation_id not in replies.replies() and command.partition_key() in resending
        ]
        for command in unanswered:
            await publisher.send_command(commands_topic, command, replies_topic)

        crashable.owner.start()
        assert crashable.owner.pid != first_pid
        resent_ids = {command.correlation_id for command in unanswered}
        wanted = {cid: 2 if cid in resent_ids else 1 for cid in ids}  # a copy, an answer

        def all_answered(_: object) -> bool:
            received = replies.replies()
            return all(len(received.get(cid, ())) >= count for cid, count in wanted.items())

        def answers_so_far() -> int:
            return sum(len(answers) for answers in replies.replies().values())

        try:
            await wait_while_progressing(replies, lambda: all_answered(None), answers_so_far, stall_s=STALL_S)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{_diagnosis(crashable.owner)}") from None
        elapsed = time.monotonic() - began

        answers = replies.replies()
        assert_every_answer_succeeded_and_agrees(stream, answers)
        resent = sum(len(answers[cid]) for cid in ids) - len(ids)
        await assert_sessions_hold_exactly_their_records(store, plans)

    client = mongo_client(stack)
    try:
        database = client[crashable.database]
        assert await database["sessions"].count_documents({}) == SESSIONS
        assert await database["runs"].count_documents({}) == SESSIONS
        assert await database["records"].count_documents({}) == SESSIONS * (APPENDS + 2)
    finally:
        await client.close()
    print(
        f"\n{len(stream)} commands, killed after {answered_at_kill} answers, {len(unanswered)} resent, "
        f"{resent} extra answers, {elapsed:.1f} s"
    )


def _diagnosis(owner: Owner) -> str:
    """Why the restarted owner did not catch up, from its log."""
    log = owner.log_tail(20_000)
    if "WriteConflict" in log and "retries exhausted" in log:
        return (
            "the restarted owner keeps meeting WriteConflict: a transaction the killed owner left open "
            "still holds its documents (the server reaps it only after its 60 s lifetime), and the "
            "partition is stalled behind it. Owner log (end):\n" + log[-3000:]
        )
    return "owner log (end):\n" + log[-3000:]


async def test_a_transaction_left_open_by_the_kill_does_not_stall_the_next_owner(
    crashable: Crashable,
) -> None:
    """A SIGKILL inside a transaction: the next owner must not wait for the server to reap it.

    MongoDB (transactionLifetimeLimitSeconds) and SecantusDB keep a transaction whose client died
    open for 60 s, and a closed connection does not abort it. A failpoint holds the owner's write
    of the record (the transaction's last statement) long enough to kill the owner inside it.
    """
    stack, settings = crashable.stack, crashable.stack.kafka_settings(topic_prefix=crashable.prefix)
    commands_topic = crashable.topic(Topic.STORAGE_COMMANDS.value)
    replies_topic = crashable.topic(Topic.STORAGE_REPLIES.value)
    app_name = f"owner-{crashable.database}"
    crashable.owner.start()
    client = mongo_client(stack)
    try:
        async with (
            KafkaStore(settings, reply_timeout_s=scaled(10.0)) as store,
            ReplyReader(stack.bootstrap, replies_topic) as replies,
            RawPublisher(stack.bootstrap) as publisher,
        ):
            await wait_until_serving(store, crashable.owner)
            session_id = f"{crashable.database}-held"
            await store.create_session(session_id, ms(0))
            run = root_start(session_id, run_id=f"{session_id}-run")
            await store.start_root_run(*run)
            append = AppendRunRecord(record=ordinary(run.run, "held"), correlation_id=f"{session_id}-append")

            await client.admin.command(
                {
                    "configureFailPoint": "failCommand",
                    "mode": {"times": 1},
                    "data": {
                        "failCommands": ["bulkWrite"],
                        "blockConnection": True,
                        "blockTimeMS": 1500,
                        "appName": app_name,
                    },
                }
            )
            await publisher.send_command(commands_topic, append, replies_topic)
            await asyncio.sleep(0.7)  # the owner is inside the transaction, its write held
            await crashable.owner.kill()
            await asyncio.sleep(1.2)  # the held write runs: the transaction is open, its client gone

            restarted = time.monotonic()
            crashable.owner.start()
            try:
                await replies.wait_for_replies([append.correlation_id], within=ORPHAN_BUDGET_S)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{_diagnosis(crashable.owner)}") from None
            recovered = time.monotonic() - restarted
            [answer] = replies.replies()[append.correlation_id]
            assert answer["error"] is None and answer["result"]["record_id"] == "2", answer
            records = await all_run_records(store, run.run.run_id)
            assert [(record.id, record.event_key) for record in records] == [("1", "started"), ("2", "held")]
            print(f"\nrecovered {recovered:.1f} s after the restart")
    finally:
        await client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
        await client.close()
