"""`quipu`: start the runtime, talk to agents, inspect and administer sessions and runs.

    quipu up                               # embedded broker + database + every service, one process
    quipu run "what time is it?"           # a turn, shown live until the run ends
    quipu answer RUN_ID "Lima"             # answer a suspended run, then follow its continuation
    quipu runs show RUN_ID                 # a run's state and transcript
    quipu sessions end|purge|show ID       # session administration
    quipu memory list|export|forget P      # what Quipu remembers about a person; delete P FACT; reindex
    quipu serve planner                    # one service alone, against QUIPU_KAFKA_* / QUIPU_MONGO_*

Client commands (`run`, `answer`, `cancel`, `runs`, `sessions`, `memory`) talk to Kafka directly: the store
through the storage owner, requests to the planner, events from `runs.events` through the same
`RunEventReader` as the gateway's SSE endpoint, so they show the same events. They find Kafka in
`QUIPU_KAFKA_*`, or else in the state file a running `quipu up` writes (`QUIPU_STATE_FILE`,
default `~/.cache/quipu/up.json`).

Exit codes of `quipu run` and `quipu answer`: 0 the run completed; 1 it failed or was canceled, or
something went wrong; 3 it waits for an answer that could not be asked here (not a terminal).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import importlib.util
import json
import os
import runpy
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from contracts.errors import ErrorCode, StoreError
from contracts.events import RunEvent, RunPhase, StreamEventType
from contracts.lifecycle import decode_run_suspended
from contracts.memory import MemoryScope
from contracts.runs import RunRequested
from contracts.store import CancellationReason, LifecycleType, RunMeta, Session
from contracts.transcript import Message, TranscriptError, message_to_wire
from contracts.wire import format_timestamp, utc_now_ms
from services.gateway.adapters import KafkaRunPublisher
from services.gateway.logic import (
    GatewayError,
    RunRequest,
    cancel_request,
    require_open,
    resume_request,
    turn_request,
)
from services.kit.events import EventStreamError, RunEventReader, StartAt
from services.kit.logging import configure_logging
from services.kit.memory.client import KafkaMemoryStore
from services.kit.memory.reindex import Principal, principals_from_changes, reindex
from services.kit.settings import KafkaSettings, LogLevel, MongoSettings, ServiceSettings
from services.kit.store.client import KafkaStore

app = typer.Typer(
    name="quipu",
    help="Quipu: a distributed runtime for AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
sessions_app = typer.Typer(help="Administer sessions.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
app.add_typer(runs_app, name="runs")
memory_app = typer.Typer(
    help="See, export and delete what Quipu remembers about a person.", no_args_is_help=True
)
app.add_typer(memory_app, name="memory")

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

CLIENT_ID = "quipu-cli"
STATE_FILE_ENV = "QUIPU_STATE_FILE"
EXIT_FAILED = 1
EXIT_WAITING = 3

SERVICES = (
    "storage_owner",
    "planner",
    "tool_executor",
    "transcript_recorder",
    "fact_extractor",
    "enricher",
)
"""FastStream services in start order (the owner first: every other one calls the store)."""
GATEWAY = "gateway"


class CliError(Exception):
    """Raised by a command for a failure to report in one line (and exit 1), without a traceback."""


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print an error and exit."""
    errors.print(Text(f"error: {message}", style="bold red"))
    raise typer.Exit(code)


def _quiet_logging(verbose: bool = False) -> None:
    """Library logs only when they matter; QUIPU_LOG_LEVEL still wins."""
    level: LogLevel = "INFO" if verbose else "WARNING"
    overrides: dict[str, Any] = {} if "QUIPU_LOG_LEVEL" in os.environ else {"log_level": level}
    configure_logging(ServiceSettings(service_name=CLIENT_ID, **overrides))


# --- where Kafka is ---------------------------------------------------------------------------------


