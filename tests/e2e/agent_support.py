"""The agent loop as separate processes, for end-to-end and chaos tests; and an instrumented tool executor.

`Deployment` starts, on a topic prefix and database of its own, the storage owner, the planner
(`python -m quipu.services.planner`, `QUIPU_MODEL_PROVIDER=scripted`), tool executors and, on request,
the gateway (`python -m quipu.services.gateway`), each a `ServiceProcess` that can be SIGKILLed and
started again. The test is a client: it reads `runs.events`, `history.turns` and `tools.results`
outside any consumer group, publishes raw `RunRequested`/`CancelRun` bytes, and reads the store
through the storage owner's Kafka client.

`python -m tests.e2e.agent_support` is the tool executor (`quipu.services.tool_executor.app.create_app`,
the shipped tools, the real dispatcher, ledger and idempotence record) with each tool wrapped so
a test can see and time what happens inside the process:

- every execution appends JSON lines to the journal at `QUIPU_TEST_TOOL_JOURNAL`: `start` before
  the tool runs, `end` after it returned (for `notes set`, the effect is applied), `canceled` when
  its task was canceled; each with the pid, run id, tool_use id, tool name and input;
- `QUIPU_TEST_TOOL_DELAYS` (JSON `{tool: seconds}`) makes a tool wait before it runs, so a kill
  lands while a call is in flight (within the tool's own deadline: calculator 2 s, notes 5 s).

Counting `start`/`end` lines per tool_use id is how a test proves a tool effect happened once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOURNAL_ENV = "QUIPU_TEST_TOOL_JOURNAL"
DELAYS_ENV = "QUIPU_TEST_TOOL_DELAYS"
EXECUTOR_MODULE = "tests.e2e.agent_support"
REPO_ROOT = Path(__file__).resolve().parents[2]


# --- the instrumented tool executor (runs in its own process) ------------------------------------


def _journal_line(path: Path, event: str, tool: str, context: Any, arguments: Any) -> None:
    line = json.dumps(
        {
            "event": event,
            "pid": os.getpid(),
            "at": time.time(),
            "run_id": context.run_id,
            "tool_use_id": context.tool_use_id,
            "tool": tool,
            "input": arguments.model_dump(mode="json"),
        }
    )
    # One write of one short line with O_APPEND: lines of several processes never interleave.
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)


def instrumented(
    name: str, implementation: Callable[[Any, Any], Awaitable[Any]], journal: Path, delay_s: float
) -> Callable[[Any, Any], Awaitable[Any]]:
    """`implementation`, journaled, after waiting `delay_s`."""

    async def run(arguments: Any, context: Any) -> Any:
        _journal_line(journal, "start", name, context, arguments)
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            value = await implementation(arguments, context)
        except asyncio.CancelledError:
            _journal_line(journal, "canceled", name, context, arguments)
            raise
        _journal_line(journal, "end", name, context, arguments)
        return value

    return run


def main() -> None:
    """Serve the tool executor with journaled (and maybe slowed) tools until interrupted."""
    from quipu.services.domain.shipped_tools import shipped_toolset  # noqa: PLC0415
    from quipu.services.kit.logging import configure_logging  # noqa: PLC0415 - only in the executor process
    from quipu.services.kit.settings import KafkaSettings, ServiceSettings  # noqa: PLC0415
    from quipu.services.tool_executor.app import SERVICE, ToolExecutorDeps, create_app  # noqa: PLC0415
    from quipu.services.tool_executor.settings import ToolExecutorSettings  # noqa: PLC0415

    journal = Path(os.environ[JOURNAL_ENV])
    delays: dict[str, float] = json.loads(os.environ.get(DELAYS_ENV) or "{}")
    implementations = {
        name: instrumented(name, implementation, journal, float(delays.get(name, 0.0)))
        for name, implementation in shipped_toolset().implementations().items()
    }
    configure_logging(ServiceSettings(service_name=SERVICE))
    app = create_app(
        KafkaSettings(), ToolExecutorSettings(), deps=ToolExecutorDeps(implementations=implementations)
    )
    asyncio.run(app.run())


if __name__ == "__main__":
    # The executor process stops here: what follows (the test side) would only slow its start.
    main()
    raise SystemExit(0)

from aiokafka import ConsumerRecord  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from quipu.contracts.events import RunEvent, StreamEventType  # noqa: E402
from quipu.contracts.runs import CancelRun  # noqa: E402
from quipu.contracts.store import CancellationReason, Record  # noqa: E402
from quipu.contracts.tools import ToolCallCompleted  # noqa: E402
from quipu.contracts.topics import Topic  # noqa: E402
from quipu.contracts.transcript import Message, ToolResultPart, ToolUsePart  # noqa: E402
from quipu.deploy.local.services import ServiceProcess  # noqa: E402
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics  # noqa: E402
from quipu.services.kit.keys import MessageSeals, message_seals  # noqa: E402
from quipu.services.kit.settings import KeySettings  # noqa: E402
from quipu.services.kit.store_client import KafkaStore  # noqa: E402
from quipu.services.planner.adapters import load_records  # noqa: E402
from tests.owner_support import Owner, RawPublisher, TopicReader, free_port, wait_until_serving  # noqa: E402
from tests.support.announced import publish_built_in_agents  # noqa: E402
from tests.support.conversing import Conversing  # noqa: E402
from tests.support.gateway_keys import TestKeys  # noqa: E402
from tests.timing import scaled  # noqa: E402

# --- waiting ------------------------------------------------------------------------------------


async def eventually(condition: Callable[[], Any], within: float, what: str, interval: float = 0.02) -> Any:
    """Poll `condition` (sync or async) until it returns something truthy (for `scaled(within)` s)."""
    deadline = time.monotonic() + scaled(within)
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {scaled(within):.1f} s: {what}")
        await asyncio.sleep(interval)


# --- the journal --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One journal line: something that happened to a tool call inside an executor process."""

    event: str
    pid: int
    run_id: str
    tool_use_id: str
    tool: str
    input: dict[str, Any]


