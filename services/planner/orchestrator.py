"""`Planner`, the application layer: it runs the logic's steps over the store, the model and the topics.

Every trigger follows the same pattern: take the run's lock (one run is handled by one task at a
time in this process), write what the message brings, then `advance`: load the run's records,
ask `logic.decide` for the next step, do it, feed the written record back into the view, and
ask again, until the run waits for a message or is closed. Across processes nothing is locked:
deterministic keys decide, and a write that meets another writer's record (EVENT_CONFLICT, or a
run closed meanwhile) makes the planner reload and use what the store holds.

Over 500 lines on purpose: `Planner` is one class whose methods are the steps of one run's loop
(triggers, starts, the model step, the request budget, writing), all under the run's lock and the
one write-and-reload rule; cut apart, the loop would no longer read in order. The I/O it drives
lives in `adapters`, its decisions in `logic`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

import structlog

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.errors import ErrorCode, StoreError, StoreRefusedError
from quipu.contracts.lifecycle import Failure, encode_cancellation_intent
from quipu.contracts.memory import HistoryRole, MemoryScope
from quipu.contracts.runs import CancelRun, RunKind, RunRequested
from quipu.contracts.store import (
    AppendResult,
    LifecycleType,
    LogBasis,
    Record,
    RunStatus,
    SessionStatus,
    StartOutcome,
    StartResult,
)
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.transcript import (
    Message,
    ToolUsePart,
    TranscriptError,
)
from quipu.contracts.wire import to_millisecond, utc_now_ms
from quipu.services.domain.agents import AgentRegistry, UnknownAgentError
from quipu.services.domain.memory.context import (
    ContextBlocks,
    ContextSource,
    history_principal,
    run_sealing_principal,
)
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.memory.summary import Summarizer, SummaryError, Utterance
from quipu.services.domain.models.estimate import estimate_request_tokens
from quipu.services.domain.models.port import ModelClient, ModelError, ModelRequest
from quipu.services.domain.store.protocol import Store
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.domain.transcript import validate_planner_transcript
from quipu.services.kit.delivery import PermanentError, RetryableError, describe_error, first_delivery
from quipu.services.kit.keyed_locks import KeyedLocks
from quipu.services.kit.publishing import all_taken
from quipu.services.kit.sealing import sealing_for
from quipu.services.planner.adapters import (
    MissingToolsError,
    Publisher,
    SessionOwners,
    StepWriter,
    load_view,
    tool_book,
)
from quipu.services.planner.logic.actions import (
    Append,
    CallModel,
    Closed,
    Dispatch,
    Finish,
    Intend,
    Suspend,
    Trigger,
    Wait,
)
from quipu.services.planner.logic.context import (
    compacted_messages,
    compaction_event,
    compaction_record,
    dropped_messages,
    fit_messages,
    history_turns,
    overflow_failure,
    summary_text,
)
from quipu.services.planner.logic.decide import before_first_call, decide, failure_finish
from quipu.services.planner.logic.dispatch import ToolInfo, dispatch_outputs
from quipu.services.planner.logic.keys import (
    AGENT_REMOVED,
    CANCEL_KEY,
    INVALID_TRANSCRIPT,
    MEMORY_CONTEXT_KEY,
    MISSING_TOOL,
    SEED_KEY,
    TOOL_RESULT_TYPE,
    link_key,
    tool_result_key,
)
from quipu.services.planner.logic.model_call import model_failure, model_records, model_request, reply_delta
from quipu.services.planner.logic.payloads import Compaction, RunContext, SuspensionCheckpoint, ToolResult
from quipu.services.planner.logic.run_end import child_not_started, refusal_events, refused_target
from quipu.services.planner.logic.starts import (
    StartPlan,
    answer_message,
    first_records,
    run_context,
    run_start,
    start_plan,
    user_message,
)
from quipu.services.planner.logic.view import RunView, text_of
from quipu.services.planner.pipelined_starts import (
    GoOn,
    PipelinedStarts,
    StartAnswer,
    StartMissedError,
    start_answer,
)
from quipu.services.planner.settings import PlannerSettings

logger = structlog.get_logger(__name__)

T = TypeVar("T")

COMPACTION_FAILED = "the history over the request budget could not be compacted"

RELOAD_CODES = frozenset(
    {
        ErrorCode.EVENT_CONFLICT,
        ErrorCode.RUN_NOT_ACTIVE,
        ErrorCode.RUN_TERMINAL_CONFLICT,
        ErrorCode.RUN_CANCELLATION_CONFLICT,
        ErrorCode.RUN_SUSPENSION_CONFLICT,
        ErrorCode.RUN_LOG_MOVED,
    }
)
"""Refusals that mean another writer got there first: reload and use what the store holds."""


# --- refusals -----------------------------------------------------------------------------------


async def once_taken(call: Awaitable[T], queued: Sequence[Awaitable[None]]) -> T:
    """The outcome of `call` once the broker has taken every message `queued` meanwhile (a
    model call and its text deltas): the call's error first, else the first refusal of one."""
    try:
        result = await call
    except BaseException:
        await asyncio.gather(*queued, return_exceptions=True)
        raise
    await all_taken(queued)
    return result


