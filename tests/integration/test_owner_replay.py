"""Replaying every command to the storage owner: each answer is the original one, nothing is written.

At-least-once delivery means any command can reach the owner again: a client resend after a reply
timeout, a redelivery after a crash before the offset commit, an operator replaying a topic. The
store makes that safe (STORE_CONTRACT §2 "exact retry", §5): a replayed write succeeds without
writing and returns the original result with `inserted=false`; a refused command is refused the
same way; a read reads the same thing.

The test drives a realistic mix of 100 commands through `KafkaStore` to a real owner process
(sessions, root and child starts, appends, a suspension and its continuation, a cancellation,
terminals of every kind, a stop start, one-shot runs, contract errors and reads), recording the
exact bytes of every command and every reply on the wire. Then it publishes the same 100 commands
again, byte for byte and with the same correlation ids, and compares the answers and the whole
database.

What may differ on a replay, by contract, and nothing else:

- `inserted` is false (§2 exact retry);
- `StartResult.run_status` is the run's *current* status and every `AppendResult.session_status`
  the session's *current* status (§3 Results: read in the same transaction);
- CreateSession of a session that has since ended is SESSION_ENDED (§6.2).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from quipu.contracts.commands import (
    AppendRunRecord,
    CreateSession,
    EndSession,
    ListRunRecords,
    ListRunsBySession,
    ListSessionRunRecords,
    LoadRun,
    LoadRunSuspension,
    LoadSessionStatus,
    PurgeSession,
    RecordRunCancellation,
    RecordRunSuspension,
    RecordRunTerminal,
    StartChildRun,
    StartOneShotChildRun,
    StartOneShotRun,
    StartRootRun,
    StoreOperation,
)
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.lifecycle import Failure
from quipu.contracts.store import CancellationReason, Record, RunStart, RunStatus, StartOutcome
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from tests.conformance.builders import (
    child_start,
    intent,
    ms,
    one_shot,
    one_shot_child,
    ordinary,
    root_start,
    snapshot,
    suspension,
    terminal,
    uid,
)
from tests.owner_support import (
    RawPublisher,
    ReplyReader,
    Served,
    TopicReader,
    database_dump,
    mongo_client,
)

pytestmark = pytest.mark.slow

COMMANDS = 100

STARTS = (StartRootRun, StartChildRun, StartOneShotRun, StartOneShotChildRun)
WRITES = (
    *STARTS,
    AppendRunRecord,
    RecordRunCancellation,
    RecordRunSuspension,
    RecordRunTerminal,
)


@pytest.fixture
async def served(stack: EmbeddedStack, tmp_path: Any) -> AsyncIterator[Served]:
    """An owner process on a prefix and database of this test's own."""
    name = f"orep{uuid.uuid4().hex[:8]}"
    async with Served(stack, f"{name}.", name, tmp_path / "owner.log") as served:
        yield served


