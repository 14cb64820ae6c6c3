"""The tool executor's domain logic: run one tool call to exactly one result; no broker, no I/O.

`ToolRunner.run(request)` validates the arguments against the catalog, runs the tool's
implementation (a `quipu.tools.Tool`'s `run`, or any `ToolImplementation`) under its deadline and
concurrency limit, and turns whatever happens (content, a request for outside input, a bad
argument, an error, a timeout, an oversized result) into one `ToolCallCompleted`; or None when
the run was canceled (a canceled call answers nothing: the planner has abandoned it).
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel

from quipu.contracts.envelope import derive_id
from quipu.contracts.tools import AwaitInput, ToolCallCompleted, ToolCallRequested
from quipu.contracts.transcript import (
    TOOL_RESULT_MAX_BYTES,
    TranscriptError,
    bounded_tool_result,
    encode_json_value,
)
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.tool_catalog import ArgumentError, ToolCatalog, ToolDefinition
from quipu.services.kit.logging import REDACTED, SECRET_VALUE_PATTERN, get_logger
from quipu.tools import Cancellation, ToolContext, ToolError, ToolImplementation

logger = get_logger(__name__)

ERROR_TEXT_LIMIT = 2000
"""Longest error text given back to the model."""

PREVIEW_CHARS = 1000
"""How much of an oversized result's JSON is kept as the omission's preview."""


class CompletedCalls(Protocol):
    """The results already given, by (run id, tool_use id): a redelivered call is answered from here."""

    def get(self, run_id: str, tool_use_id: str) -> ToolCallCompleted | None:
        """The result given for this tool use, if it is remembered."""
        ...

    def put(self, result: ToolCallCompleted) -> None:
        """Remember a result."""
        ...


# --- one call to one result -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one execution produced: content, or an error text, or a request for outside input."""

    content: Any = None
    is_error: bool = False
    awaiting: AwaitInput | None = None
    duration_ms: float = 0.0
    # Stamped once, when the execution ends: a duplicate sharing the execution gets the same event.
    finished_at: datetime = field(default_factory=utc_now_ms)

    @classmethod
    def error(cls, text: str, duration_ms: float = 0.0) -> Outcome:
        """A failure the model reads: a non-empty text without secrets, at most ERROR_TEXT_LIMIT long."""
        cleaned = SECRET_VALUE_PATTERN.sub(REDACTED, text).strip() or "the tool failed"
        if len(cleaned) > ERROR_TEXT_LIMIT:
            cleaned = cleaned[: ERROR_TEXT_LIMIT - 1] + "…"
        return cls(content=bounded_tool_result(cleaned, True), is_error=True, duration_ms=duration_ms)


FRAMES_LOGGED = 8
"""How many of a failing tool's innermost frames its log line shows."""


def frames(error: BaseException) -> list[str]:
    """Where an exception was raised, innermost last: `file:line in function`, never a value."""
    stack = traceback.extract_tb(error.__traceback__)[-FRAMES_LOGGED:]
    return [f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in stack]


def describe_failure(tool_name: str, error: BaseException) -> str:
    """The text of an exception for the model: its type and message, never a traceback."""
    if isinstance(error, ToolError):
        return str(error) or f"{tool_name} failed"
    message = str(error)
    kind = type(error).__name__
    return f"{tool_name} failed: {kind}: {message}" if message else f"{tool_name} failed: {kind}"


def result_content(value: Any) -> Any:
    """Content for the wire: plain JSON when it fits in 64 KiB, else the omission marker.

    The transcript keeps numbers exact as `Decimal`, which pydantic would write to JSON as a
    string; the wire carries the plain JSON value instead, and the planner's transcript parts
    turn it exact again. Raises TranscriptError for a value that is not JSON.
    """
    encoded = encode_json_value(value)
    if len(encoded) <= TOOL_RESULT_MAX_BYTES:
        return json.loads(encoded)
    preview = encoded[:PREVIEW_CHARS].decode("utf-8", errors="ignore")
    return bounded_tool_result(
        value,
        False,
        preview=preview,
        bounds={"size_bytes": len(encoded), "limit_bytes": TOOL_RESULT_MAX_BYTES},
    )


def completed(request: ToolCallRequested, outcome: Outcome) -> ToolCallCompleted:
    """The one result of `request`; its event id derives from the request's, so a retry repeats it."""
    return ToolCallCompleted(
        event_id=derive_id(request.event_id, "result"),
        tenant_id=request.tenant_id,
        correlation_id=request.correlation_id,
        causation_id=request.event_id,
        run_id=request.run_id,
        session_id=request.session_id,
        agent_id=request.agent_id,
        tool_use_id=request.tool_use_id,
        tool_name=request.tool_name,
        content=outcome.content,
        is_error=outcome.is_error,
        awaiting=outcome.awaiting,
        duration_ms=round(outcome.duration_ms, 3),
        occurred_at=outcome.finished_at,
    )