def state_file() -> Path:
    """Where `quipu up` leaves the environment that points clients at it."""
    configured = os.environ.get(STATE_FILE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "quipu" / "up.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_state() -> dict[str, Any] | None:
    """The state of a running `quipu up`, or None (no file, unreadable, or its process is gone)."""
    try:
        state: dict[str, Any] = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return None
    return state


def client_settings() -> KafkaSettings:
    """Kafka settings from QUIPU_KAFKA_*, else from a running `quipu up`."""
    if os.environ.get("QUIPU_KAFKA_BOOTSTRAP"):
        return KafkaSettings(client_id=CLIENT_ID)
    state = read_state()
    if state is None:
        fail("no Kafka to talk to: start `quipu up` (in another terminal) or set QUIPU_KAFKA_BOOTSTRAP")
    environment: dict[str, str] = state.get("environment", {})
    return KafkaSettings(
        bootstrap=environment["QUIPU_KAFKA_BOOTSTRAP"],
        flavour=environment.get("QUIPU_KAFKA_FLAVOUR", "kafka"),
        topic_prefix=environment.get("QUIPU_KAFKA_TOPIC_PREFIX", ""),
        client_id=CLIENT_ID,
    )


@contextlib.asynccontextmanager
async def connected(kafka: KafkaSettings) -> AsyncIterator[tuple[KafkaStore, KafkaRunPublisher]]:
    """A store client and a publisher for one command."""
    store = KafkaStore(kafka)
    publisher = KafkaRunPublisher(kafka, client_id=CLIENT_ID)
    await store.start()
    try:
        await publisher.start()
        try:
            yield store, publisher
        finally:
            await publisher.stop()
    finally:
        await store.stop()


def run_command(work: Callable[[], Any]) -> Any:
    """Run a command's coroutine; report store and stream failures in one line."""
    try:
        return asyncio.run(work())
    except StoreError as error:
        hint = " (is the storage owner running? `quipu up`)" if error.code is ErrorCode.UNAVAILABLE else ""
        fail(f"{error.code.value}: {error.message}{hint}")
    except GatewayError as error:
        fail(f"{error.code}: {error.message}")
    except (CliError, EventStreamError) as error:
        fail(str(error))


# --- showing events ---------------------------------------------------------------------------------


def _compact(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _prompt_of(event: RunEvent) -> str:
    payload = event.payload
    for key in ("prompt", "question", "message", "text"):
        if isinstance(payload.get(key), str) and payload[key]:
            return str(payload[key])
    return _compact(payload)


@dataclass
class EventPrinter:
    """Renders run events as they arrive; streamed reply text is written inline."""

    out: Console
    _inline: bool = False
    _streamed: set[str] = field(default_factory=set)  # runs whose reply text arrived as deltas
    # Phase changes come from the owner, deltas from the planner: one may land mid-sentence.
    _deferred: list[Text] = field(default_factory=list)
    _tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (input, output) so far

    def _line(self, text: Text) -> None:
        self.end_inline()
        self.out.print(text)

    def end_inline(self) -> None:
        """Finish a line of streamed text, then print the phase changes held back meanwhile."""
        if self._inline:
            self.out.print()
            self._inline = False
        for text in self._deferred:
            self.out.print(text)
        self._deferred.clear()

    def show(self, event: RunEvent) -> None:
        """Print one event."""
        kind, payload = event.type, event.payload
        if kind is StreamEventType.ASSISTANT_REPLY:
            chunk = payload.get("text", payload.get("delta", ""))
            if isinstance(chunk, str) and chunk:
                self.out.print(Text(chunk), end="", soft_wrap=True)
                self._inline = True
                self._streamed.add(event.run_id)
        elif kind is StreamEventType.ASSISTANT_TURN:
            self._assistant_turn(event)
        elif kind is StreamEventType.WORKFLOW:
            self._workflow(event.run_id, payload)
        elif kind is StreamEventType.USAGE:
            self._count_tokens(event.run_id, payload)
        elif kind.value.startswith("await_"):
            self._line(Text(f"? {_prompt_of(event)}", style="bold yellow"))
        elif kind is StreamEventType.CHILD_RUN_LINKED:
            self._line(
                Text(
                    f"↳ {payload.get('tool_name', '?')}: child run {payload.get('child_run_id', '?')} "
                    f"({payload.get('child_agent_id', '?')})",
                    style="cyan",
                )
            )
        elif kind in (StreamEventType.TOOL_START, StreamEventType.TOOL_END, StreamEventType.TOOL_UPDATE):
            name = payload.get("tool_name") or payload.get("name") or ""
            self._line(Text(f"⚙ {kind.value} {name} {_compact(payload)}", style="cyan"))
        elif kind is StreamEventType.RUN_STREAM_END:
            self.end_inline()
        else:
            self._line(Text(f"· {kind.value} {_compact(payload)}", style="dim"))

    def _assistant_turn(self, event: RunEvent) -> None:
        message = event.payload.get("message")
        parts = message.get("parts", []) if isinstance(message, dict) else []
        streamed = event.run_id in self._streamed
        self._streamed.discard(event.run_id)  # the next step streams its own text
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("kind") == "text" and not streamed and part.get("text"):
                self._line(Text(str(part["text"])))
            elif part.get("kind") == "tool_use":
                self._line(Text(f"→ {part.get('name', '?')} {_compact(part.get('input'))}", style="cyan"))
        self.end_inline()

    def _count_tokens(self, run_id: str, usage: dict[str, Any]) -> None:
        seen_in, seen_out = self._tokens.get(run_id, (0, 0))
        taken, given = usage.get("input_tokens"), usage.get("output_tokens")
        if isinstance(taken, int) and isinstance(given, int):
            self._tokens[run_id] = (seen_in + taken, seen_out + given)

    def _workflow(self, run_id: str, payload: dict[str, Any]) -> None:
        phase = str(payload.get("phase", ""))
        failure = payload.get("failure") or {}
        reason = (payload.get("cancellation") or {}).get("reason", "")
        if phase == RunPhase.COMPLETED.value:
            self._closing_line(run_id, Text("✓ completed", style="bold green"))
        elif phase == RunPhase.FAILED.value:
            failed = f"✗ failed: {failure.get('message', '')}".rstrip(": ")
            self._closing_line(run_id, Text(failed, style="bold red"))
        elif phase == RunPhase.CANCELED.value:
            self._closing_line(
                run_id, Text(f"✗ canceled{f' ({reason})' if reason else ''}", style="bold yellow")
            )
        elif phase == RunPhase.SUSPENDED.value:
            self._closing_line(run_id, Text("⏸ waiting for an answer", style="bold yellow"))
        elif self._inline:
            self._deferred.append(Text(f"· {phase}", style="dim italic"))
        else:
            self._line(Text(f"· {phase}", style="dim italic"))

    def _closing_line(self, run_id: str, line: Text) -> None:
        """The run's end, with the tokens its model calls took when their usage was streamed."""
        if run_id in self._tokens:
            taken, given = self._tokens.pop(run_id)
            line.append(f"  {taken:,} tokens in, {given:,} out", style="dim")
        self._line(line)


@dataclass
class RunEnd:
    """How a followed run closed: its phase and the questions it waits on."""

    phase: str
    awaiting: list[RunEvent]


class RunFollower:
    """The events of one run at a time, in order, from a session's reader; none of a batch is lost."""

    def __init__(self, reader: RunEventReader, printer: EventPrinter) -> None:
        self.reader = reader
        self.printer = printer
        self._buffer: collections.deque[RunEvent] = collections.deque()

    async def next(self, run_id: str, timeout_s: float) -> RunEvent | None:
        """The run's next event, or None when none came within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._buffer:
                event = self._buffer.popleft()
                if event.run_id == run_id:
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            batch = await self.reader.read(timeout_s=min(remaining, 0.5))
            self._buffer.extend(streamed.event for streamed in batch)

    async def until_closed(self, run_id: str, *, timeout_s: float, hint_after_s: float = 8.0) -> RunEnd:
        """Show the run's events until its `run_stream_end`; raise CliError after `timeout_s`."""
        started = time.monotonic()
        phase, awaiting, hinted, quiet = "", [], False, True
        while True:
            event = await self.next(run_id, timeout_s=0.5)
            waited = time.monotonic() - started
            if event is None:
                if quiet and not hinted and waited > hint_after_s:
                    hinted = True
                    self.printer.end_inline()
                    errors.print(Text("… no event yet: is the planner running? (`quipu up`)", style="dim"))
                if waited > timeout_s:
                    self.printer.end_inline()
                    raise CliError(f"run {run_id} did not finish within {timeout_s:g} s")
                continue
            quiet = False
            self.printer.show(event)
            if event.type.value.startswith("await_"):
                awaiting.append(event)
            elif event.type is StreamEventType.WORKFLOW and _terminal_phase(event):
                phase = str(event.payload["phase"])
            elif event.type is StreamEventType.RUN_STREAM_END:
                return RunEnd(phase=phase, awaiting=awaiting)

    async def questions(
        self, run_id: str, awaiting: list[RunEvent], expected: int, within_s: float = 10.0
    ) -> list[RunEvent]:
        """The suspended run's `await_*` events, `expected` of them.

        The planner publishes them once the suspension has committed, so they may come after the
        run's `run_stream_end`. Whatever arrived after `within_s` is what is asked.
        """
        questions = list(awaiting)
        deadline = time.monotonic() + within_s
        while len(questions) < expected:
            event = await self.next(run_id, timeout_s=deadline - time.monotonic())
            if event is None:
                break
            if event.type.value.startswith("await_"):
                self.printer.show(event)
                questions.append(event)
        return questions


def _terminal_phase(event: RunEvent) -> bool:
    phase = event.payload.get("phase")
    return phase in {member.value for member in RunPhase} and RunPhase(phase).terminal


async def pending_inputs(store: KafkaStore, run_id: str) -> int:
    """How many inputs the suspended run waits for (its last `run_suspended` record says)."""
    pending, cursor = 1, ""
    while True:
        page = await store.list_run_records(run_id, cursor, 500)
        for record in page.records:
            if record.type == LifecycleType.RUN_SUSPENDED.value:
                pending = decode_run_suspended(record.payload).pending_count
        if not page.next_cursor:
            return pending
        cursor = page.next_cursor


def _choices(question: RunEvent) -> list[str]:
    details = question.payload.get("details")
    for source in (question.payload, details if isinstance(details, dict) else {}):
        choices = source.get("choices")
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            return choices
    return []


def _ask(question: RunEvent) -> Any:
    """Ask one question on the terminal (blocking: call through a thread); it was printed already."""
    if question.type is StreamEventType.AWAIT_CONFIRMATION:
        return typer.confirm("  confirm")
    choices = _choices(question)
    while choices:
        given = str(typer.prompt(f"  your choice ({'/'.join(choices)})")).strip()
        matching = [choice for choice in choices if choice.lower().startswith(given.lower())]
        if given in choices or len(matching) == 1:
            return given if given in choices else matching[0]
    return typer.prompt("  your answer")


async def _answers(awaiting: list[RunEvent]) -> Any:
    """The user's answer: one value, or one per waiting tool use keyed by its id."""
    if not awaiting:  # no question was published: ask without one
        return await asyncio.to_thread(typer.prompt, "The run waits for your answer")
    if len(awaiting) == 1:
        return await asyncio.to_thread(_ask, awaiting[0])
    answers: dict[str, Any] = {}
    for question in awaiting:
        console.print(Text(f"? {_prompt_of(question)}", style="bold yellow"))
        key = str(question.payload.get("tool_use_id") or question.event_key)
        answers[key] = await asyncio.to_thread(_ask, question)
    return answers


async def drive(
    kafka: KafkaSettings,
    store: KafkaStore,
    publisher: KafkaRunPublisher,
    request: RunRequested,
    *,
    interactive: bool,
    timeout_s: float,
) -> int:
    """Publish `request`, show its run live, answer suspensions when interactive; the exit code."""
    reader = RunEventReader(kafka, session_id=request.session_id, run_id=request.run_id, client_id=CLIENT_ID)
    await reader.start(start_at=StartAt.NOW)  # positioned before publishing: nothing is missed
    printer = EventPrinter(console)
    follower = RunFollower(reader, printer)
    try:
        while True:
            await publisher.publish(request)
            console.print(
                Text(f"run {request.run_id} · session {request.session_id or '(none)'}", style="dim")
            )
            end = await follower.until_closed(request.run_id, timeout_s=timeout_s)
            if end.phase == RunPhase.COMPLETED.value:
                return 0
            if end.phase != RunPhase.SUSPENDED.value:
                return EXIT_FAILED
            expected = await pending_inputs(store, request.run_id)
            awaiting = await follower.questions(request.run_id, end.awaiting, expected)
            if not interactive:
                console.print(Text(f'answer with: quipu answer {request.run_id} "…"', style="yellow"))
                return EXIT_WAITING
            answer = await _answers(awaiting)
            request = resume_request(
                await store.load_run(request.run_id), answer, tenant_id=request.tenant_id
            )
    finally:
        printer.end_inline()
        await reader.stop()


async def ensure_session(store: KafkaStore, session_id: str) -> Session:
    """The session, created when it does not exist yet; an ended one is refused."""
    try:
        session = await store.load_session_status(session_id)
    except StoreError as error:
        if error.code is not ErrorCode.SESSION_NOT_FOUND:
            raise
        session = await store.create_session(session_id, utc_now_ms())
    require_open(session)
    return session


def _interactive(flag: bool | None) -> bool:
    return flag if flag is not None else sys.stdin.isatty() and console.is_terminal


# --- client commands --------------------------------------------------------------------------------

SessionOption = Annotated[
    str | None,
    typer.Option("--session", "-s", help="Session to talk in (created if new); default: a new one."),
]
AgentOption = Annotated[str, typer.Option("--agent", "-a", help="Agent that answers.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", min=1, help="Give up after this many seconds.")]
InteractiveOption = Annotated[
    bool | None,
    typer.Option(
        "--interactive/--no-interactive", help="Ask for answers on the terminal (default: when on a TTY)."
    ),
]


@app.command()
def run(
    message: Annotated[str, typer.Argument(help="What you say to the agent.")],
    session: SessionOption = None,
    agent: AgentOption = "assistant",
    principal: Annotated[str, typer.Option("--principal", help="The person the agent acts for.")] = "",
    timeout: TimeoutOption = 300.0,
    interactive: InteractiveOption = None,
) -> None:
    """Send a message to an agent and show the run live: phases, tools, the streamed reply."""
    if not message.strip():
        raise typer.BadParameter("the message is empty", param_hint="MESSAGE")
    kafka = client_settings()
    _quiet_logging()

    async def work() -> int:
        async with connected(kafka) as (store, publisher):
            session_id = session or f"cli-{os.urandom(6).hex()}"
            await ensure_session(store, session_id)
            if session is None:
                console.print(
                    Text(f"new session {session_id} (continue it with --session {session_id})", style="dim")
                )
            body = RunRequest(agent_id=agent, text=message, session_id=session_id, principal_id=principal)
            return await drive(
                kafka,
                store,
                publisher,
                turn_request(body),
                interactive=_interactive(interactive),
                timeout_s=timeout,
            )

    raise typer.Exit(run_command(work))


def _parse_answer(text: str, as_json: bool) -> Any:
    if not as_json:
        return text
    try:
        return json.loads(text)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint="ANSWER") from error


@app.command()
def answer(
    run_id: Annotated[str, typer.Argument(help="The suspended run.")],
    text: Annotated[str, typer.Argument(help="Your answer.")],
    as_json: Annotated[bool, typer.Option("--json", help="The answer is a JSON value.")] = False,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Show the continuation live.")] = True,
    timeout: TimeoutOption = 300.0,
    interactive: InteractiveOption = None,
) -> None:
    """Answer a suspended run: its continuation starts in the same session."""
    value = _parse_answer(text, as_json)
    kafka = client_settings()
    _quiet_logging()

    async def work() -> int:
        async with connected(kafka) as (store, publisher):
            request = resume_request(await store.load_run(run_id), value)
            if follow:
                return await drive(
                    kafka, store, publisher, request, interactive=_interactive(interactive), timeout_s=timeout
                )
            await publisher.publish(request)
            console.print(f"continuation run {request.run_id} requested")
            return 0

    raise typer.Exit(run_command(work))


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    reason: Annotated[CancellationReason, typer.Option(help="Why.")] = CancellationReason.USER_REQUESTED,
) -> None:
    """Ask for a running run to be canceled."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with connected(kafka) as (store, publisher):
            await publisher.publish(cancel_request(await store.load_run(run_id), reason))
        console.print(f"cancellation of {run_id} requested")

    run_command(work)


def _meta_table(meta: RunMeta) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in meta.model_dump(mode="json").items():
        if value not in ("", {}, None):
            table.add_row(name, value if isinstance(value, str) else _compact(value))
    return table


def _message_panel(message: Message) -> Panel:
    lines: list[Text] = []
    for part in message_to_wire(message)["parts"]:
        kind = part.get("kind")
        if kind == "text":
            lines.append(Text(str(part.get("text", ""))))
        elif kind == "thinking":
            lines.append(Text("(thinking)", style="dim italic"))
        elif kind == "tool_use":
            lines.append(Text(f"→ {part.get('name')} {_compact(part.get('input'))}", style="cyan"))
        elif kind == "tool_result":
            style = "red" if part.get("is_error") else "green"
            lines.append(Text(f"← {part.get('tool_use_id')}: {_compact(part.get('content'))}", style=style))
        else:
            lines.append(Text(f"[{kind}]", style="dim"))
    colour = {"user": "blue", "assistant": "green"}.get(message.role, "white")
    return Panel(Group(*lines), title=message.role, title_align="left", border_style=colour)


@runs_app.command("show")
def runs_show(run_id: Annotated[str, typer.Argument(help="The run.")]) -> None:
    """A run's state and its transcript."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        from services.kit.transcript import build_messages_from_run_log  # noqa: PLC0415 - only here

        async with KafkaStore(kafka) as store:
            meta = await store.load_run(run_id)
            try:
                messages: list[Message] | str = await build_messages_from_run_log(store, run_id)
            except TranscriptError as error:
                messages = str(error)
        console.print(Panel(_meta_table(meta), title=f"run {run_id}", title_align="left"))
        if isinstance(messages, str):
            console.print(Text(f"no transcript: {messages}", style="dim"))
            return
        for message in messages:
            console.print(_message_panel(message))

    run_command(work)