class Mix:
    """Sends the scenario's commands one by one, checking each answer as a worker would."""

    def __init__(self, served: Served) -> None:
        self.store = served.store
        self.sent: list[StoreOperation] = []
        self.runs: set[str] = set()
        self.sessions: set[str] = set()

    async def ok(self, command: StoreOperation) -> Any:
        """Send; the command must succeed."""
        command = command.model_copy(update={"correlation_id": f"mix-{len(self.sent):03d}-{uid('c')}"})
        self.sent.append(command)
        return await self.store.call(command)

    async def refused(self, code: ErrorCode, command: StoreOperation) -> None:
        """Send; the command must be refused with `code`."""
        with pytest.raises(StoreError) as caught:
            await self.ok(command)
        assert caught.value.code is code, f"{command.op}: expected {code}, got {caught.value}"

    async def root(self, start: tuple[RunStart, Record, Record], decision: StartOutcome) -> RunStart:
        run, started, stopped = start
        result = await self.ok(StartRootRun(run=run, started=started, stopped=stopped))
        assert result.decision is decision and result.started.inserted
        self.runs.add(run.run_id)
        return run

    async def child(self, start: tuple[RunStart, Record, Record, Record]) -> RunStart:
        run, link, started, stopped = start
        result = await self.ok(StartChildRun(run=run, parent_link=link, started=started, stopped=stopped))
        assert result.decision is StartOutcome.PROCEED and result.parent_link.inserted
        self.runs.add(run.run_id)
        return run

    async def append(self, record: Record, *, inserted: bool = True) -> str:
        result = await self.ok(AppendRunRecord(record=record))
        assert result.inserted is inserted
        record_id: str = result.record_id
        return record_id

    async def appends(self, run: RunStart, count: int, at: int) -> None:
        kinds = [
            ("run_phase_changed", b'{"phase":"planning"}'),
            ("tool_start", b'{"tool":"search","args":{"q":"caf\xc3\xa9 \xe2\x9c\x93"}}'),
            ("tool_end", b'{"tool":"search","result":[1,2.50,"x"]}'),
            (
                "transcript_messages_appended",
                b'[{"role":"assistant","parts":[{"kind":"text","text":"h\xc3\xa9llo"}]}]',
            ),
            ("usage", b'{"input_tokens":12,"output_tokens":3}'),
        ]
        for n in range(count):
            kind, payload = kinds[n % len(kinds)]
            await self.append(
                ordinary(run, f"{kind}-{at + n}", record_type=kind, payload=payload, timestamp=ms(at + n))
            )


async def drive(mix: Mix) -> None:
    """The 100 commands, in five acts."""
    session_a = await suspension_and_continuation(mix)  # 1-52
    root_b = await session_ending_under_a_running_child(mix)  # 53-67
    one_shot_child_run = await one_shot_runs(mix)  # 68-84
    await stable_refusals(mix, session_a, root_b, one_shot_child_run)  # 85-93
    await refused_purge(mix)  # 94-100