def read_journal(path: Path) -> list[Execution]:
    """Every complete line of the journal, in the order written."""
    if not path.exists():
        return []
    executions = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        value = json.loads(line)
        executions.append(
            Execution(
                value["event"],
                value["pid"],
                value["run_id"],
                value["tool_use_id"],
                value["tool"],
                value["input"],
            )
        )
    return executions


# --- transcripts --------------------------------------------------------------------------------


def tool_uses(messages: list[Message]) -> list[ToolUsePart]:
    """Every tool use of a transcript, in order."""
    return [part for message in messages for part in message.parts if isinstance(part, ToolUsePart)]


def assert_each_use_has_one_result(messages: list[Message]) -> None:
    """Every tool use is answered by exactly one tool result, in the very next message, in use order."""
    for index, message in enumerate(messages):
        uses = [part for part in message.parts if isinstance(part, ToolUsePart)]
        if not uses:
            continue
        assert index + 1 < len(messages), f"message {index}: tool uses without an answer"
        results = [part for part in messages[index + 1].parts if isinstance(part, ToolResultPart)]
        assert [result.tool_use_id for result in results] == [use.id for use in uses], (
            f"message {index + 1}: results {[r.tool_use_id for r in results]} for uses {[u.id for u in uses]}"
        )
    every_result = [
        part.tool_use_id for message in messages for part in message.parts if isinstance(part, ToolResultPart)
    ]
    assert len(every_result) == len(set(every_result)), f"a tool use answered twice: {every_result}"


# --- the deployment -----------------------------------------------------------------------------