def _session_line(session: Session) -> Text:
    when = format_timestamp(session.ended_at or session.created_at)
    return Text(f"session {session.session_id}: {session.status.value} since {when}")


@sessions_app.command("show")
def sessions_show(session_id: Annotated[str, typer.Argument(help="The session.")]) -> None:
    """A session's status and its runs."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaStore(kafka) as store:
            session = await store.load_session_status(session_id)
            runs = await store.list_runs_by_session(session_id, [])
        console.print(_session_line(session))
        table = Table("run", "agent", "status", "started")
        for meta in runs:
            table.add_row(meta.run_id, meta.agent_id, meta.status.value, format_timestamp(meta.started_at))
        if runs:
            console.print(table)

    run_command(work)


@sessions_app.command("end")
def sessions_end(session_id: Annotated[str, typer.Argument(help="The session.")]) -> None:
    """End a session: running runs may finish; new runs stop at once."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaStore(kafka) as store:
            session = await store.end_session(session_id, utc_now_ms())
        console.print(_session_line(session))

    run_command(work)


@sessions_app.command("purge")
def sessions_purge(
    session_id: Annotated[str, typer.Argument(help="The session (ended, no run running).")],
) -> None:
    """Delete an ended session and all its runs for good; its id can never be used again."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaStore(kafka) as store:
            await store.purge_session(session_id)
        console.print(f"session {session_id}: purged")

    run_command(work)


# --- memory -----------------------------------------------------------------------------------------

PrincipalArgument = Annotated[str, typer.Argument(help="The person (principal id).")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant of the principal.")]
MemoryAgentOption = Annotated[
    str, typer.Option("--agent", "-a", help="Only this agent's facts and the principal-wide ones.")
]


@memory_app.command("list")
def memory_list(
    principal: PrincipalArgument, tenant: TenantOption = "", agent: MemoryAgentOption = ""
) -> None:
    """The person's current facts, with the session and turn each came from."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaMemoryStore.connect(kafka) as memory:
            facts = await memory.list_facts(
                MemoryScope(tenant_id=tenant, principal_id=principal, agent_id=agent)
            )
        if not facts:
            console.print(Text(f"nothing remembered about {principal}", style="dim"))
        for fact in facts:
            console.print(Text.assemble((fact.fact_id, "bold"), f"  {fact.text}"))
            where = f"session {fact.provenance.session_id}, turn {fact.provenance.turn_id}"
            owner = f"agent {fact.scope.agent_id} · " if fact.scope.agent_id else ""
            updated = format_timestamp(fact.updated_at)
            console.print(Text(f"    {owner}v{fact.version} · from {where} · updated {updated}", style="dim"))

    run_command(work)


