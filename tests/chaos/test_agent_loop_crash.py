"""The agent loop survives a SIGKILLed planner or tool executor in the middle of a run.

Every service is its own process (tests/e2e/agent_support.py) on the embedded broker and
database: the storage owner, the planner (scripted model) and the tool executor, whose tools
are the shipped ones wrapped to journal each execution and to make the calculator take
1.2 s, so a kill lands while calls are in flight rather than wherever the clock puts it.

A run asks for three tools at once (`calculate 1+1; calculate 2+2; note k=<v>`). A process is
killed outright (no shutdown, no commit) at a chosen moment and started again (or another copy
takes over); the run must still complete, and what a user and the model see must be as if
nothing happened:

- the transcript rebuilds from the run log and passes ValidatePlannerTranscript, each tool use
  answered by exactly one tool result, in use order, in the very next message;
- one `tool-result/<id>` record per use, one terminal record, two model steps (no step asked
  twice, none lost);
- the executor's journal shows each tool of the run executed once when only the planner died:
  the `notes set` effect happened once (and a later turn recalls it);
- the store closed the run after the kill (LoadRun.updated_at), so the new process finished it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

from quipu.contracts.events import StreamEventType
from quipu.contracts.lifecycle import decode_run_completed
from quipu.contracts.store import LifecycleType, RunStatus
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.domain.transcript import build_messages_from_run_log, validate_planner_transcript
from quipu.services.planner.logic.keys import TOOL_RESULT_TYPE
from quipu.services.planner.logic.view import final_text
from tests.e2e.agent_support import (
    Deployment,
    assert_each_use_has_one_result,
    eventually,
    terminal_workflow,
    tool_uses,
)
from tests.owner_support import TopicReader

pytestmark = pytest.mark.slow

CALCULATOR_DELAY_S = 1.2
"""Long enough for a kill to land while a calculator call runs; within the tool's 2 s deadline."""

PIPELINE_STARTS_ENV = "QUIPU_PLANNER_PIPELINE_STARTS"

RECOVERY_S = 45.0
"""From a restart to the run's end: process start, the dead member's session timeout, joins."""