async def suspension_and_continuation(mix: Mix) -> dict[str, Any]:
    """Session A: a root with a child, a suspension and its continuation, a cancellation, an end."""
    sa = uid("sa")
    mix.sessions.add(sa)
    await mix.ok(CreateSession(session_id=sa, created_at=ms(0)))  # 1
    root_a = await mix.root(root_start(sa, labels={"tier": "gold"}, turn_id="t1"), StartOutcome.PROCEED)  # 2
    await mix.appends(root_a, 8, at=10)  # 3-10
    first_record = ordinary(
        root_a,
        "run_phase_changed-10",
        record_type="run_phase_changed",
        payload=b'{"phase":"planning"}',
        timestamp=ms(10),
    )
    child_a = await mix.child(child_start(sa, root_a, tool_call_id="call-1"))  # 11
    await mix.appends(child_a, 5, at=30)  # 12-16
    assert (await mix.ok(RecordRunTerminal(record=terminal(child_a)))).inserted  # 17
    await mix.refused(ErrorCode.RUN_NOT_ACTIVE, AppendRunRecord(record=ordinary(child_a, "late")))  # 18
    await mix.refused(  # 19: same key, other content
        ErrorCode.EVENT_CONFLICT, AppendRunRecord(record=first_record.model_copy(update={"payload": b"{}"}))
    )
    assert await mix.append(first_record, inserted=False) == "2"  # 20: an exact retry within the mix
    checkpoint, suspended = suspension(root_a, data=b"\x00\xffcheckpoint\x80")
    assert (await mix.ok(RecordRunSuspension(checkpoint=checkpoint, record=suspended))).inserted  # 21
    assert await mix.ok(LoadRunSuspension(run_id=root_a.run_id)) == checkpoint  # 22
    await mix.refused(ErrorCode.RUN_NOT_ACTIVE, AppendRunRecord(record=ordinary(root_a, "after")))  # 23
    cont_a = await mix.root(  # 24
        root_start(sa, predecessor_run_id=root_a.run_id, started_at=ms(100)), StartOutcome.PROCEED
    )
    loser, loser_started, loser_stopped = root_start(sa, predecessor_run_id=root_a.run_id, started_at=ms(101))
    await mix.refused(  # 25: one successor only
        ErrorCode.RUN_CONFLICT, StartRootRun(run=loser, started=loser_started, stopped=loser_stopped)
    )
    await mix.appends(cont_a, 6, at=110)  # 26-31
    child_a2 = await mix.child(child_start(sa, cont_a, tool_call_id="call-2", started_at=ms(120)))  # 32
    boom = Failure(message="boom", kind="tool", retryable=True)
    failed = terminal(child_a2, RunStatus.FAILED, failure=boom)
    assert (await mix.ok(RecordRunTerminal(record=failed))).inserted  # 33
    assert (await mix.ok(RecordRunCancellation(record=intent(cont_a)))).inserted  # 34
    await mix.refused(  # 35
        ErrorCode.RUN_CANCELLATION_CONFLICT,
        RecordRunCancellation(record=intent(cont_a, CancellationReason.ENGINE_CANCELED)),
    )
    canceled = terminal(cont_a, RunStatus.CANCELED, reason=CancellationReason.USER_REQUESTED)
    assert (await mix.ok(RecordRunTerminal(record=canceled))).inserted  # 36
    await mix.refused(  # 37
        ErrorCode.RUN_TERMINAL_CONFLICT, RecordRunTerminal(record=terminal(cont_a, key="terminal-2"))
    )
    await mix.ok(EndSession(session_id=sa, ended_at=ms(200)))  # 38
    await mix.refused(ErrorCode.SESSION_ENDED, CreateSession(session_id=sa, created_at=ms(201)))  # 39
    await mix.root(root_start(sa, started_at=ms(202)), StartOutcome.STOP)  # 40
    await mix.refused(  # 41: the parent is suspended
        ErrorCode.RUN_NOT_ACTIVE, StartChildRun(**child_start(sa, root_a, tool_call_id="call-9")._asdict())
    )
    for run_id in (root_a.run_id, cont_a.run_id):
        await mix.ok(LoadRun(run_id=run_id))  # 42-43
    await mix.ok(LoadRun(run_id=child_a2.run_id))  # 44
    await mix.ok(LoadSessionStatus(session_id=sa))  # 45
    assert len(await mix.ok(ListRunsBySession(session_id=sa))) == 5  # 46
    assert len(await mix.ok(ListRunsBySession(session_id=sa, statuses=[RunStatus.CANCELED]))) == 2  # 47
    page = await mix.ok(ListRunRecords(run_id=root_a.run_id, limit=4))  # 48
    await mix.ok(ListRunRecords(run_id=root_a.run_id, cursor=page.next_cursor, limit=4))  # 49
    await mix.ok(ListSessionRunRecords(session_id=sa, limit=500))  # 50
    session_page = await mix.ok(ListSessionRunRecords(session_id=sa, limit=10))  # 51
    await mix.ok(ListSessionRunRecords(session_id=sa, cursor=session_page.next_cursor, limit=10))  # 52
    return {"session_id": sa, "root": root_a, "cursor": page.next_cursor}


