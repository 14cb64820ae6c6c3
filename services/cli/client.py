"""The client commands' work: store calls through the owner, run requests, events followed live.

They talk to the system as any Python program does, through `quipu.Client` (requests built and
published as the gateway builds and publishes them, the store through the storage owner), and
follow `runs.events` through the same `RunEventReader` as the gateway's SSE endpoint, so they
show the same events. When something does not answer, they say what they
observed (no reply, or no consumer in the group) instead of guessing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import typer
from pydantic import ValidationError
from rich.text import Text

from quipu.client import Client
from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.topics import Topic
from quipu.services.cli.output import EXIT_FAILED, EXIT_WAITING, CliError, console, errors, fail
from quipu.services.cli.render import EventPrinter, prompt_of
from quipu.services.cli.settings import CliSettings
from quipu.services.cli.state import CLIENT_ID
from quipu.services.domain.run_requests import RequestRefusedError
from quipu.services.kit.run_events import EventStreamError, RunEventReader, StartAt
from quipu.services.kit.settings import KafkaSettings
from quipu.services.kit.store_client import KafkaStore

Diagnosis = Callable[[], Coroutine[Any, Any, str]]
"""Looks at the broker and says, in a few words, what it sees."""


def store_client(kafka: KafkaSettings, settings: CliSettings) -> KafkaStore:
    """A store client with the CLI's reply timeout and attempts."""
    return KafkaStore.for_service(kafka, settings)


@contextlib.asynccontextmanager
async def connected(kafka: KafkaSettings, settings: CliSettings | None = None) -> AsyncIterator[Client]:
    """A `quipu.Client` for one command, with the CLI's store timeouts."""
    async with Client(kafka, store_settings=settings or CliSettings(), client_id=CLIENT_ID) as client:
        yield client


Work = Callable[[], Coroutine[Any, Any, Any]]
"""A command's coroutine (run on its own event loop, as a command from a shell does)."""


def run_command(work: Work, kafka: KafkaSettings, settings: CliSettings) -> Any:
    """Run a command's coroutine; report store and stream failures in one line, with what was seen."""
    try:
        return asyncio.run(work())
    except StoreError as error:
        if error.code is not ErrorCode.UNAVAILABLE:
            fail(f"{error.code.value}: {error.message}")
        waited = (
            f"no reply within {settings.store_attempts} x {settings.store_reply_timeout_s:g} s "
            "(QUIPU_CLI_STORE_ATTEMPTS x QUIPU_CLI_STORE_REPLY_TIMEOUT_S)"
        )
        seen = asyncio.run(owner_diagnosis(kafka, settings)())
        fail(f"{error.code.value}: {error.message}: {waited}; {seen}")
    except RequestRefusedError as error:
        fail(f"{error.code}: {error.message}")
    except (CliError, EventStreamError) as error:
        fail(str(error))


def owner_diagnosis(kafka: KafkaSettings, settings: CliSettings) -> Diagnosis:
    """What the storage owner's consumer group shows (members, lag), in a few words."""

    async def diagnose() -> str:
        from quipu.services.cli.status import observe_consumer  # noqa: PLC0415 - only when something is wrong

        return await observe_consumer(kafka, Topic.STORAGE_COMMANDS, settings.status_timeout_s)

    return diagnose


def planner_diagnosis(kafka: KafkaSettings, settings: CliSettings) -> Diagnosis:
    """What the planner's request group shows (members, lag), in a few words."""

    async def diagnose() -> str:
        from quipu.services.cli.status import observe_consumer  # noqa: PLC0415 - only when something is wrong

        return await observe_consumer(kafka, Topic.RUNS_REQUESTED, settings.status_timeout_s)

    return diagnose