@memory_app.command("delete")
def memory_delete(
    principal: PrincipalArgument,
    fact_id: Annotated[str, typer.Argument(help="The fact.")],
    tenant: TenantOption = "",
) -> None:
    """Delete one fact: it leaves retrieval and future prompts at once (its wording stays in the audit)."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        scope = MemoryScope(tenant_id=tenant, principal_id=principal)
        async with KafkaMemoryStore.connect(kafka) as memory:
            await memory.delete_fact(scope, fact_id)
            with contextlib.suppress(StoreError):  # derived: the enricher or a reindex drops it too
                await memory.delete_index_entries(scope, [fact_id])
        console.print(f"fact {fact_id}: deleted")

    run_command(work)


@memory_app.command("export")
def memory_export(
    principal: PrincipalArgument,
    tenant: TenantOption = "",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Everything remembered about the person (facts, previous versions, profile) as JSON."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaMemoryStore.connect(kafka) as memory:
            exported = await memory.export_principal(MemoryScope(tenant_id=tenant, principal_id=principal))
        text = exported.model_dump_json(indent=2)
        if output is None:
            print(text)
        else:
            output.write_text(text + "\n")
            console.print(f"written to {output}")

    run_command(work)


@memory_app.command("forget")
def memory_forget(
    principal: PrincipalArgument,
    tenant: TenantOption = "",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Forget the person: facts, audit, profile, history, summaries and index entries, for good."""
    if not yes and not typer.confirm(f"Erase everything Quipu remembers about {principal}?"):
        raise typer.Exit(EXIT_FAILED)
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        async with KafkaMemoryStore.connect(kafka) as memory:
            erased = await memory.forget_principal(tenant, principal)
        console.print(f"{principal}: forgotten ({erased} documents erased)")

    run_command(work)