@dataclass
class Deployment(Conversing):
    """Service processes on one prefix, and a client's view of the topics and the store."""

    stack: EmbeddedStack
    prefix: str
    database: str
    log_dir: Path
    tool_delays: Mapping[str, float] = field(default_factory=dict)
    with_gateway: bool = False
    executor_module: str = EXECUTOR_MODULE
    """The journaled executor (`executions()` reads its journal), or the product's own entry point."""
    sealed: bool = False
    """Every service seals its topics under the principals' keys, fetched from the owner's key endpoint."""
    environment: dict[str, str] = field(default_factory=dict)
    journal: Path = field(init=False)
    owner: Owner = field(init=False)
    planner: ServiceProcess | None = None
    executors: list[ServiceProcess] = field(default_factory=list)
    gateway: ServiceProcess | None = None
    recorder: ServiceProcess | None = None
    gateway_url: str = ""
    gateway_headers: dict[str, str] = field(default_factory=dict)
    store: KafkaStore = field(init=False)
    keys: KeySettings = field(init=False)
    seals: MessageSeals = field(init=False)
    events: TopicReader = field(init=False)
    turns: TopicReader = field(init=False)
    results: TopicReader = field(init=False)
    publisher: RawPublisher = field(init=False)
    _started: int = 0
    _logs: dict[int, Path] = field(default_factory=dict)
    _also_close: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.journal = self.log_dir / "tools.journal"
        self.environment = {
            **self.stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": self.prefix,
            "QUIPU_MONGO_DATABASE": self.database,
            "QUIPU_MODEL_PROVIDER": "scripted",
            "QUIPU_JSON_LOGS": "true",
            JOURNAL_ENV: str(self.journal),
            DELAYS_ENV: json.dumps(dict(self.tool_delays)),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
        }
        keys = KeySettings(url="")
        if self.sealed:
            port, token = free_port(), "e2e-" + uuid.uuid4().hex
            keys = KeySettings(url=f"http://127.0.0.1:{port}", token=SecretStr(token))
            self.environment |= {"QUIPU_KEYS_URL": keys.url, "QUIPU_KEYS_TOKEN": token}
        self.owner = Owner(self.stack, self.prefix, self.database, self.log_dir / "owner.log")
        if self.sealed:
            self.owner.environment |= {
                "QUIPU_KEYS_TOKEN": self.environment["QUIPU_KEYS_TOKEN"],
                "QUIPU_OWNER_KEYS_PORT": keys.url.rsplit(":", 1)[1],
            }
        self.keys = keys
        self.seals = message_seals(keys)
        self.store = KafkaStore(
            self.stack.kafka_settings(topic_prefix=self.prefix),
            reply_timeout_s=scaled(10.0),
            seals=self.seals,
        )
        self.events = TopicReader(self.stack.bootstrap, self.prefix + Topic.RUNS_EVENTS.value)
        self.turns = TopicReader(self.stack.bootstrap, self.prefix + Topic.HISTORY_TURNS.value)
        self.results = TopicReader(self.stack.bootstrap, self.prefix + Topic.TOOLS_RESULTS.value)
        self.publisher = RawPublisher(self.stack.bootstrap)

    # -- lifecycle --

    async def __aenter__(self) -> Deployment:
        await create_topics(self.stack.bootstrap, self.prefix)
        await publish_built_in_agents(self.stack.kafka_settings(topic_prefix=self.prefix))
        try:
            self.owner.start()
            self.start_planner()
            self.start_executor()
            if self.with_gateway:
                self.start_gateway()
            await self.store.start()
            await wait_until_serving(self.store, self.owner)
            for reader in (self.events, self.turns, self.results):
                await reader.start()
            await self.publisher.__aenter__()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the clients, then every process (politely), and drop the topics."""
        # Each step must run even when an earlier one fails (or never started).
        closers: list[Callable[[], Awaitable[Any]]] = [
            *self._also_close,
            self.events.stop,
            self.turns.stop,
            self.results.stop,
            self.publisher.__aexit__,
            self.store.stop,
            self.seals.close,
        ]
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
        started = [self.planner, self.gateway, self.recorder, *self.executors]
        processes = [process for process in started if process]
        await asyncio.gather(*(asyncio.to_thread(process.stop, 15.0) for process in processes))
        await self.owner.stop()  # last: the others' shutdown may still write through it
        with contextlib.suppress(Exception):
            await delete_topics(self.stack.bootstrap, self.prefix)

    def on_close(self, close: Callable[[], Awaitable[Any]]) -> None:
        """Close a client of the test's own with the deployment (before its processes stop)."""
        self._also_close.append(close)

    def _process(
        self, module: str, name: str, environment: Mapping[str, str] | None = None
    ) -> ServiceProcess:
        self._started += 1
        log = self.log_dir / f"{self._started:02d}-{name}.log"
        process = ServiceProcess(module, {**self.environment, **(environment or {})}, log).start()
        self._logs[id(process)] = log
        return process

    def log_of(self, process: ServiceProcess) -> str:
        """Everything a service process logged so far."""
        path = self._logs[id(process)]
        return path.read_text(errors="replace") if path.exists() else ""

    @staticmethod
    def pid(process: ServiceProcess) -> int:
        """The process id of a started service."""
        assert process.process is not None
        return process.process.pid

    def start_planner(self) -> ServiceProcess:
        """A new planner process (the planner's consumer groups are shared by every copy)."""
        self.planner = self._process("quipu.services.planner", "planner")
        return self.planner

    async def kill_planner(self) -> None:
        """SIGKILL the planner: no shutdown, no commit."""
        assert self.planner is not None
        await asyncio.to_thread(self.planner.kill)

    def start_executor(self) -> ServiceProcess:
        """One more instrumented tool-executor process (they share one consumer group)."""
        executor = self._process(self.executor_module, "executor")
        self.executors.append(executor)
        return executor

    async def kill_executor(self, executor: ServiceProcess) -> None:
        """SIGKILL one executor and forget it."""
        await asyncio.to_thread(executor.kill)
        self.executors.remove(executor)

    def executor_with_pid(self, pid: int) -> ServiceProcess:
        """The executor process whose pid is `pid`."""
        [executor] = [e for e in self.executors if e.process is not None and e.process.pid == pid]
        return executor

    def start_recorder(self) -> ServiceProcess:
        """The transcript recorder (product history of every finished turn); stopped by `close`."""
        self.recorder = self._process("quipu.services.transcript_recorder", "recorder")
        return self.recorder

    def start_gateway(self) -> ServiceProcess:
        """The gateway process on a free port."""
        port = _free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        keys = TestKeys(self.log_dir)
        self.gateway_headers = keys.admin()
        self.gateway = self._process(
            "quipu.services.gateway",
            "gateway",
            {
                "QUIPU_GATEWAY_PORT": str(port),
                "QUIPU_GATEWAY_HOST": "127.0.0.1",
                "QUIPU_GATEWAY_API_KEYS_FILE": str(keys.file.path),
            },
        )
        return self.gateway

    def logs(self, size: int = 2500) -> str:
        """The end of every service's log, for failure messages."""
        return "\n".join(
            f"--- {path.name}\n{path.read_bytes()[-size:].decode(errors='replace')}"
            for path in sorted(self.log_dir.glob("*.log"))
        )

    # -- the client's side (and `Conversing`) --

    async def cancel(self, run_id: str, session_id: str) -> CancelRun:
        cancel = CancelRun(run_id=run_id, session_id=session_id, reason=CancellationReason.USER_REQUESTED)
        await self.publish(Topic.RUNS_CONTROL, cancel.model_dump_json().encode(), session_id)
        return cancel

    def all_events(self) -> list[RunEvent]:
        return self.events.parsed(RunEvent)

    async def until_event(
        self, run_id: str, wanted: Callable[[RunEvent], bool], within: float = 30.0, what: str = ""
    ) -> RunEvent:
        def found(_: list[ConsumerRecord[bytes, bytes]]) -> bool:
            return any(wanted(event) for event in self.run_events(run_id))

        try:
            await self.events.wait_for(found, within)
        except AssertionError:
            raise AssertionError(f"run {run_id}: no {what or 'such event'}\n{self.logs()}") from None
        return next(event for event in self.run_events(run_id) if wanted(event))

    def tool_results(self, run_id: str) -> list[ToolCallCompleted]:
        return [result for result in self.results.parsed(ToolCallCompleted) if result.run_id == run_id]

    async def records(self, run_id: str) -> list[Record]:
        return await load_records(self.store, run_id)

    def executions(self, run_id: str = "") -> list[Execution]:
        return [e for e in read_journal(self.journal) if not run_id or e.run_id == run_id]


def phases(events: list[RunEvent]) -> list[str]:
    """The `workflow` phases of a run's events, in order."""
    return [event.payload["phase"] for event in events if event.type is StreamEventType.WORKFLOW]


def distinct(events: list[RunEvent]) -> list[RunEvent]:
    """Events de-duplicated on (run_id, type, event_key) as every consumer does, first copy kept."""
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for event in events:
        if event.dedup_key() not in seen:
            seen.add(event.dedup_key())
            kept.append(event)
    return kept


def terminal_workflow(events: list[RunEvent]) -> RunEvent:
    """The one terminal `workflow` event of a run (copies of it de-duplicated)."""
    terminal = [
        e
        for e in distinct(events)
        if e.type is StreamEventType.WORKFLOW
        and e.payload.get("phase") in ("completed", "failed", "canceled")
    ]
    assert len(terminal) == 1, f"terminal workflow events: {[e.payload for e in terminal]}"
    return terminal[0]


def _free_port() -> int:
    import socket  # noqa: PLC0415 - only for the gateway

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