class RunFollower:
    """The events of one run at a time, in order, from a session's reader; none of a batch is lost."""

    def __init__(
        self, reader: RunEventReader, printer: EventPrinter, *, quiet_diagnosis: Diagnosis | None = None
    ) -> None:
        self.reader = reader
        self.printer = printer
        self._quiet_diagnosis = quiet_diagnosis
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
        """Show the run's events until its `run_stream_end`; raise CliError after `timeout_s`.

        When the run stays silent for `hint_after_s`, say so once, with what the diagnosis sees.
        """
        started = time.monotonic()
        phase, awaiting, hinted, quiet = "", [], False, True
        while True:
            event = await self.next(run_id, timeout_s=0.5)
            waited = time.monotonic() - started
            if event is None:
                if quiet and not hinted and waited > hint_after_s:
                    hinted = True
                    await self._say_why_quiet(waited)
                if waited > timeout_s:
                    self.printer.end_inline()
                    raise CliError(f"run {run_id} did not finish within {timeout_s:g} s")
                continue
            quiet = False
            self.printer.show(event)
            if event.type.value.startswith("await_"):
                awaiting.append(event)
            elif event.type is StreamEventType.WORKFLOW and terminal_phase(event):
                phase = str(event.payload["phase"])
            elif event.type is StreamEventType.RUN_STREAM_END:
                return RunEnd(phase=phase, awaiting=awaiting)

    async def _say_why_quiet(self, waited_s: float) -> None:
        self.printer.end_inline()
        seen = f": {await self._quiet_diagnosis()}" if self._quiet_diagnosis is not None else ""
        errors.print(Text(f"… no event of the run after {waited_s:.0f} s{seen}", style="dim"), soft_wrap=True)

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


@dataclass
class RunEnd:
    """How a followed run closed: its phase and the questions it waits on."""

    phase: str
    awaiting: list[RunEvent]


def terminal_phase(event: RunEvent) -> bool:
    """Whether a workflow event closes its run."""
    phase = event.payload.get("phase")
    return phase in {member.value for member in RunPhase} and RunPhase(phase).terminal


def choices_of(question: RunEvent) -> list[str]:
    """The answers a question offers, if it lists them."""
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
    choices = choices_of(question)
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
        console.print(Text(f"? {prompt_of(question)}", style="bold yellow"), soft_wrap=True)
        key = str(question.payload.get("tool_use_id") or question.event_key)
        answers[key] = await asyncio.to_thread(_ask, question)
    return answers


Request = Callable[[], Coroutine[Any, Any, str]]
"""Publishes a run's request through the client and returns the run's id."""


async def drive(
    kafka: KafkaSettings,
    client: Client,
    session_id: str,
    request: Request,
    *,
    interactive: bool,
    timeout_s: float,
    settings: CliSettings | None = None,
) -> int:
    """Publish `request`, show its run live, answer suspensions when interactive; the exit code."""
    settings = settings or CliSettings()
    reader = RunEventReader(kafka, session_id=session_id, client_id=CLIENT_ID)
    await reader.start(start_at=StartAt.NOW)  # positioned before publishing: nothing is missed
    printer = EventPrinter(console)
    follower = RunFollower(reader, printer, quiet_diagnosis=planner_diagnosis(kafka, settings))
    try:
        while True:
            run_id = await request()
            console.print(Text(f"run {run_id} · session {session_id}", style="dim"), soft_wrap=True)
            end = await follower.until_closed(
                run_id, timeout_s=timeout_s, hint_after_s=settings.no_event_hint_s
            )
            if end.phase == RunPhase.COMPLETED.value:
                return 0
            if end.phase != RunPhase.SUSPENDED.value:
                return EXIT_FAILED
            expected = await client.pending_inputs(run_id)
            awaiting = await follower.questions(run_id, end.awaiting, expected)
            if not interactive:
                console.print(Text(f'answer with: quipu answer {run_id} "…"', style="yellow"), soft_wrap=True)
                return EXIT_WAITING
            request = functools.partial(client.answer, run_id, await _answers(awaiting))
    finally:
        printer.end_inline()
        await reader.stop()


def one_line_error(error: ValidationError) -> str:
    """A pydantic error as `field: message` pairs, without the input values."""
    return "; ".join(
        f"{'.'.join(map(str, item['loc'])) or 'value'}: {item['msg']}" for item in error.errors()
    )