async def session_ending_under_a_running_child(mix: Mix) -> RunStart:
    """Session B: the session ends while a child still runs; the child writes on and closes."""
    sb = uid("sb")
    mix.sessions.add(sb)
    await mix.ok(CreateSession(session_id=sb, created_at=ms(300)))  # 53
    root_b = await mix.root(root_start(sb, started_at=ms(301)), StartOutcome.PROCEED)  # 54
    child_b = await mix.child(child_start(sb, root_b, started_at=ms(302)))  # 55
    await mix.appends(child_b, 3, at=310)  # 56-58
    await mix.ok(EndSession(session_id=sb, ended_at=ms(320)))  # 59
    await mix.ok(EndSession(session_id=sb, ended_at=ms(321)))  # 60: the first ended_at stays
    await mix.appends(child_b, 2, at=330)  # 61-62
    assert (await mix.ok(RecordRunTerminal(record=terminal(child_b, timestamp=ms(340))))).session_status == (
        "ended"
    )  # 63
    engine = terminal(root_b, RunStatus.CANCELED, reason=CancellationReason.ENGINE_CANCELED)
    assert (await mix.ok(RecordRunTerminal(record=engine))).inserted  # 64
    await mix.ok(LoadRun(run_id=child_b.run_id))  # 65
    await mix.ok(ListSessionRunRecords(session_id=sb, limit=500))  # 66
    await mix.ok(ListRunsBySession(session_id=sb, statuses=[RunStatus.COMPLETED]))  # 67
    return root_b


async def one_shot_runs(mix: Mix) -> RunStart:
    """Sessionless runs: a one-shot root and its child."""
    o1_run, o1_started = one_shot(started_at=ms(400))
    await mix.ok(StartOneShotRun(run=o1_run, started=o1_started))  # 68
    mix.runs.add(o1_run.run_id)
    await mix.appends(o1_run, 5, at=410)  # 69-73
    oc1_run, oc1_link, oc1_started = one_shot_child(o1_run, started_at=ms(420))
    await mix.ok(StartOneShotChildRun(run=oc1_run, parent_link=oc1_link, started=oc1_started))  # 74
    mix.runs.add(oc1_run.run_id)
    await mix.appends(oc1_run, 2, at=430)  # 75-76
    assert (await mix.ok(RecordRunTerminal(record=terminal(oc1_run, RunStatus.FAILED)))).inserted  # 77
    o1_terminal = terminal(o1_run, timestamp=ms(450))
    assert (await mix.ok(RecordRunTerminal(record=o1_terminal))).inserted  # 78
    assert not (await mix.ok(RecordRunTerminal(record=o1_terminal))).inserted  # 79: exact retry
    await mix.refused(  # 80: lifecycle types only through lifecycle operations
        ErrorCode.INVALID_ARGUMENT, AppendRunRecord(record=ordinary(o1_run, "x", record_type="run_started"))
    )
    oc2_run, oc2_link, oc2_started = one_shot_child(o1_run, tool_call_id="call-2", started_at=ms(460))
    await mix.refused(  # 81: the parent has closed
        ErrorCode.RUN_NOT_ACTIVE, StartOneShotChildRun(run=oc2_run, parent_link=oc2_link, started=oc2_started)
    )
    await mix.ok(LoadRun(run_id=o1_run.run_id))  # 82
    await mix.ok(ListRunRecords(run_id=o1_run.run_id, limit=100))  # 83
    await mix.ok(ListRunRecords(run_id=oc1_run.run_id, limit=100))  # 84
    return oc1_run