@memory_app.command("reindex")
def memory_reindex(
    principal: Annotated[str | None, typer.Option("--principal", help="Only this person.")] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="Tenant (with --principal: default ''; else: every tenant)."),
    ] = None,
) -> None:
    """Rebuild the derived retrieval index from curated memory (the authority)."""
    kafka = client_settings()
    _quiet_logging()

    async def work() -> None:
        if principal is not None:
            principals = [Principal(tenant_id=tenant or "", principal_id=principal)]
        else:
            try:
                principals = await principals_from_changes(kafka, tenant_id=tenant)
            except TimeoutError as error:
                raise CliError(str(error)) from error
        async with KafkaMemoryStore.connect(kafka) as memory:
            report = await reindex(memory, principals)
        console.print(
            f"reindexed {report.principals} principal(s): {report.indexed} entries written, "
            f"{report.dropped} dropped"
        )

    run_command(work)


# --- running services -------------------------------------------------------------------------------


def _module_name(service: str) -> str:
    return service.replace("-", "_")


@app.command()
def serve(
    service: Annotated[str, typer.Argument(help="storage-owner, planner, tool-executor, gateway, …")],
) -> None:
    """Run one service alone against QUIPU_KAFKA_* (and QUIPU_MONGO_* for the owner)."""
    name = _module_name(service)
    if name not in (*SERVICES, GATEWAY):
        raise typer.BadParameter(
            f"unknown service {service!r}; one of: {', '.join((*SERVICES, GATEWAY))}", param_hint="SERVICE"
        )
    if not _installed(name):
        fail(f"service {service!r} is not part of this installation yet")
    runpy.run_module(f"services.{name}", run_name="__main__", alter_sys=True)