@pytest.fixture(scope="module")
async def deployment(
    stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    name = f"crash{uuid.uuid4().hex[:8]}"
    async with Deployment(
        stack,
        f"{name}.",
        name,
        tmp_path_factory.mktemp("agent-loop-crash"),
        tool_delays={"calculator": CALCULATOR_DELAY_S},
    ) as deployment:
        started = time.monotonic()
        session = await deployment.session()
        warm = await deployment.turn(session, "what time is it")  # every service answered once
        await deployment.until_closed(warm.run_id, within=RECOVERY_S)
        print(f"deployment serving after {time.monotonic() - started:.1f} s")
        yield deployment


async def assert_finished_cleanly(deployment: Deployment, run_id: str, killed_at: datetime) -> list[str]:
    """The run completed after the kill with one result per use; returns its tool_use ids."""
    events = await deployment.until_closed(run_id, within=RECOVERY_S)
    workflow = terminal_workflow(events)
    assert workflow.payload["phase"] == "completed", (workflow.payload, deployment.logs())
    meta = await deployment.store.load_run(run_id)
    assert meta.status is RunStatus.COMPLETED
    assert meta.updated_at > killed_at, "the run was closed before the kill: the kill missed the middle"

    messages = await build_messages_from_run_log(deployment.store, run_id)
    validate_planner_transcript(messages)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    uses = tool_uses(messages)
    assert [use.name for use in uses] == ["calculator", "calculator", "notes"]
    assert_each_use_has_one_result(messages)

    records = await deployment.records(run_id)
    keys = [record.event_key for record in records]
    assert len(keys) == len(set(keys))
    assert sorted(r.event_key for r in records if r.type == TOOL_RESULT_TYPE) == sorted(
        f"tool-result/{use.id}" for use in uses
    )
    terminals = [r for r in records if r.type == LifecycleType.RUN_COMPLETED.value]
    assert [r.event_key for r in terminals] == ["completed"]
    assert decode_run_completed(terminals[0].payload).run_status is RunStatus.COMPLETED
    assert [k for k in keys if k.endswith("/assistant")] == ["step/1/assistant", "step/2/assistant"]
    for record in records:
        if record.event_key.endswith("/assistant"):
            [assistant] = json.loads(record.payload)
            assert assistant["meta"]["usage"]["output_tokens"] > 0, record.event_key
    return [use.id for use in uses]


# --- the planner ------------------------------------------------------------------------------------


def _assistant_turn_seen(deployment: Deployment, run_id: str) -> bool:
    return any(e.type is StreamEventType.ASSISTANT_TURN for e in deployment.run_events(run_id))


def _executing_tools_seen(deployment: Deployment, run_id: str) -> bool:
    return any(
        e.type is StreamEventType.WORKFLOW and e.payload.get("phase") == "executing_tools"
        for e in deployment.run_events(run_id)
    )


def _calculator_answered(deployment: Deployment, run_id: str) -> bool:
    return any(e.tool == "calculator" and e.event == "end" for e in deployment.executions(run_id))


KILL_POINTS: dict[str, Callable[[Deployment, str], bool]] = {
    # The first model step is recorded; the planner is writing usage, the phase, dispatching.
    "after_the_first_model_step": _assistant_turn_seen,
    # Every call is dispatched and the calculators run: their results reach no planner.
    "while_the_tools_run": _executing_tools_seen,
    # The calculators answered: the planner is recording results and the group's message.
    "while_results_arrive": _calculator_answered,
}


@pytest.mark.parametrize("kill_point", list(KILL_POINTS))
async def test_a_planner_killed_mid_run_is_restarted_and_the_run_completes_with_each_effect_once(
    deployment: Deployment, kill_point: str
) -> None:
    session = await deployment.session()
    value = uuid.uuid4().hex[:8]
    request = await deployment.turn(session, f"calculate 1+1; calculate 2+2; note k={value}")
    run_id = request.run_id
    await eventually(lambda: KILL_POINTS[kill_point](deployment, run_id), 30.0, kill_point)

    killed_at = datetime.now(UTC)
    await deployment.kill_planner()
    started = time.monotonic()
    deployment.start_planner()
    use_ids = await assert_finished_cleanly(deployment, run_id, killed_at)
    recovered_s = time.monotonic() - started

    # Each tool ran exactly once: the planner's death made no call run again (the notes effect once).
    executions = deployment.executions(run_id)
    for use_id in use_ids:
        done = [(e.event, e.tool) for e in executions if e.tool_use_id == use_id]
        assert [event for event, _ in done] == ["start", "end"], (use_id, done)
    [note] = [e for e in executions if e.tool == "notes" and e.event == "end"]
    assert note.input == {"action": "set", "key": "k", "value": value}

    messages = await build_messages_from_run_log(deployment.store, run_id)
    answer = final_text(messages)
    assert "The calculator says 2." in answer and "The calculator says 4." in answer, answer
    await deployment.turns.wait_for(lambda _: bool(deployment.finished_turns(run_id)))
    assert len({turn.event_id for turn in deployment.finished_turns(run_id)}) == 1

    # The note is there for the next turn of the session.
    recall = await deployment.turn(session, "recall k")
    await deployment.until_closed(recall.run_id)
    recalled = final_text(await build_messages_from_run_log(deployment.store, recall.run_id))
    assert value in recalled, recalled
    print(f"{kill_point}: completed {recovered_s:.1f} s after the planner restarted")


# --- the tool executor ------------------------------------------------------------------------------


def _calculators_running(deployment: Deployment, run_id: str) -> set[int]:
    """Pids running both calculator calls of the run (started, not answered), when both are."""
    executions = [e for e in deployment.executions(run_id) if e.tool == "calculator"]
    started = {e.tool_use_id: e.pid for e in executions if e.event == "start"}
    answered = {e.tool_use_id for e in executions if e.event == "end"}
    if len(started) == 2 and not answered:
        return set(started.values())
    return set()


def _assert_calculators_rerun(deployment: Deployment, run_id: str, dead: int, survivor: int) -> None:
    """Both calculator calls started in the dead process, never answered there, ran again in the survivor."""
    executions = [e for e in deployment.executions(run_id) if e.tool == "calculator"]
    by_use: dict[str, list[tuple[str, int]]] = {}
    for execution in executions:
        by_use.setdefault(execution.tool_use_id, []).append((execution.event, execution.pid))
    assert len(by_use) == 2
    for use_id, happened in by_use.items():
        assert happened == [("start", dead), ("start", survivor), ("end", survivor)], (use_id, happened)
        results = [r for r in deployment.tool_results(run_id) if r.tool_use_id == use_id]
        assert len(results) == 1 and not results[0].is_error, results  # answered once, by the survivor


async def test_a_tool_executor_killed_mid_call_is_restarted_and_every_use_gets_one_result(
    deployment: Deployment,
) -> None:
    [executor] = deployment.executors
    session = await deployment.session()
    request = await deployment.turn(session, f"calculate 3+3; calculate 4+4; note j={uuid.uuid4().hex[:6]}")
    run_id = request.run_id
    [dead] = await eventually(lambda: _calculators_running(deployment, run_id), 30.0, "calculators running")
    assert dead == deployment.pid(executor)

    killed_at = datetime.now(UTC)
    await deployment.kill_executor(executor)
    started = time.monotonic()
    replacement = deployment.start_executor()
    await assert_finished_cleanly(deployment, run_id, killed_at)
    recovered_s = time.monotonic() - started

    _assert_calculators_rerun(deployment, run_id, dead, deployment.pid(replacement))
    answer = final_text(await build_messages_from_run_log(deployment.store, run_id))
    assert "The calculator says 6." in answer and "The calculator says 8." in answer, answer
    notes = [r for r in deployment.tool_results(run_id) if r.tool_name == "notes"]
    print(
        f"executor restart: completed {recovered_s:.1f} s after the kill; "
        f"notes answered {len(notes)} time(s) on tools.results (the transcript keeps the first)"
    )


async def test_a_second_tool_executor_takes_over_the_calls_of_a_killed_one(deployment: Deployment) -> None:
    [first] = deployment.executors
    assigned_before = deployment.log_of(first).count("partitions assigned")
    second = deployment.start_executor()
    # Both copies are in the group: the new one got partitions, the old one its share after the rebalance.
    await eventually(
        lambda: (
            "partitions assigned" in deployment.log_of(second)
            and deployment.log_of(first).count("partitions assigned") > assigned_before
        ),
        30.0,
        "both executors assigned",
    )
    session = await deployment.session()
    request = await deployment.turn(session, f"calculate 5+5; calculate 6+6; note i={uuid.uuid4().hex[:6]}")
    run_id = request.run_id
    [dead] = await eventually(lambda: _calculators_running(deployment, run_id), 30.0, "calculators running")
    doomed = deployment.executor_with_pid(dead)
    [survivor] = [executor for executor in deployment.executors if executor is not doomed]

    killed_at = datetime.now(UTC)
    await deployment.kill_executor(doomed)
    started = time.monotonic()
    await assert_finished_cleanly(deployment, run_id, killed_at)
    recovered_s = time.monotonic() - started

    _assert_calculators_rerun(deployment, run_id, dead, deployment.pid(survivor))
    answer = final_text(await build_messages_from_run_log(deployment.store, run_id))
    assert "The calculator says 10." in answer and "The calculator says 12." in answer, answer
    print(f"executor takeover: completed {recovered_s:.1f} s after the kill (no restart)")


# --- between the two records of one model step ---------------------------------------------------------


class SentCommands:
    """What was sent to the storage owner (`storage.commands`), read outside any group, parsed once."""

    def __init__(self, deployment: Deployment) -> None:
        self.reader = TopicReader(
            deployment.stack.bootstrap, deployment.prefix + Topic.STORAGE_COMMANDS.value
        )
        self._appended: set[tuple[str, str]] = set()
        self._parsed = 0

    def appended(self, run_id: str, event_key: str) -> bool:
        """Whether a command appending `run_id`'s `event_key` was sent (AppendRunRecord, a step's
        AppendRunRecords, or the records a RecordRunTerminal carries)."""
        for record in self.reader.records[self._parsed :]:
            value = json.loads(record.value or b"{}")
            if not isinstance(value, dict):
                continue
            if value.get("op") == "AppendRunRecord":
                carried = [value["record"]]
            elif value.get("op") in ("AppendRunRecords", "RecordRunTerminal"):
                carried = value.get("records", [])
            else:
                continue
            self._appended.update((each["run_id"], each["event_key"]) for each in carried)
        self._parsed = len(self.reader.records)
        return (run_id, event_key) in self._appended


async def test_a_planner_killed_while_its_model_step_is_being_recorded_keeps_the_step_and_its_usage(
    deployment: Deployment,
) -> None:
    """Freeze the owner once the planning phase committed, so the planner's `step/1/assistant`
    append waits unapplied; kill the planner then (it never saw the reply); resume the owner,
    which applies the append; a new planner finishes the run without asking the model again."""
    owner = deployment.owner.pid
    assert owner is not None
    # A pipelined start sends the step right behind it, with no gap to freeze the owner in between:
    # this planner awaits its start, so the step waits for the freeze at the `planning` event.
    deployment.environment[PIPELINE_STARTS_ENV] = "false"
    await deployment.kill_planner()
    deployment.start_planner()
    commands = SentCommands(deployment)
    await commands.reader.start()
    try:
        session = await deployment.session()
        request = await deployment.turn(session, "hello there")
        run_id = request.run_id
        await deployment.until_event(
            run_id, lambda e: e.type is StreamEventType.WORKFLOW and e.payload.get("phase") == "planning"
        )
        os.kill(owner, signal.SIGSTOP)  # its reply to the planning append is out; the next waits
        try:
            await eventually(lambda: commands.appended(run_id, "step/1/assistant"), 10.0, "assistant sent")
            killed_at = datetime.now(UTC)
            await deployment.kill_planner()
        finally:
            os.kill(owner, signal.SIGCONT)
    finally:
        await commands.reader.stop()

    async def assistant_recorded() -> bool:
        return "step/1/assistant" in {record.event_key for record in await deployment.records(run_id)}

    await eventually(assistant_recorded, 20.0, "the owner applied the assistant append")
    del deployment.environment[PIPELINE_STARTS_ENV]
    deployment.start_planner()
    events = await deployment.until_closed(run_id, within=RECOVERY_S)
    assert terminal_workflow(events).payload["phase"] == "completed"
    meta = await deployment.store.load_run(run_id)
    assert meta.status is RunStatus.COMPLETED and meta.updated_at > killed_at
    records = await deployment.records(run_id)
    keys = [record.event_key for record in records]
    assert [k for k in keys if k.endswith("/assistant")] == [
        "step/1/assistant"
    ]  # the model was not asked again
    # The step's usage rides in the assistant message itself, which is what the budget counts.
    [assistant] = [json.loads(r.payload) for r in records if r.event_key == "step/1/assistant"]
    assert assistant[0]["meta"]["usage"]["output_tokens"] > 0, f"the usage of step 1 is lost: {keys}"