async def stable_refusals(mix: Mix, session_a: dict[str, Any], root_b: RunStart, oc1_run: RunStart) -> None:
    """Contract errors that no later command changes, and an exact retry of a closed run's start."""
    sa, root_a, cursor = session_a["session_id"], session_a["root"], session_a["cursor"]
    await mix.refused(ErrorCode.SESSION_NOT_FOUND, LoadSessionStatus(session_id=uid("nosuch")))  # 85
    ghost, ghost_started, ghost_stopped = root_start(uid("nosuch"))
    await mix.refused(  # 86
        ErrorCode.SESSION_NOT_FOUND, StartRootRun(run=ghost, started=ghost_started, stopped=ghost_stopped)
    )
    await mix.refused(ErrorCode.RUN_NOT_FOUND, LoadRun(run_id=uid("nosuch")))  # 87
    await mix.refused(  # 88
        ErrorCode.RUN_NOT_FOUND, AppendRunRecord(record=ordinary(root_start(sa).run, "orphan"))
    )
    altered = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    await mix.refused(  # 89
        ErrorCode.INVALID_CURSOR, ListRunRecords(run_id=root_a.run_id, cursor=altered, limit=4)
    )
    checkpoint_b, suspended_b = suspension(root_b)
    await mix.refused(  # 90
        ErrorCode.RUN_TERMINAL_CONFLICT, RecordRunSuspension(checkpoint=checkpoint_b, record=suspended_b)
    )
    moved = root_start(sa, run_id=root_a.run_id, labels={"tier": "gold"}, turn_id="t1", started_at=ms(5))
    await mix.refused(  # 91: a later started_at is another start
        ErrorCode.RUN_CONFLICT, StartRootRun(run=moved.run, started=moved.started, stopped=moved.stopped)
    )
    again = root_start(sa, run_id=root_a.run_id, labels={"tier": "gold"}, turn_id="t1")
    result = await mix.ok(StartRootRun(run=again.run, started=again.started, stopped=again.stopped))  # 92
    assert result.started.record_id == "1" and not result.started.inserted
    assert result.run_status is RunStatus.SUSPENDED
    await mix.refused(ErrorCode.RUN_SUSPENSION_NOT_FOUND, LoadRunSuspension(run_id=oc1_run.run_id))  # 93


async def refused_purge(mix: Mix) -> None:
    """Session C: a purge refused while a run is still running."""
    sc = uid("sc")
    mix.sessions.add(sc)
    await mix.ok(CreateSession(session_id=sc, created_at=ms(500)))  # 94
    root_c = await mix.root(root_start(sc, started_at=ms(501)), StartOutcome.PROCEED)  # 95
    await mix.appends(root_c, 2, at=510)  # 96-97
    await mix.ok(EndSession(session_id=sc, ended_at=ms(520)))  # 98
    await mix.refused(ErrorCode.SESSION_HAS_ACTIVE_RUNS, PurgeSession(session_id=sc))  # 99
    assert len(await mix.ok(ListRunsBySession(session_id=sc, statuses=[RunStatus.RUNNING]))) == 1  # 100


def expected_on_replay(
    command: StoreOperation, original: dict[str, Any], runs: dict[str, str], sessions: dict[str, str]
) -> dict[str, Any]:
    """The reply a replay must get: the original one, with only what the contract lets differ."""
    expected = copy.deepcopy(original)
    if isinstance(command, CreateSession) and sessions.get(command.session_id) == "ended":
        return {
            **expected,
            "result": None,
            "error": {"code": "SESSION_ENDED", "message": ANY_MESSAGE, "retryable": False},
        }
    if expected["error"] is not None or not isinstance(command, WRITES):
        return expected
    owner = command.run if isinstance(command, STARTS) else command.record
    session_status = sessions.get(owner.session_id, "")
    result = expected["result"]
    parts = ("started", "parent_link", "stopped")
    appends = [result] if "record_id" in result else [result[name] for name in parts]
    for append in appends:
        if append is not None:
            append["inserted"] = False
            append["session_status"] = session_status
    if "run_status" in result:
        assert isinstance(command, STARTS), "only a start's reply carries a run status"
        result["run_status"] = runs[command.run.run_id]
    return expected


ANY_MESSAGE = object()


def same_reply(replayed: dict[str, Any], expected: dict[str, Any]) -> bool:
    if expected.get("error") and expected["error"].get("message") is ANY_MESSAGE:
        error = dict(replayed.get("error") or {})
        error.pop("message", None)
        wanted = dict(expected["error"])
        wanted.pop("message")
        return error == wanted and replayed.get("result") is None
    return replayed == expected