@dataclass
class Started:
    """A service started by `quipu up`, and how to stop it."""

    name: str
    stop: Callable[[], Any]


def _warn(message: str) -> None:
    errors.print(Text(f"warning: {message}", style="yellow"))


def _installed(name: str) -> bool:
    """Whether the service package exists (services are built in parallel; some may not yet)."""
    return importlib.util.find_spec(f"services.{name}") is not None


def _load_service(name: str) -> Any | None:
    """The service's `create_app`, or None (with a warning) when the package is not there yet."""
    if not _installed(name):
        _warn(f"{name}: not part of this installation yet; skipped")
        return None
    try:
        module = importlib.import_module(f"services.{name}.app")
    except Exception as error:
        _warn(f"{name}: cannot be imported ({error!r}); skipped")
        return None
    return getattr(module, "create_app", None)


async def _start_in_process(
    kafka: KafkaSettings, mongo: MongoSettings, gateway_port: int, started: list[Started]
) -> str:
    gateway_url = ""
    for name in SERVICES:
        create_app = _load_service(name)
        if create_app is None:
            continue
        try:
            service = create_app(kafka, mongo) if name == "storage_owner" else create_app(kafka)
            await service.start()
        except Exception as error:
            _warn(f"{name}: did not start ({error!r}); skipped")
            continue
        started.append(Started(name, service.stop))
        console.print(Text(f"  ✓ {name}", style="green"))
    if _load_service(GATEWAY) is not None:
        from services.gateway.app import EmbeddedServer  # noqa: PLC0415 - lazily, like every service
        from services.gateway.app import create_app as create_gateway  # noqa: PLC0415
        from services.gateway.settings import GatewaySettings  # noqa: PLC0415

        settings = GatewaySettings(port=gateway_port)
        server = EmbeddedServer(create_gateway(kafka, settings=settings), settings.host, settings.port)
        try:
            await server.start()
        except Exception as error:
            _warn(f"gateway: did not start ({error}); skipped")
            return ""
        started.append(Started(GATEWAY, server.stop))
        gateway_url = server.url
        console.print(Text(f"  ✓ gateway on {gateway_url} (API docs at {gateway_url}/docs)", style="green"))
    return gateway_url


