"""`quipu serve tools --app`: a user's toolset served by copies of its own executor, sharing its calls;
and `app_served`, the same App served in this process (agents published, executors announced).

The user's module is written to a tmp directory that is not importable from the repository; two
processes run `quipu serve tools --app shopapp:app` from there, as a user would in two terminals.
The test waits until both hold partitions of `tools.calls.shop`, publishes calls of both tools
over many runs, and checks on the wire that each call was answered exactly once (with what the
tool returns), that both copies answered some, and that the toolset was announced on
`tools.registry` with its topic and both tools.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quipu.agents import Agent
from quipu.app import App
from quipu.contracts.agents import AgentChanged
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested, ToolsetAnnounced
from quipu.contracts.topics import Topic
from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services.cli.apps import app_served
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.settings import KafkaSettings
from quipu.tools import Toolset
from tests.owner_support import RawPublisher, TopicReader
from tests.support.executor_logs import ExecutorLog, until_split
from tests.timing import scaled

pytestmark = pytest.mark.slow

USER_MODULE = '''
import quipu

shop = quipu.Toolset("shop", version="3")


@shop.tool
async def price(item: str, quantity: int = 1) -> dict[str, object]:
    """The price of some items, in cents."""
    return {"item": item, "cents": 250 * quantity}


@shop.tool
def stock(item: str) -> int:
    """How many of an item are in stock."""
    return len(item)


app = quipu.App(toolsets=[shop])
'''

CALLS_TOPIC = "tools.calls.shop"
PARTITIONS = set(range(8))


class Copy:
    """One `quipu serve tools` process, run from the user's directory, and its log."""

    def __init__(self, folder: Path, environment: dict[str, str], log_path: Path) -> None:
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quipu.services.cli", "serve", "tools", "--app", "shopapp:app"],
            cwd=folder,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        consumer = f"tool-executor-shop {CALLS_TOPIC}"  # its own group, on its own topic
        self.log = ExecutorLog(log_path, consumer, lambda: self.process.poll() is None)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(scaled(15))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@pytest.fixture
async def copies(stack: EmbeddedStack, topic_prefix: str, tmp_path: Path) -> AsyncIterator[list[Copy]]:
    """Two copies of the shop toolset's executor, started from the user's directory."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "shopapp.py").write_text(textwrap.dedent(USER_MODULE))
    await create_topics(stack.bootstrap, topic_prefix, toolsets=["shop"])  # as a deployment declares it
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("QUIPU_")},
        **stack.environment(),
        "QUIPU_KAFKA_TOPIC_PREFIX": topic_prefix,
        "QUIPU_JSON_LOGS": "true",
        "QUIPU_LOG_LEVEL": "INFO",
    }
    environment.pop("PYTHONPATH", None)  # the module is found in the current directory, nowhere else
    started = [Copy(folder, environment, tmp_path / f"copy-{number}.log") for number in range(2)]
    try:
        yield started
    finally:
        await asyncio.gather(*(asyncio.to_thread(copy.stop) for copy in started))


async def test_two_copies_of_a_users_toolset_share_its_calls(
    stack: EmbeddedStack, topic_prefix: str, copies: list[Copy]
) -> None:
    await until_split([copy.log for copy in copies], PARTITIONS, within=40.0)
    calls = [
        ToolCallRequested(
            run_id=f"run-{number}",
            session_id=f"session-{number}",
            agent_id="shopper",
            tool_use_id=f"toolu_{number}",
            tool_name="price" if number % 2 else "stock",
            input={"item": "x" * (number % 7 + 1), "quantity": number}
            if number % 2
            else {"item": "ab" * number},
        )
        for number in range(1, 41)
    ]
    async with (
        RawPublisher(stack.bootstrap) as publisher,
        TopicReader(stack.bootstrap, topic_prefix + Topic.TOOLS_RESULTS) as results,
        TopicReader(stack.bootstrap, topic_prefix + Topic.TOOLS_REGISTRY) as registry,
    ):
        for call in calls:
            await publisher.send(
                topic_prefix + CALLS_TOPIC, call.model_dump_json().encode(), key=call.run_id.encode()
            )
        await results.wait_for(lambda records: len(records) >= len(calls), within=30.0)
        await registry.wait_for(lambda records: len(records) >= 2, within=10.0)  # each copy announced
        await asyncio.sleep(0.5)  # a duplicate would have arrived by now

    answered = results.parsed(ToolCallCompleted)
    assert Counter(result.tool_use_id for result in answered) == Counter(call.tool_use_id for call in calls)
    for result in answered:
        number = int(result.run_id.removeprefix("run-"))
        assert not result.is_error, result.content
        if number % 2:
            assert result.content == {"item": "x" * (number % 7 + 1), "cents": 250 * number}
        else:
            assert result.content == 2 * number

    served = [copy.log.completed() for copy in copies]
    assert all(served), f"one copy did all the work: {[len(ids) for ids in served]}"
    assert Counter(served[0] + served[1]) == Counter(call.tool_use_id for call in calls)

    announced = registry.parsed(ToolsetAnnounced)
    assert {(a.toolset, a.version, a.calls_topic) for a in announced} == {("shop", "3", CALLS_TOPIC)}
    assert len({a.event_id for a in announced}) == 1  # the copies announce the same content
    assert {tool.name for tool in announced[0].tools} == {"price", "stock"}


# --- the same, in this process (what the demo does) --------------------------------------------------

counter = Toolset("counter", version="1")


@counter.tool
def letters(word: str) -> int:
    """How many letters a word has."""
    return sum(char.isalpha() for char in word)


counting = Agent(id="counting", instructions="You count letters.", tools=[letters])


async def test_an_app_served_in_process_publishes_its_agents_and_answers_its_tools(
    stack: EmbeddedStack, kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    call = ToolCallRequested(
        run_id="run-in-process",
        session_id="session-in-process",
        agent_id="counting",
        tool_use_id="toolu_in_process",
        tool_name="letters",
        input={"word": "tama-rind"},
    )
    app = App(agents=[counting], toolsets=[counter])
    async with (
        app_served(Connections(kafka_settings), app),
        RawPublisher(stack.bootstrap) as publisher,
        TopicReader(stack.bootstrap, topic_prefix + Topic.TOOLS_RESULTS) as results,
        TopicReader(stack.bootstrap, topic_prefix + Topic.AGENTS_REGISTRY) as agents,
    ):
        await agents.wait_for(lambda records: len(records) >= 1, within=10.0)
        await publisher.send(
            topic_prefix + "tools.calls.counter", call.model_dump_json().encode(), key=call.run_id.encode()
        )
        await results.wait_for(lambda records: len(records) >= 1, within=20.0)
    [answered] = results.parsed(ToolCallCompleted)
    assert (answered.tool_use_id, answered.content, answered.is_error) == ("toolu_in_process", 8, False)
    [entry] = agents.parsed(AgentChanged)
    assert entry.agent is not None and (entry.agent_id, entry.agent.tools) == ("counting", ["letters"])