async def test_replaying_every_command_returns_the_original_answers_and_writes_nothing(
    stack: EmbeddedStack, served: Served
) -> None:
    replies_topic = served.topic(Topic.STORAGE_REPLIES.value)
    mix = Mix(served)
    async with (
        ReplyReader(stack.bootstrap, replies_topic) as replies,
        TopicReader(stack.bootstrap, served.topic(Topic.STORAGE_COMMANDS.value)) as wire,
    ):
        # The replays answer on a partition of the replies topic the originals (the client's) never used.
        assert served.store.reply_partition is not None
        replay_partition = (served.store.reply_partition + 1) % len(replies.partitions)
        await drive(mix)
        assert len(mix.sent) == COMMANDS
        ids = [command.correlation_id for command in mix.sent]
        await replies.wait_for_replies(ids)
        await wire.wait_for(lambda records: len(_of_the_mix(records, ids)) >= COMMANDS)
    originals = replies.replies()
    assert all(len(originals[cid]) == 1 for cid in ids), "no command was resent during the mix"
    copies = _of_the_mix(wire.records, ids)
    sent_bytes = {json.loads(record.value)["correlation_id"]: record for record in copies}
    assert len(sent_bytes) == COMMANDS == len(copies)
    for command in mix.sent:  # what KafkaStore put on the wire is the command, byte for byte
        assert sent_bytes[command.correlation_id].value == command.model_dump_json().encode()

    runs = {run_id: (await served.store.load_run(run_id)).status.value for run_id in mix.runs}
    sessions = {
        session_id: (await served.store.load_session_status(session_id)).status.value
        for session_id in mix.sessions
    }
    client = mongo_client(stack)
    try:
        database_before = await database_dump(client, served.database)
        view_before = await snapshot(served.store, runs=sorted(mix.runs), sessions=sorted(mix.sessions))
        assert len(database_before["records"]) > 50 and len(database_before["runs"]) == len(mix.runs)

        async with (
            ReplyReader(stack.bootstrap, replies_topic, only=[replay_partition]) as replayed,
            RawPublisher(stack.bootstrap) as publisher,
        ):
            for command in mix.sent:
                record = sent_bytes[command.correlation_id]
                await publisher.send_command(
                    served.topic(Topic.STORAGE_COMMANDS.value),
                    record.value,
                    replies_topic,
                    key=(record.key or b"").decode(),
                    reply_partition=replay_partition,
                )
            await replayed.wait_for_replies(ids, within=30.0)
        answers = replayed.replies()

        mismatches = []
        for number, command in enumerate(mix.sent, start=1):
            [original] = originals[command.correlation_id]
            expected = expected_on_replay(command, original, runs, sessions)
            [answer] = answers[command.correlation_id]
            if not same_reply(answer, expected):
                mismatches.append(f"#{number} {command.op}:\n  replayed {answer}\n  expected {expected}")
        assert not mismatches, f"{len(mismatches)} replies differ:\n" + "\n".join(mismatches)

        # Nothing was written: every document is as it was, and the store shows the same.
        assert await database_dump(client, served.database) == database_before
        view_after = await snapshot(served.store, runs=sorted(mix.runs), sessions=sorted(mix.sessions))
        assert view_after == view_before
    finally:
        await client.close()

    # The answers really were exact retries, not look-alikes: same ids, nothing inserted.
    writes = [cid for cid, command in zip(ids, mix.sent, strict=True) if isinstance(command, WRITES)]
    inserted = [answers[cid][0]["result"] for cid in writes if answers[cid][0]["error"] is None]
    assert inserted and not any(_inserted_anywhere(result) for result in inserted)


def _of_the_mix(records: list[Any], ids: list[str]) -> list[Any]:
    """The records of `storage.commands` that carry one of the mix's correlation ids."""
    wanted = set(ids)
    return [record for record in records if json.loads(record.value).get("correlation_id") in wanted]


def _inserted_anywhere(result: dict[str, Any]) -> bool:
    if "record_id" in result:
        return bool(result["inserted"])
    parts = ("started", "parent_link", "stopped")
    return any(result.get(name) and result[name]["inserted"] for name in parts)
