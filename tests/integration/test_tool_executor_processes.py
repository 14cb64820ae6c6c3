"""Two tool-executor processes share the work through their consumer group.

Each is `python -m quipu.services.tool_executor`, pointed at the embedded broker by the environment
(bootstrap, flavour, topic prefix), logging JSON lines to its own file. The test waits until
the group has settled (each process holds some partitions of `tools.calls`, together all of
them), publishes 40 calls over 40 runs, and checks on the wire that every call was answered
exactly once, and in the logs that both processes answered some.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack
from tests.owner_support import RawPublisher, TopicReader
from tests.timing import scaled

pytestmark = pytest.mark.slow

MODULE = "quipu.services.tool_executor"
PARTITIONS = set(range(8))


class Executor:
    """One executor process and what its log says."""

    def __init__(self, environment: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.process = ServiceProcess(MODULE, environment, log_path)

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines logged so far (anything else is skipped)."""
        if not self.log_path.exists():
            return []
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
        return lines

    def assignment(self) -> set[int]:
        """The partitions of `tools.calls` it was assigned last."""
        assigned = [
            line
            for line in self.lines()
            if line.get("event") == "partitions assigned"
            and line.get("consumer") == "tool-executor tools.calls"
        ]
        return set(assigned[-1]["partitions"]) if assigned else set()

    def completed(self) -> list[str]:
        """tool_use ids it logged as answered."""
        return [line["tool_use_id"] for line in self.lines() if line.get("event") == "tool call completed"]

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else "(no log)"


@pytest.fixture
async def executors(stack: EmbeddedStack, topic_prefix: str, tmp_path: Path) -> AsyncIterator[list[Executor]]:
    """Two executor processes on this test's topics, stopped (SIGTERM) afterwards."""
    environment = {**stack.environment(), "QUIPU_KAFKA_TOPIC_PREFIX": topic_prefix}
    started = [Executor(environment, tmp_path / f"executor-{number}.log") for number in range(2)]
    for executor in started:
        executor.process.start()
    try:
        yield started
    finally:
        await asyncio.gather(*(asyncio.to_thread(executor.process.stop, 15.0) for executor in started))


async def _settled(executors: list[Executor], within: float) -> None:
    """Wait until each process holds some partitions and together they hold each exactly once."""
    deadline = time.monotonic() + scaled(within)
    while True:
        held = [executor.assignment() for executor in executors]
        if all(held) and set.union(*held) == PARTITIONS and sum(map(len, held)) == len(PARTITIONS):
            return
        for executor in executors:
            assert executor.process.running, f"an executor exited:\n{executor.tail()}"
        if time.monotonic() > deadline:
            logs = "\n---\n".join(executor.tail() for executor in executors)
            raise AssertionError(f"the group did not settle within {within} s: {held}\n{logs}")
        await asyncio.sleep(0.05)


async def test_two_processes_share_the_calls_and_answer_each_once(
    stack: EmbeddedStack, topic_prefix: str, executors: list[Executor]
) -> None:
    await _settled(executors, within=20.0)
    calls = [
        ToolCallRequested(
            run_id=f"run-{number}",
            session_id=f"session-{number}",
            agent_id="agent-1",
            tool_use_id=f"toolu_{number}",
            tool_name="calculator" if number % 4 else "current_time",
            input={"expression": f"{number} * {number}"} if number % 4 else {},
        )
        for number in range(40)
    ]
    async with (
        RawPublisher(stack.bootstrap) as publisher,
        TopicReader(stack.bootstrap, topic_prefix + Topic.TOOLS_RESULTS) as results,
    ):
        for call in calls:
            await publisher.send(
                topic_prefix + Topic.TOOLS_CALLS, call.model_dump_json().encode(), key=call.run_id.encode()
            )
        await results.wait_for(lambda records: len(records) >= len(calls), within=15.0)
        await asyncio.sleep(0.5)  # a duplicate would have arrived by now

    answered = [ToolCallCompleted.model_validate_json(record.value or b"") for record in results.records]
    assert Counter(result.tool_use_id for result in answered) == Counter(call.tool_use_id for call in calls)
    for result in answered:
        number = int(result.run_id.removeprefix("run-"))
        assert not result.is_error
        if number % 4:
            assert result.content == {"expression": f"{number} * {number}", "result": number * number}
        else:
            assert set(result.content) >= {"iso", "timezone", "weekday"}

    served = [executor.completed() for executor in executors]
    assert all(served), f"one process did all the work: {[len(ids) for ids in served]}"
    assert Counter(served[0] + served[1]) == Counter(call.tool_use_id for call in calls)