class RunRefusedError(PermanentError):
    """Raised when a run request is refused before its run starts; `code` is the typed reason its
    stream is told (a store code such as SESSION_NOT_FOUND, or AGENT_NOT_FOUND)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


AGENT_NOT_FOUND = "AGENT_NOT_FOUND"
"""Refusal code of a request naming an agent nobody registered."""


# --- the planner --------------------------------------------------------------------------------


@dataclass
class PlannerDeps:
    """What the planner works with; `create_app` builds whatever is left None."""

    store: Store | None = None
    model: ModelClient | None = None
    agents: AgentRegistry | None = None
    """The view of `agents.registry` the app keeps current (default: empty until the registry is
    read; given: a test's agents, or one that watches what it holds)."""
    context: ContextSource | None = None
    memory: MemoryStore | None = None
    """Conversation memory: with it, the default context source is `MemoryContextSource`, and
    sessions are claimed there (else through the owner when the store is its Kafka client)."""
    registry: ToolsetRegistry | None = None
    """The view of `tools.registry` the app keeps current (given: a test watches what it holds).
    The planner offers the tools it holds and nothing else."""


@dataclass(frozen=True)
class ReadyDeps:
    """The planner's dependencies; without `owners` no session owner is checked (no history kept)."""

    store: Store
    model: ModelClient
    registry: ToolsetRegistry
    """The announced toolsets: the only tools offered, besides other agents (agent-tools)."""
    agents: AgentRegistry
    context: ContextSource
    owners: SessionOwners | None = None


def _permanent(what: str, error: StoreError) -> PermanentError:
    return PermanentError(f"{what}: {error.code.value}: {error.message}")


def for_its_person(view: RunView) -> contextlib.AbstractContextManager[None]:
    """What the planner writes and publishes about a run is sealed under the run's person, as its
    records are at rest (its context record says whose), whatever message woke the planner: a
    cancel or an answer that names no one, a tool result."""
    if view.context is None:
        return contextlib.nullcontext()  # not recorded yet: the request's own person goes on
    principal = run_sealing_principal(view.context.principal_id, view.session_id, view.run_id)
    return sealing_for(view.context.tenant_id, principal)


class Planner:
    """The agent loop over the store: one method per trigger, each ending in `advance`."""

    def __init__(self, deps: ReadyDeps, publisher: Publisher, settings: PlannerSettings) -> None:
        self.deps = deps
        self.publisher = publisher
        self.settings = settings
        self.locks: KeyedLocks[str] = KeyedLocks()  # one run's triggers, one at a time
        self._sent: OrderedDict[str, RunView] = OrderedDict()
        """Runs whose tool calls this process just sent, as it wrote them: the result that answers
        them is folded into this view instead of a read of the whole log. Only the copy holding a
        run's results partition takes its results and writes the steps they open, so these views
        are dropped when that assignment changes (`forget_kept_views`): a result taken on one never
        repeats a model call another copy recorded. Stale otherwise (a cancel written elsewhere),
        one shows at the next write: a record it finds written, or a refusal, makes the planner
        read the log again."""
        self._starting = PipelinedStarts(publisher)
        """Turns whose start is under way while their first step is decided (one per run)."""
        self._recent_starts: OrderedDict[str, None] = OrderedDict()
        """Run ids this process started lately: a request for one again is never pipelined."""

    def forget_kept_views(self) -> None:
        """Drop the views of runs whose calls went out: the results partitions were reassigned."""
        self._sent.clear()

    @property
    def steps(self) -> StepWriter:
        """Writes a step with the tool calls it justifies (over the deps in use now)."""
        return StepWriter(self.deps.store, self.publisher, self.deps.registry)

    # --- triggers -------------------------------------------------------------------------------

    async def on_run_requested(self, request: RunRequested) -> None:
        """A new turn, a resume or a child run: start it, record its input, advance.

        A request refused before its run starts tells the run's stream why (then goes to the DLQ).
        """
        log = logger.bind(run_id=request.run_id, session_id=request.session_id, kind=request.kind.value)
        async with self.locks.hold(request.run_id):
            try:
                view = await self._start_and_advance(request)
            except RunRefusedError as refusal:
                await self._tell_refusal(request.run_id, request.session_id, refusal.code, refusal.message)
                raise
            finally:
                await self._starting.drop(request.run_id)
            if view is None:
                log.info("run not planned (stopped at start or parent closed)")

    async def _start_and_advance(self, request: RunRequested) -> RunView | None:
        """Start the run and advance it; None when it must not be planned. A pipelined turn whose
        start did not simply succeed goes on from the start's outcome, as an unpipelined one would."""
        trigger = self._trigger(request.occurred_at, request.event_id)
        try:
            view = await self._start_request(request)
            if view is not None:
                with for_its_person(view):
                    await self.advance(view, trigger)
            return view
        except StartMissedError as missed:
            logger.info(
                "pipelined start did not simply succeed; going on from its outcome", run_id=request.run_id
            )
            view = await missed.then()
        if view is not None:
            with for_its_person(view):
                await self.advance(view, trigger)
        return view

    async def on_invalid_request(self, body: bytes, reason: str) -> None:
        """A run request that does not validate: its stream, when it names a run, hears why."""
        target = refused_target(body)
        if target is not None:
            await self._tell_refusal(*target, ErrorCode.INVALID_ARGUMENT.value, reason)

    async def _tell_refusal(self, run_id: str, session_id: str, code: str, message: str) -> None:
        # Only for a run the store does not know: a request must never end someone else's run.
        try:
            await self.deps.store.load_run(run_id)
        except StoreError as error:
            if error.code is not ErrorCode.RUN_NOT_FOUND:
                raise
            logger.info("run request refused", run_id=run_id, session_id=session_id, code=code)
            for event in refusal_events(run_id, session_id, code, message, to_millisecond(utc_now_ms())):
                await self.publisher.publish(event)

    async def on_tool_result(self, completed: ToolCallCompleted) -> None:
        """Record one tool result (the first one wins), then advance."""
        async with self.locks.hold(completed.run_id):
            view = self._sent.pop(completed.run_id, None) or await load_view(
                self.deps.store, completed.run_id
            )
            if view is None:
                logger.warning("tool result for an unknown run ignored", run_id=completed.run_id)
                return
            with for_its_person(view):
                await self._take_result(view, completed)

    async def _take_result(self, view: RunView, completed: ToolCallCompleted) -> None:
        """Take the result unless the run has it or never asked for it, then advance.

        The result that completes its step's set is staged: the next command (the next step, or
        the terminal with the answer) carries it. One that leaves others missing is written alone
        at once, so that a handler never holds one message waiting for another.
        """
        trigger = self._trigger(completed.occurred_at, completed.event_id, completed.tool_use_id)
        if not view.closed and completed.tool_use_id not in view.results:
            if completed.tool_use_id not in _tool_use_ids(view):
                logger.warning(
                    "result for a tool use the run never made ignored",
                    run_id=view.run_id,
                    tool_use_id=completed.tool_use_id,
                )
                return
            result = ToolResult.of(completed)
            record = view.record(
                tool_result_key(completed.tool_use_id), TOOL_RESULT_TYPE, result.encode(), trigger.at
            )
            view = await self._write(view, record)
            if not _tool_use_ids(view) <= view.results.keys():
                view = await self._flush(view)
                # Others still missing: read again after our own write. Of two results written
                # at once by two processes (a rebalance), the later reader sees both, so the
                # group is never left waiting. With every result in hand there is nothing to see.
                fresh = await load_view(self.deps.store, completed.run_id)
                if fresh is not None:
                    fresh.session_ended = view.session_ended
                    view = fresh
        await self.advance(view, trigger)

    async def on_cancel(self, cancel: CancelRun) -> None:
        """Record the cancellation intent (the first reason is permanent), then advance to the end."""
        async with self.locks.hold(cancel.run_id):
            self._sent.pop(cancel.run_id, None)
            view = await load_view(self.deps.store, cancel.run_id)
            if view is None:
                logger.warning("cancel for an unknown run ignored", run_id=cancel.run_id)
                return
            trigger = self._trigger(cancel.occurred_at, cancel.event_id)
            with for_its_person(view):  # a cancel names no one; what it makes the run say is theirs
                if not view.closed and not view.cancel_reason:
                    record = view.record(
                        CANCEL_KEY,
                        LifecycleType.CANCELLATION_INTENT.value,
                        encode_cancellation_intent(cancel.reason),
                        trigger.at,
                    )
                    view = await self._write(view, record, self.deps.store.record_run_cancellation)
                await self.advance(view, trigger)

    # --- starts ---------------------------------------------------------------------------------

    async def _start_request(self, request: RunRequested) -> RunView | None:
        if request.kind is RunKind.RESUME:
            return await self._start_resume(request)
        if request.kind is RunKind.CHILD:
            return await self._start_child(request)
        return await self._start_turn(request)

    async def _require_owner(self, request: RunRequested, session_id: str, context: RunContext) -> None:
        """The run's principal must be its session's (claimed by the first turn): else the answer
        would be given and then refused by the history, so the request is refused now."""
        owners = self.deps.owners
        if owners is None or not session_id:
            return
        scope = MemoryScope(
            tenant_id=context.tenant_id,
            principal_id=history_principal(context.principal_id, session_id),
            agent_id=request.agent_id,
        )
        try:
            await owners.require(session_id, scope)
        except StoreRefusedError as error:
            raise RunRefusedError(error.code.value, error.message) from error

    async def _start_turn(self, request: RunRequested) -> RunView | None:
        agent = self._agent(request.agent_id)
        if not request.text:
            raise RunRefusedError(
                ErrorCode.INVALID_ARGUMENT.value, f"run {request.run_id!r}: a turn needs the user's text"
            )
        context = run_context(request, agent)
        # The turn's memory is read while the session's owner is checked: it depends on the session
        # and the person, not on the run, and the start carries what it shows the model with the
        # run's context and input (one write). A refused turn drops what was read, unseen.
        memory = self._read_memory(request, agent, context) if request.session_id else None
        try:
            await self._require_owner(request, request.session_id, context)
            blocks = await memory if memory is not None else None
        except BaseException:
            await _drop(memory)
            raise
        plan = start_plan(run_start(request, agent_id=agent.id, session_id=request.session_id))
        trigger = self._trigger(request.occurred_at, request.event_id)
        opening = first_records(plan, context, user_message(request.text), trigger.at, blocks)
        first = before_first_call(plan.started, opening, trigger)
        return await self._start_first(plan, request, first, trigger)

    async def _start_first(
        self,
        plan: StartPlan,
        request: RunRequested,
        first: list[Record],
        trigger: Trigger,
        not_started: Callable[[], Awaitable[None]] | None = None,
        sealed: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> RunView | None:
        """Start the run carrying its `first` records; None when it must not be planned (then
        `not_started` is told). A request that cannot be a redelivery is pipelined: the start is
        sent and the run goes on as if it simply succeeded, and from the start's answer only when
        it did not (`_send_start`). What the run writes is `sealed` for its person, when going on
        from a missed start too."""

        async def then(outcome: StartAnswer) -> RunView | None:
            with sealed():
                view = await self._started(plan, request, first, outcome)
                if view is None:
                    if not_started is not None:
                        await not_started()
                    return None
                if view.closed:
                    return view
                return await self._write_first(view, first, trigger)

        again = self._started_here_before(request.run_id)
        if not again and self._may_pipeline():
            return await self._send_start(plan, first, then)
        return await then(await start_answer(self._store_start(plan, first)))

    def _started_here_before(self, run_id: str) -> bool:
        """Whether this process started the run lately (a duplicate request); it is noted now."""
        again = run_id in self._recent_starts
        self._recent_starts[run_id] = None
        self._recent_starts.move_to_end(run_id)
        while len(self._recent_starts) > self.settings.recent_starts:
            self._recent_starts.popitem(last=False)
        return again

    def _may_pipeline(self) -> bool:
        """Whether a new run's model may be called before its start is answered: only when its
        request cannot be a redelivery, so no earlier attempt can have recorded a model step the
        call would repeat (the message's first handling, consumed after this planner was given its
        partition; a run this process did not start before), and over a store that pipelines."""
        return self.settings.pipeline_starts and first_delivery() and self.deps.store.pipeline is not None

    async def _send_start(self, plan: StartPlan, first: list[Record], then: GoOn) -> RunView:
        """Send the start and go on as if it simply succeeded: the first step follows it on its
        partition and names the log it assumed (the start's records), so the owner refuses it, and
        publishes none of its calls, unless the start wrote exactly that log."""
        pipeline = self.deps.store.pipeline
        assert pipeline is not None  # `_may_pipeline` said so
        opening = [plan.started, *first]
        start = self._store_start(plan, first)
        await self._starting.begin(plan.run.run_id, start, pipeline, LogBasis.of(opening), then)
        view = RunView.of(opening)
        assert view is not None  # `opening` starts with the run_started record
        return view

    async def _write_first(self, view: RunView, first: list[Record], trigger: Trigger) -> RunView:
        """The first records a started run's log lacks: the start met an earlier attempt's (a
        redelivery), which wrote other ones or none. A turn whose input is written keeps the memory
        it was shown then."""
        for record in first:
            shown = record.event_key in (MEMORY_CONTEXT_KEY, SEED_KEY)
            if shown and (view.has_input or SEED_KEY in view.keys):
                continue
            view = await self._write_once(view, record.event_key, record.type, record.payload, trigger)
        return view

    def _read_memory(
        self, request: RunRequested, agent: AgentDefinition, context: RunContext
    ) -> asyncio.Task[ContextBlocks]:
        return asyncio.ensure_future(
            self.deps.context.context(
                request.session_id,
                context.principal_id,
                agent.id,
                tenant_id=request.tenant_id,
                query=request.text,
                memory_opt_out=agent.memory_opt_out,
            )
        )

    async def _start_child(self, request: RunRequested) -> RunView | None:
        parent = request.parent
        if parent is None:
            raise RunRefusedError(
                ErrorCode.INVALID_ARGUMENT.value, f"child run {request.run_id!r} names no parent tool call"
            )
        agent = self._agent(request.agent_id)
        run = run_start(
            request,
            agent_id=agent.id,
            session_id=request.session_id,
            parent_run_id=parent.parent_run_id,
        )
        plan = start_plan(run, (parent, link_key(parent.tool_call_id, run.run_id, continuation=False)))
        trigger = self._trigger(request.occurred_at, request.event_id)
        opening = first_records(plan, run_context(request, agent), user_message(request.text), trigger.at)
        first = before_first_call(plan.started, opening, trigger)

        async def not_started() -> None:
            # Stopped (the session ended) or refused (the parent closed): the parent must not wait.
            answer = child_not_started(request, "its session ended or its parent closed")
            if answer is not None:
                await self.publisher.publish(answer)

        return await self._start_first(plan, request, first, trigger, not_started)

    async def _start_resume(self, request: RunRequested) -> RunView | None:
        store = self.deps.store
        predecessor = await load_view(store, request.predecessor_run_id)
        if predecessor is None or predecessor.suspended_time is None:
            raise RunRefusedError(
                ErrorCode.RUN_SUSPENSION_NOT_FOUND.value,
                f"resume {request.run_id!r}: {request.predecessor_run_id!r} is not suspended",
            )
        try:
            checkpoint = SuspensionCheckpoint.decode(
                (await store.load_run_suspension(predecessor.run_id)).data
            )
        except StoreRefusedError as error:
            raise _permanent(f"resume {request.run_id!r}", error) from error
        agent = self._agent(predecessor.agent_id)
        run = run_start(
            request,
            agent_id=predecessor.agent_id,
            session_id=predecessor.session_id,
            parent_run_id=predecessor.parent_run_id,
            inherited=predecessor.context,
        )
        parent = predecessor.context.parent if predecessor.context is not None else None
        link = (parent, link_key(parent.tool_call_id, run.run_id, continuation=True)) if parent else None
        context = run_context(request, agent, inherited=predecessor.context)
        await self._require_owner(request, predecessor.session_id, context)
        try:
            answer = answer_message(predecessor, checkpoint.pending, request.answer)
        except TranscriptError as error:
            raise PermanentError(f"resume {request.run_id!r}: {describe_error(error)}") from error
        plan = start_plan(run, link)
        trigger = self._trigger(request.occurred_at, request.event_id)
        # The start carries the continuation's context, its predecessor's transcript and the answer.
        opening = first_records(plan, context, answer, trigger.at, seed=predecessor.messages)
        first = before_first_call(plan.started, opening, trigger)

        def sealed() -> contextlib.AbstractContextManager[None]:
            # A continuation is its predecessor's person's run even when the answer names no one.
            return sealing_for(
                run.tenant_id, run_sealing_principal(run.principal_id, run.session_id, run.run_id)
            )

        with sealed():
            return await self._start_first(plan, request, first, trigger, sealed=sealed)

    async def _start(
        self, plan: StartPlan, request: RunRequested, first: Sequence[Record] = ()
    ) -> RunView | None:
        """Start the run carrying its `first` records (an exact retry on redelivery); None when it
        must not be planned."""
        return await self._started(plan, request, first, await start_answer(self._store_start(plan, first)))

    def _store_start(self, plan: StartPlan, first: Sequence[Record]) -> Awaitable[StartResult]:
        """The store call that starts the run of `plan` carrying `first`."""
        store = self.deps.store
        run = plan.run
        if plan.parent_link is not None and run.session_id:
            return store.start_child_run(run, plan.parent_link, plan.started, plan.stopped, first)
        if plan.parent_link is not None:
            return store.start_one_shot_child_run(run, plan.parent_link, plan.started, first)
        if run.session_id:
            return store.start_root_run(run, plan.started, plan.stopped, first)
        return store.start_one_shot_run(run, plan.started, first)

    async def _started(
        self, plan: StartPlan, request: RunRequested, first: Sequence[Record], outcome: StartAnswer
    ) -> RunView | None:
        """The run as its start's `outcome` leaves it; None when it must not be planned."""
        run = plan.run
        if isinstance(outcome, StoreRefusedError):
            error = outcome
            if plan.parent_link is not None and error.code is ErrorCode.RUN_NOT_ACTIVE:
                logger.info("child not started: its parent is closed", run_id=run.run_id)
                return None
            if first and error.code in (ErrorCode.EVENT_CONFLICT, ErrorCode.RUN_CONFLICT):
                # An earlier attempt started the run with other first records (the memory read
                # changed since): start as that attempt did, then read what it wrote.
                logger.info("run started before with other first records", run_id=run.run_id)
                return await self._start(plan, request)
            raise RunRefusedError(error.code.value, f"start of {run.run_id!r}: {error.message}") from error
        result = outcome
        if result.decision is StartOutcome.STOP:
            return None
        if result.started.inserted and result.run_status is RunStatus.RUNNING:
            # This call wrote the run's first records, so the log is those records: no read back.
            # A second writer (a rebalance) is caught by the conflict of our next append.
            return RunView.of([plan.started, *first])
        view = await load_view(self.deps.store, run.run_id)
        if view is None:
            raise RetryableError(f"run {run.run_id!r} started but not readable yet")
        return view

    # --- the loop -------------------------------------------------------------------------------

    async def advance(self, view: RunView, trigger: Trigger) -> None:
        """Take the run's next steps until it waits for a message or is closed."""
        agent, tools, failure = await self._equipment(view)
        if failure is not None and not view.closed:
            logger.warning("run failed: its agent cannot run", kind=failure.kind)
            view = await self._fail(view, trigger, failure)
        dispatched = 0
        for _ in range(self.settings.max_actions_per_message):
            action = decide(view, trigger, dispatched)
            if isinstance(action, Wait | Closed):
                # What the pass staged is written before it ends; a reload (another writer came
                # first) is decided on again.
                written = await self._flush(view)
                if written is not view:
                    view = written
                    continue
                for message in action.outputs if isinstance(action, Closed) else []:
                    await self.publisher.publish(message)
                if dispatched and isinstance(action, Wait):
                    self._remember(view)
                return
            if isinstance(action, Append):
                view = await self._write(view, action.record)
            elif isinstance(action, Intend):
                view = await self._write(view, action.record, self.deps.store.record_run_cancellation)
            elif isinstance(action, Finish):
                view = await self._finish(view, action.record)
            elif isinstance(action, Suspend):
                view = await self._write(view, action.record, self._suspension_writer(action))
            elif isinstance(action, Dispatch):
                outputs, local = dispatch_outputs(view, action.step, action.uses, tools, trigger)
                for record in local:
                    view = await self._write(view, record)
                # The step's records (its assistant message above all) commit before its calls go
                # out: the step's command carries them (published once it commits); a step written
                # before (a redelivery) justifies them already, and they are published here.
                calls = [message for message in outputs if isinstance(message, ToolCallRequested)]
                carried = calls if view.unwritten else []
                if not view.unwritten:
                    # Written before (a redelivery, another writer): the reply that said whether
                    # its session had ended is gone, so that is read before its calls go again.
                    view.session_ended = view.session_ended or await self._session_ended(view)
                written = await self._flush(view, carried)
                if written is not view or written.session_ended:
                    # Another writer came first, or the session ended (its calls were withheld:
                    # the run is closed instead): nothing this pass made goes out.
                    view = written
                    continue
                for message in outputs:
                    if not (carried and isinstance(message, ToolCallRequested)):
                        await self.publisher.publish(message)
                dispatched = action.step
            elif isinstance(action, CallModel):
                assert agent is not None  # a run whose agent is gone was failed above: no model call
                # What is staged (the tool results that complete a step, their message, the phase)
                # rides in the command that writes this call's step, or in the terminal: nothing
                # is recorded before it, so a redelivery that calls the model again repeats no
                # recorded call. A session ended or another writer shows in that command's reply.
                view = await self._model_step(view, agent, tools, action.step, trigger)
        raise PermanentError(
            f"run {view.run_id!r}: no end after {self.settings.max_actions_per_message} steps"
        )

    async def _model_step(
        self,
        view: RunView,
        agent: AgentDefinition,
        tools: Mapping[str, ToolInfo],
        step: int,
        trigger: Trigger,
    ) -> RunView:
        request = model_request(view, agent, tools, step, self.settings.max_tokens_per_call)
        try:
            validate_planner_transcript(request.messages)
        except TranscriptError as error:
            failure = Failure(message=str(error), kind=INVALID_TRANSCRIPT, retryable=False)
            return await self._fail(view, trigger, failure)
        fitted = await self._fit(view, agent, tools, step, trigger, request)
        if isinstance(fitted, RunView):
            return fitted
        view, request = fitted
        # Each text delta is queued as it comes, not waited for (the stream reads on); all are
        # taken before the call's outcome is written, since the owner's events of the run follow.
        deltas: list[Awaitable[None]] = []

        async def on_text(text: str) -> None:
            deltas.append(
                await self._starting.say(
                    view.run_id, reply_delta(view, step, len(deltas), text, utc_now_ms())
                )
            )

        model = self.deps.model
        try:
            call = asyncio.wait_for(model.complete(request, on_text), self.settings.model_timeout_s)
            response = await once_taken(call, deltas)
        except TimeoutError as error:
            raise RetryableError(f"model call {request.call_key} timed out") from error
        except ModelError as error:
            if error.retryable:
                raise RetryableError(f"model call {request.call_key}: {error.kind}: {error}") from error
            failure = model_failure(
                str(error), provider=model.name, code=error.kind, http_status=error.http_status
            )
            return await self._fail(view, trigger, failure)
        for record in model_records(view, step, response, trigger.at):
            view = await self._write(view, record)
        return view

    # --- the request budget ---------------------------------------------------------------------

    async def _fit(
        self,
        view: RunView,
        agent: AgentDefinition,
        tools: Mapping[str, ToolInfo],
        step: int,
        trigger: Trigger,
        request: ModelRequest,
    ) -> tuple[RunView, ModelRequest] | RunView:
        """The request of call `step` within the request budget, or the run closed as overflowing.

        Over budget, the oldest history turns are dropped, whole, and what they said is compacted
        with the summary block into a new summary block (never dropped silently); the compaction
        is recorded, so a redelivery and every later call of the run see the same request. When
        the current turn alone (system, memory blocks, this run's own messages) does not fit,
        the run fails with `context_overflow` instead of sending what the provider would refuse.
        """
        if view.compaction is not None and view.compaction.step == step:
            # Decided before a redelivery: the record is the decision; the stream hears it again.
            await self.publisher.publish(compaction_event(view, view.compaction, trigger.at))
            return view, request
        budget = self.settings.request_budget_tokens
        tokens = await self._count(request)
        if tokens <= budget:
            return view, request
        previous = view.compaction.dropped_turns if view.compaction is not None else 0
        droppable = len(history_turns(view.messages)) - previous
        existing = summary_text(compacted_messages(view.messages, view.compaction))
        cap = self.settings.compaction_summary_tokens

        def without(drop: int, summary: str | None) -> ModelRequest:
            return model_request(
                view,
                agent,
                tools,
                step,
                self.settings.max_tokens_per_call,
                fit_messages(view.messages, previous + drop, summary),
            )

        floor = await self._count(without(droppable, None))
        if droppable <= 0 or floor + cap > budget:
            logger.info("turn over its request budget", run_id=view.run_id, tokens=tokens, floor=floor)
            return await self._fail(view, trigger, overflow_failure(floor, budget))
        # The fewest turns whose removal fits, by the local estimate scaled to the real count.
        scale = tokens / max(1, estimate_request_tokens(request))
        drop = next(
            (
                count
                for count in range(1, droppable + 1)
                if estimate_request_tokens(without(count, None)) * scale + cap <= budget
            ),
            droppable,
        )
        summary, after, summarized = existing, tokens, 0
        while True:
            new = dropped_messages(view.messages, previous + summarized, previous + drop)
            compacted = await self._compact(summary, new, f"{view.run_id}/step/{step}/compact/{drop}")
            if isinstance(compacted, Failure):
                return await self._fail(view, trigger, compacted)
            summary, summarized = compacted, drop
            after = await self._count(without(drop, summary))
            if after <= budget or drop == droppable:
                break
            drop = droppable  # the estimate fell short: compact the rest too, in one more call
        if after > budget:
            return await self._fail(view, trigger, overflow_failure(after, budget))
        compaction = Compaction(
            step=step,
            dropped_turns=previous + drop,
            summary=summary,
            tokens_before=tokens,
            tokens_after=after,
        )
        logger.info(
            "history compacted to fit the request budget",
            run_id=view.run_id,
            step=step,
            dropped_turns=compaction.dropped_turns,
            tokens_before=tokens,
            tokens_after=after,
        )
        view = await self._write(view, compaction_record(view, compaction, trigger.at))
        view = await self._flush(view)  # the event below follows its record's commit
        if view.closed or view.compaction is None:
            return view  # another writer closed the run meanwhile
        await self.publisher.publish(compaction_event(view, view.compaction, trigger.at))
        return view, model_request(view, agent, tools, step, self.settings.max_tokens_per_call)

    async def _count(self, request: ModelRequest) -> int:
        """Input tokens of a request: the local estimate while it is far below the budget, else
        the provider's counter (the estimate when the counter fails or is slow)."""
        estimate = estimate_request_tokens(request)
        if estimate <= self.settings.request_budget_tokens * self.settings.count_tokens_above:
            return estimate
        try:
            return await asyncio.wait_for(
                self.deps.model.count_tokens(request), self.settings.count_tokens_timeout_s
            )
        except (ModelError, TimeoutError) as error:
            logger.info("token count unavailable; using the local estimate", error=str(error))
            return estimate

    async def _compact(self, summary: str, dropped: list[Message], call_key: str) -> str | Failure:
        """`summary` extended with the dropped turns, capped; a Failure when it cannot be written."""
        summarizer = Summarizer(self.deps.model, self.settings.compaction_summary_tokens)
        said = [
            Utterance(HistoryRole.USER if message.role == "user" else HistoryRole.ASSISTANT, text_of(message))
            for message in dropped
        ]
        try:
            written = await asyncio.wait_for(
                summarizer.summarize(summary, said, call_key), self.settings.compaction_timeout_s
            )
        except TimeoutError as error:
            raise RetryableError(f"compaction {call_key} timed out") from error
        except ModelError as error:
            if error.retryable:
                raise RetryableError(f"compaction {call_key}: {error.kind}: {error}") from error
            return overflow_failure(
                0, 0, f"the history over the request budget could not be compacted: {error}"
            )
        except SummaryError as error:
            return overflow_failure(
                0, 0, f"the history over the request budget could not be compacted: {error}"
            )
        return written.text

    async def _fail(self, view: RunView, trigger: Trigger, failure: Failure) -> RunView:
        """Close the run as failed."""
        return await self._finish(view, failure_finish(view, trigger, failure).record)

    # --- writing --------------------------------------------------------------------------------

    async def _write(self, view: RunView, record: Record, operation: _Write | None = None) -> RunView:
        """Stage an ordinary record (written with the rest of its step by `_flush`); a lifecycle
        record (`operation`) is written at once, after the records staged before it."""
        if operation is None:
            view.stage(record)
            return view
        view = await self._flush(view)
        written = functools.partial(operation, record)
        return await self._commit(view, record, lambda: self._starting.after(view.run_id, written))

    async def _flush(self, view: RunView, calls: Sequence[ToolCallRequested] = ()) -> RunView:
        """Write the staged records as one command (a step commits as one), with the tool `calls`
        it justifies published once it committed; the view itself, or the store's when another
        writer came first. A run's first step, decided while its start is under way, is sent
        behind it."""
        if not view.unwritten:
            return view
        step = list(view.unwritten)
        append = functools.partial(self.steps.append, step, calls)
        return await self._commit(view, step[0], lambda: self._starting.behind(view.run_id, append))

    async def _finish(self, view: RunView, record: Record) -> RunView:
        """Close the run; the terminal carries the records staged before it (one command), sent
        behind the run's start when that is under way (a first answer that closes the run)."""
        close = functools.partial(self.deps.store.record_run_terminal, record, list(view.unwritten))
        return await self._commit(view, record, lambda: self._starting.behind(view.run_id, close))

    async def _commit(self, view: RunView, record: Record, write: Callable[[], Awaitable[object]]) -> RunView:
        """Apply `write` (the staged records, then `record` unless it is the first of them) and fold
        it into the view; use the store's view instead when another writer came first."""
        try:
            result = await write()
        except StoreRefusedError as error:
            if error.code not in RELOAD_CODES:
                raise _permanent(f"run {view.run_id!r} record {record.event_key!r}", error) from error
            logger.info(
                "another writer came first; reloading",
                run_id=view.run_id,
                event_key=record.event_key,
                code=error.code.value,
            )
            return await self._reload(view.run_id, f"{error.code.value}: {error.message}")
        results = result if isinstance(result, list) else [result]
        ended = any(isinstance(each, AppendResult) and each.in_ended_session for each in results)
        if any(isinstance(each, AppendResult) and not each.inserted for each in results):
            # The store held these records already: this view was behind the log (another
            # process wrote meanwhile), so what the store holds is used.
            reloaded = await self._reload(view.run_id, "records written by another writer")
            reloaded.session_ended = ended
            return reloaded
        if record.event_key not in view.keys:
            view.add(record)
        view.unwritten.clear()
        view.session_ended = view.session_ended or ended
        return view

    async def _session_ended(self, view: RunView) -> bool:
        if not view.session_id:
            return False
        return (await self.deps.store.load_session_status(view.session_id)).status is SessionStatus.ENDED

    async def _reload(self, run_id: str, why: str) -> RunView:
        self._sent.pop(run_id, None)
        reloaded = await load_view(self.deps.store, run_id)
        if reloaded is None:
            raise PermanentError(f"run {run_id!r} vanished ({why})")
        return reloaded

    def _remember(self, view: RunView) -> None:
        """Keep the view of a run whose tool calls went out (a bounded number, the oldest dropped)."""
        self._sent[view.run_id] = view
        self._sent.move_to_end(view.run_id)
        while len(self._sent) > self.settings.sent_views:
            self._sent.popitem(last=False)

    async def _write_once(
        self, view: RunView, key: str, type_: str, payload: bytes, trigger: Trigger
    ) -> RunView:
        """Write the record at `key` unless the run already holds one there."""
        if key in view.keys:
            return view
        return await self._write(view, view.record(key, type_, payload, trigger.at))

    def _suspension_writer(self, action: Suspend) -> _Write:
        async def suspend(record: Record) -> object:
            return await self.deps.store.record_run_suspension(action.checkpoint, record)

        return suspend

    # --- helpers --------------------------------------------------------------------------------

    async def _equipment(
        self, view: RunView
    ) -> tuple[AgentDefinition | None, dict[str, ToolInfo], Failure | None]:
        """The run's agent and the tools it may call, or the failure that ends the run: its agent was
        removed from agents.registry after the run started, or it declares tools nobody announced.

        Tools not announced yet are waited for, at most `tools_wait_s`: an executor started
        beside the planner announces its toolset once it has joined its group."""
        try:
            agent = self.deps.agents.get_agent(view.agent_id)
        except UnknownAgentError as error:
            return None, {}, Failure(message=str(error), kind=AGENT_REMOVED, retryable=False)
        try:
            return agent, tool_book(agent, self.deps.agents, self.deps.registry), None
        except MissingToolsError as error:
            missing = error
        if not view.closed:
            logger.info("waiting for tools to be announced", run_id=view.run_id, tools=missing.names)
            await self.deps.registry.offered_within(missing.names, self.settings.tools_wait_s)
            try:
                return agent, tool_book(agent, self.deps.agents, self.deps.registry), None
            except MissingToolsError as error:
                missing = error
        return agent, {}, Failure(message=str(missing), kind=MISSING_TOOL, retryable=False)

    def _agent(self, agent_id: str) -> AgentDefinition:
        try:
            return self.deps.agents.get_agent(agent_id)
        except UnknownAgentError as error:
            raise RunRefusedError(AGENT_NOT_FOUND, str(error)) from error

    @staticmethod
    def _trigger(at: datetime, event_id: str, result_for: str = "") -> Trigger:
        return Trigger(at=at, event_id=event_id, result_for=result_for)


class _Write(Protocol):
    async def __call__(self, record: Record, /) -> object: ...


async def _drop(read: asyncio.Task[ContextBlocks] | None) -> None:
    """Cancel a memory read whose answer is not needed (its failure included)."""
    if read is not None:
        read.cancel()
        await asyncio.gather(read, return_exceptions=True)


def _tool_use_ids(view: RunView) -> set[str]:
    return {
        part.id
        for message in view.messages
        if message.role == "assistant"
        for part in message.parts
        if isinstance(part, ToolUsePart)
    }