async def _start_processes(environment: dict[str, str], started: list[Started]) -> None:
    from deploy.local.services import ServiceProcess  # noqa: PLC0415 - only for --processes

    for name in (*SERVICES, GATEWAY):
        if not _installed(name) or importlib.util.find_spec(f"services.{name}.__main__") is None:
            _warn(f"{name}: not part of this installation yet; skipped")
            continue
        process = ServiceProcess(f"services.{name}", environment).start()
        started.append(Started(name, functools.partial(asyncio.to_thread, process.stop)))
        console.print(
            Text(f"  ✓ {name} (pid {process.process.pid if process.process else '?'})", style="green")
        )


async def _up(gateway_port: int, processes: bool) -> None:
    from deploy.local.stack import EmbeddedStack, create_topics  # noqa: PLC0415 - only `up` needs it

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    console.print(Text("starting the embedded broker and database…", style="dim"))
    async with EmbeddedStack() as stack:
        kafka = KafkaSettings(bootstrap=stack.bootstrap, flavour=stack.kafka_flavour, client_id="quipu")
        mongo = MongoSettings(uri=stack.mongo_uri)
        await create_topics(stack.bootstrap, kafka.topic_prefix)
        environment = {**stack.environment(), "QUIPU_KAFKA_TOPIC_PREFIX": kafka.topic_prefix}
        started: list[Started] = []
        path = state_file()
        try:
            if processes:
                environment["QUIPU_GATEWAY_PORT"] = str(gateway_port)
                await _start_processes(environment, started)
                gateway_url = f"http://127.0.0.1:{gateway_port}"
            else:
                gateway_url = await _start_in_process(kafka, mongo, gateway_port, started)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps({"pid": os.getpid(), "environment": environment, "gateway_url": gateway_url})
            )
            console.print(
                Panel(
                    Group(
                        Text(f"kafka {stack.bootstrap} · mongodb {stack.mongo_uri.split('?')[0]}"),
                        Text(f"gateway {gateway_url or '(not started)'}"),
                        Text('in another terminal: quipu run "hello"', style="bold"),
                        Text(
                            "other programs: " + " ".join(f"{k}={v}" for k, v in environment.items()),
                            style="dim",
                        ),
                        Text("Ctrl-C stops everything", style="dim"),
                    ),
                    title="quipu is up",
                    title_align="left",
                    border_style="green",
                )
            )
            await stop.wait()
        finally:
            console.print(Text("stopping…", style="dim"))
            for service in reversed(started):
                try:
                    await service.stop()
                except Exception as error:
                    _warn(f"{service.name}: {error!r} while stopping")
            with contextlib.suppress(OSError):
                path.unlink()
    console.print(Text("stopped", style="dim"))


@app.command()
def up(
    gateway_port: Annotated[int, typer.Option("--gateway-port", help="Port of the HTTP gateway.")] = 8080,
    processes: Annotated[
        bool, typer.Option("--processes", help="One process per service instead of all in this one.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    """Start the embedded broker and database and every service; Ctrl-C stops them all."""
    _quiet_logging(verbose)
    asyncio.run(_up(gateway_port, processes))


def main() -> None:
    """Entry point of `python -m services.cli`."""
    app()


if __name__ == "__main__":
    main()
