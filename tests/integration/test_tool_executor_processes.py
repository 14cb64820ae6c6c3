"""Two tool-executor processes share the work through their consumer group.

Each is `python -m quipu.services.tool_executor`, pointed at the embedded broker by the environment
(bootstrap, flavour, topic prefix), logging JSON lines to its own file. The test waits until
the group has settled (each process holds some partitions of `tools.calls`, together all of
them), publishes 40 calls over 40 runs, and checks on the wire that every call was answered
exactly once, and in the logs that both processes answered some.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.topics import Topic
from quipu.deploy.local.services import ServiceProcess
from quipu.deploy.local.stack import EmbeddedStack
from tests.owner_support import RawPublisher, TopicReader
from tests.support.executor_logs import ExecutorLog, until_split

pytestmark = pytest.mark.slow

MODULE = "quipu.services.tool_executor"
PARTITIONS = set(range(8))


class Executor:
    """One executor process and its log."""

    def __init__(self, environment: dict[str, str], log_path: Path) -> None:
        self.process = ServiceProcess(MODULE, environment, log_path)
        self.log = ExecutorLog(log_path, "tool-executor tools.calls", lambda: self.process.running)


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


async def test_two_processes_share_the_calls_and_answer_each_once(
    stack: EmbeddedStack, topic_prefix: str, executors: list[Executor]
) -> None:
    await until_split([executor.log for executor in executors], PARTITIONS, within=20.0)
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

    answered = results.parsed(ToolCallCompleted)
    assert Counter(result.tool_use_id for result in answered) == Counter(call.tool_use_id for call in calls)
    for result in answered:
        number = int(result.run_id.removeprefix("run-"))
        assert not result.is_error
        if number % 4:
            assert result.content == {"expression": f"{number} * {number}", "result": number * number}
        else:
            assert set(result.content) >= {"iso", "timezone", "weekday"}

    served = [executor.log.completed() for executor in executors]
    assert all(served), f"one process did all the work: {[len(ids) for ids in served]}"
    assert Counter(served[0] + served[1]) == Counter(call.tool_use_id for call in calls)
