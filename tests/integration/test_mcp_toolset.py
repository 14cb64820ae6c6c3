"""An MCP server as a toolset, end to end on the real embedded broker and database.

`quipu serve mcp --toolset files -- python tests/mcp_servers/files_server.py ROOT` runs as a
process of its own, as an operator starts it; it starts the MCP server (written with the SDK's
server API) as its subprocess over stdio. The storage owner and the planner run in this process;
the planner learns the toolset from `tools.registry` and its model calls the MCP tool the
user's text names, then answers with what it read. So the whole way is real: announcement,
routing to `tools.calls.files`, the MCP `tools/call`, the result in the run's transcript.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.runs import RunRequested
from quipu.contracts.store import RunStatus
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import Message, TextPart, ToolResultPart, ToolUsePart
from quipu.contracts.wire import utc_now_ms
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.domain.transcript import build_messages_from_run_log
from quipu.services.kit.store_client import KafkaStore
from quipu.services.planner.app import create_app as create_planner
from quipu.services.planner.orchestrator import PlannerDeps
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.testing import FunctionModel, ModelAnswer, ModelRequest
from tests.owner_support import RawPublisher, TopicReader
from tests.timing import eventually, scaled

pytestmark = pytest.mark.slow

SERVER = Path(__file__).parents[1] / "mcp_servers" / "files_server.py"
LIBRARIAN = AgentDefinition(
    id="librarian", instructions="You read files.", tools=["read_file", "crash", "add_echo_tool"]
)
CRIER = AgentDefinition(id="crier", instructions="You shout.", tools=["shout"])
"""Its tool is one the server adds while it runs."""


def librarian(request: ModelRequest) -> ModelAnswer:
    """Calls the tool the user's words name (`read NAME`, `crash`, `grow NAME`, `shout TEXT`) once, then
    says what came back."""
    results = [
        part for message in request.messages for part in message.parts if isinstance(part, ToolResultPart)
    ]
    if results:
        [result] = results
        return f"error={result.is_error} content={result.content}"
    [words] = [part.text for part in request.messages[-1].parts if isinstance(part, TextPart)]
    use_id = "toolu_" + uuid.uuid4().hex[:16]
    if words == "crash":
        return [ToolUsePart(id=use_id, name="crash", input={})]
    if words.startswith("grow "):
        grown = {"name": words.removeprefix("grow "), "how": "listen"}
        return [ToolUsePart(id=use_id, name="add_echo_tool", input=grown)]
    if words.startswith("shout "):
        return [ToolUsePart(id=use_id, name="shout", input={"text": words.removeprefix("shout ")})]
    return [ToolUsePart(id=use_id, name="read_file", input={"name": words.removeprefix("read ")})]


@dataclass
class Library:
    store: KafkaStore
    registry: ToolsetRegistry
    events: TopicReader
    publisher: RawPublisher
    prefix: str
    root: Path
    logs: Path

    async def run(self, text: str, agent: str = "librarian") -> tuple[RunStatus, list[Message]]:
        session_id = "s-" + uuid.uuid4().hex[:10]
        await self.store.create_session(session_id, utc_now_ms())
        request = RunRequested(
            run_id="r-" + uuid.uuid4().hex, session_id=session_id, agent_id=agent, text=text
        )
        await self.publisher.send(
            self.prefix + Topic.RUNS_REQUESTED.value,
            request.model_dump_json().encode(),
            key=request.partition_key().encode(),
        )

        async def ended() -> bool:
            return any(
                event.type is StreamEventType.RUN_STREAM_END for event in self.run_events(request.run_id)
            )

        await eventually(ended, within=90.0, what=f"the run for {text!r} ended")
        status = (await self.store.load_run(request.run_id)).status
        return status, await build_messages_from_run_log(self.store, request.run_id)

    def run_events(self, run_id: str) -> list[RunEvent]:
        parsed = self.events.parsed(RunEvent)
        return [event for event in parsed if event.run_id == run_id]


def serve_mcp(stack: EmbeddedStack, prefix: str, root: Path, logs: Path) -> subprocess.Popen[bytes]:
    """`quipu serve mcp --toolset files -- python files_server.py ROOT`, as an operator runs it;
    its log is `logs/executor.log`, the MCP server's own `logs/server.log`."""
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("QUIPU_")},
        **stack.environment(),
        "QUIPU_KAFKA_TOPIC_PREFIX": prefix,
        "QUIPU_JSON_LOGS": "true",
        "QUIPU_LOG_LEVEL": "INFO",
    }
    command = [sys.executable, "-m", "quipu.services.cli", "serve", "mcp", "--toolset", "files"]
    options = ["--version", "7", "--timeout-s", "50", "--server-log", str(logs / "server.log")]
    with (logs / "executor.log").open("wb") as output:
        return subprocess.Popen(
            [*command, *options, "--", sys.executable, str(SERVER), str(root)],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture(scope="module")
async def library(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Library]:
    root = tmp_path_factory.mktemp("library")
    (root / "poem.txt").write_text("the river keeps its knots")
    prefix = f"mcp{uuid.uuid4().hex[:8]}."
    await create_topics(stack.bootstrap, prefix, toolsets=["files"])
    settings = stack.kafka_settings(topic_prefix=prefix)
    logs = tmp_path_factory.mktemp("logs")
    executor = serve_mcp(stack, prefix, root, logs)
    registry = ToolsetRegistry()
    owner = create_owner(settings, stack.mongo_settings(database=prefix.rstrip(".")))
    planner = create_planner(
        settings,
        deps=PlannerDeps(
            model=FunctionModel(librarian),
            agents=AgentRegistry([LIBRARIAN, CRIER]),
            registry=registry,
        ),
    )
    await owner.start()
    store = KafkaStore(settings, reply_timeout_s=scaled(10.0))
    await store.start()
    await planner.start()
    events = TopicReader(stack.bootstrap, prefix + Topic.RUNS_EVENTS.value)
    await events.start()
    try:
        async with RawPublisher(stack.bootstrap) as publisher:
            yield Library(store, registry, events, publisher, prefix, root, logs)
    finally:
        executor.terminate()
        await asyncio.to_thread(executor.wait, scaled(20))
        await events.stop()
        await planner.stop()
        await store.stop()
        await owner.stop()
        await delete_topics(stack.bootstrap, prefix)


async def announced(library: Library) -> None:
    async def files_announced() -> bool:
        return "files" in library.registry.toolsets()

    await eventually(files_announced, within=90.0, what="`quipu serve mcp` announced the files toolset")


def tool_result(messages: list[Message]) -> ToolResultPart:
    [result] = [part for message in messages for part in message.parts if isinstance(part, ToolResultPart)]
    return result


def final_text(messages: list[Message]) -> str:
    return " ".join(part.text for part in messages[-1].parts if isinstance(part, TextPart))


async def test_the_mcp_servers_tools_are_announced_as_the_toolset(library: Library) -> None:
    await announced(library)

    assert library.registry.calls_topic("read_file") == "tools.calls.files"
    assert library.registry.calls_topic("crash") == "tools.calls.files"
    assert library.registry.calls_topic("files.list") is None  # a name Quipu refuses is left out


async def test_an_agent_reads_through_the_mcp_tool_and_the_result_is_in_its_transcript(
    library: Library,
) -> None:
    await announced(library)

    status, messages = await library.run("read poem.txt")

    assert status is RunStatus.COMPLETED
    result = tool_result(messages)
    assert not result.is_error and result.content == {"result": "the river keeps its knots"}
    assert "the river keeps its knots" in final_text(messages)


async def test_an_is_error_result_goes_back_to_the_model_as_an_error(library: Library) -> None:
    await announced(library)

    status, messages = await library.run("read nowhere.txt")

    assert status is RunStatus.COMPLETED  # the model read the error and answered
    result = tool_result(messages)
    assert result.is_error and "no file named nowhere.txt" in str(result.content)
    assert "error=True" in final_text(messages)
    # The executor logs the call, never its arguments; the server's own log (which quotes them) is
    # kept apart, in the file it was given.
    assert "nowhere.txt" in (library.logs / "server.log").read_text()
    assert "nowhere.txt" not in (library.logs / "executor.log").read_text()


async def test_a_tool_the_server_adds_while_it_runs_is_announced_and_offered(library: Library) -> None:
    await announced(library)
    assert library.registry.find("shout") is None

    grown, _ = await library.run("grow shout")

    async def offered() -> bool:
        return library.registry.find("shout") is not None

    await eventually(offered, within=30.0, what="the tool the server added announced on tools.registry")
    assert grown is RunStatus.COMPLETED
    assert library.registry.calls_topic("shout") == "tools.calls.files"
    assert library.registry.calls_topic("read_file") == "tools.calls.files"  # the rest still offered
    status, messages = await library.run("shout hello", agent="crier")
    assert status is RunStatus.COMPLETED
    assert tool_result(messages).content == {"result": "shout: hello"}


async def test_a_server_crash_mid_call_settles_the_call_and_the_next_run_is_served(library: Library) -> None:
    await announced(library)

    crashed_status, crashed = await library.run("crash")
    status, after = await library.run("read poem.txt")

    assert (library.root / "crashed").exists()
    assert crashed_status is RunStatus.COMPLETED
    assert tool_result(crashed).is_error and "went away during the call" in str(tool_result(crashed).content)
    assert status is RunStatus.COMPLETED
    assert tool_result(after).content == {"result": "the river keeps its knots"}