class _BoundedSet:
    """A set that forgets its oldest members beyond `capacity`."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, None] = OrderedDict()

    def add(self, item: str) -> None:
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items


CallKey = tuple[str, str]
"""(run id, tool_use id): one tool use."""


@dataclass(frozen=True)
class _Execution:
    """One tool use running: its task, and the signal a tool in a thread watches."""

    task: asyncio.Task[Outcome]
    cancellation: Cancellation


def context_of(request: ToolCallRequested, seconds: float, cancellation: Cancellation) -> ToolContext:
    """What the tool is told of its call: who it is for, its deadline `seconds` from now, its signal."""
    return ToolContext(
        run_id=request.run_id,
        tool_use_id=request.tool_use_id,
        session_id=request.session_id,
        agent_id=request.agent_id,
        principal_id=request.principal_id,
        tenant_id=request.tenant_id,
    ).with_deadline(seconds, cancellation)


class ToolRunner:
    """Runs tool calls: each to exactly one result, under its deadline and concurrency limit.

    Idempotence: a call already answered is answered again from `completed` without running
    the tool a second time (a redelivered `notes set` must not write again), and a duplicate of
    a call still running waits for that one execution. The record is in process and bounded:
    enough for the shipped tools, because the planner also never re-requests a tool use it has
    a result for; a tool with effects beyond this process needs a durable record keyed the same.
    """

    def __init__(
        self,
        catalog: ToolCatalog,
        implementations: Mapping[str, ToolImplementation],
        completed_calls: CompletedCalls,
        *,
        max_timeout_s: float,
        canceled_runs_capacity: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = ToolCatalog()
        self._implementations: dict[str, ToolImplementation] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self.serve(catalog, implementations)
        self._completed = completed_calls
        self._max_timeout_s = max_timeout_s
        self._clock = clock
        self._canceled_runs = _BoundedSet(canceled_runs_capacity)
        self._running: dict[CallKey, _Execution] = {}
        self._running_by_run: dict[str, set[CallKey]] = {}

    @property
    def catalog(self) -> ToolCatalog:
        """The tools this runner runs."""
        return self._catalog

    def serve(self, catalog: ToolCatalog, implementations: Mapping[str, ToolImplementation]) -> None:
        """Run these tools from now on (an MCP server's changed list); a call already running ends
        with the tool it started with, and a tool kept with its concurrency keeps its slots.

        Raises ValueError when the catalog and the implementations do not name the same tools.
        """
        runnable = {definition.name for definition in catalog if not definition.is_agent_tool}
        if missing := runnable - set(implementations):
            raise ValueError(f"tools without an implementation: {sorted(missing)}")
        if unknown := set(implementations) - runnable:
            raise ValueError(f"implementations of tools the catalog does not run: {sorted(unknown)}")
        kept = {
            name
            for name in runnable & set(self._limits)
            if self._catalog.get(name).max_concurrency == catalog.get(name).max_concurrency
        }
        self._limits = {
            name: self._limits[name] if name in kept else asyncio.Semaphore(catalog.get(name).max_concurrency)
            for name in runnable
        }
        self._catalog = catalog
        self._implementations = dict(implementations)

    # -- cancellation --

    def cancel_run(self, run_id: str) -> int:
        """Cancel the run's calls in flight and refuse its later ones; returns how many were canceled."""
        self._canceled_runs.add(run_id)
        executions = [self._running[key] for key in self._running_by_run.get(run_id, set())]
        for execution in executions:
            execution.cancellation.set()  # for a tool running in a thread, which no cancel reaches
            execution.task.cancel()
        return len(executions)

    def is_canceled(self, run_id: str) -> bool:
        """Whether a cancel for this run was seen (remembered for the last canceled runs only)."""
        return run_id in self._canceled_runs

    def running(self) -> int:
        """Calls executing now."""
        return len(self._running)

    # -- running --

    async def run(self, request: ToolCallRequested) -> ToolCallCompleted | None:
        """The one result of `request`, or None when its run is canceled (nothing to publish)."""
        if self.is_canceled(request.run_id):
            return None
        key = (request.run_id, request.tool_use_id)
        remembered = self._completed.get(*key)
        if remembered is not None:
            # Same request (a redelivery): the very same event. Another request for the same tool
            # use gets the same answer under its own event id.
            return remembered.model_copy(
                update={"event_id": derive_id(request.event_id, "result"), "causation_id": request.event_id}
            )
        running = self._running.get(key)
        owner = running is None
        task = self._start(key, request) if running is None else running.task
        try:
            # A duplicate must not cancel the execution it shares when it is itself canceled.
            outcome = await (task if owner else asyncio.shield(task))
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not self.is_canceled(request.run_id):
                raise  # shutdown: the call stays uncommitted and is delivered again
            return None
        result = completed(request, outcome)
        if owner:
            self._completed.put(result)
        return result

    def _start(self, key: CallKey, request: ToolCallRequested) -> asyncio.Task[Outcome]:
        cancellation = Cancellation()
        task = asyncio.create_task(
            self._execute(request, cancellation), name=f"tool {request.tool_name} {key[1]}"
        )
        self._running[key] = _Execution(task, cancellation)
        self._running_by_run.setdefault(key[0], set()).add(key)

        def forget(_done: asyncio.Task[Outcome]) -> None:
            self._running.pop(key, None)
            siblings = self._running_by_run.get(key[0])
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._running_by_run[key[0]]

        task.add_done_callback(forget)
        return task

    async def _execute(self, request: ToolCallRequested, cancellation: Cancellation) -> Outcome:
        definition = self._catalog.find(request.tool_name)
        if definition is None:
            available = ", ".join(self._catalog.names())
            return Outcome.error(f"unknown tool {request.tool_name!r}; available tools: {available}")
        if definition.is_agent_tool:
            return Outcome.error(f"{definition.name} is an agent-tool: the planner runs it, not the executor")
        try:
            arguments = definition.parse_arguments(request.input)
        except ArgumentError as error:
            return Outcome.error(str(error))
        return await self._invoke(definition, arguments, request, cancellation)

    def deadline(self, definition: ToolDefinition, request: ToolCallRequested) -> float:
        """Seconds one call may take: the request's override or the tool's own, capped by the executor."""
        wanted = request.timeout_s if request.timeout_s and request.timeout_s > 0 else definition.timeout_s
        return min(wanted, self._max_timeout_s)

    async def _invoke(
        self,
        definition: ToolDefinition,
        arguments: BaseModel,
        request: ToolCallRequested,
        cancellation: Cancellation,
    ) -> Outcome:
        implementation = self._implementations[definition.name]
        limit = self._limits[definition.name]
        seconds = self.deadline(definition, request)
        context = context_of(request, seconds, cancellation)
        started: float | None = None
        # The deadline covers waiting for a slot too: every call ends within it, which bounds how
        # long the executor holds a message. It cannot interrupt a tool that computes without
        # awaiting; such tools (the calculator) bound their own work instead.
        timer = asyncio.timeout(seconds)
        try:
            async with timer, limit:
                started = self._clock()
                value = await implementation(arguments, context)
        except TimeoutError as error:
            if not timer.expired():  # the tool's own timeout (a slow upstream), not ours
                return Outcome.error(describe_failure(definition.name, error), self._elapsed(started))
            cancellation.set()  # nobody waits any more: a tool in a thread can stop early
            waited = "waiting for a free slot" if started is None else "running"
            return Outcome.error(
                f"{definition.name} timed out after {seconds:g} s ({waited})", self._elapsed(started)
            )
        except ToolError as error:
            return Outcome.error(describe_failure(definition.name, error), self._elapsed(started))
        except Exception as error:
            # A defect of the tool, not a message for the model: its type and frames go to the log
            # (never the arguments, which may hold anything the model was told).
            logger.warning(
                "tool raised", tool_name=definition.name, error_type=type(error).__name__, at=frames(error)
            )
            return Outcome.error(describe_failure(definition.name, error), self._elapsed(started))
        return self._outcome(definition, value, self._elapsed(started))

    def _elapsed(self, started: float | None) -> float:
        return 0.0 if started is None else (self._clock() - started) * 1000

    @staticmethod
    def _outcome(definition: ToolDefinition, value: Any, duration_ms: float) -> Outcome:
        if definition.awaits_input:
            if not isinstance(value, AwaitInput):
                return Outcome.error(f"{definition.name} did not ask for input", duration_ms)
            return Outcome(awaiting=value, duration_ms=duration_ms)
        if isinstance(value, AwaitInput):
            return Outcome.error(f"{definition.name} asked for input but is not declared to", duration_ms)
        try:
            return Outcome(content=result_content(value), duration_ms=duration_ms)
        except TranscriptError as error:
            return Outcome.error(f"{definition.name} returned a value that is not JSON: {error}", duration_ms)
