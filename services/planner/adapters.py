"""The planner's I/O: reading a run from the store, publishing to the topics, the context
sources and the session owners behind `orchestrator.Planner`."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Protocol

import structlog

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.commands import DispatchedCall
from quipu.contracts.errors import ErrorCode, QuipuError, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.contracts.runs import TurnCompleted
from quipu.contracts.store import AppendResult, LogBasis, Record, RunStatus, is_erased
from quipu.contracts.tools import DEFAULT_TOOLSET, ToolCallRequested
from quipu.contracts.transcript import TranscriptError
from quipu.contracts.wire import to_millisecond
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.memory.context import ContextBlocks, SpokenTurn
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.session_claims import SessionClaimRule, SessionClaims, require_turn_of
from quipu.services.domain.store.protocol import Store
from quipu.services.domain.tool_catalog import agent_tool
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.domain.transcript import PAGE_LIMIT, build_messages_from_run_log
from quipu.services.kit.delivery import PermanentError, describe_error
from quipu.services.kit.publishing import TopicPublisher, taken
from quipu.services.planner.logic.actions import Output
from quipu.services.planner.logic.context import history_window
from quipu.services.planner.logic.dispatch import ToolInfo
from quipu.services.planner.logic.view import RunView, completed_turn

logger = structlog.get_logger(__name__)


# --- reading a run ------------------------------------------------------------------------------


async def load_records(store: Store, run_id: str) -> list[Record]:
    """Every record of a run, in log order (ListRunRecords, paged to the end)."""
    records: list[Record] = []
    cursor = ""
    while True:
        page = await store.list_run_records(run_id, cursor, PAGE_LIMIT)
        records.extend(page.records)
        if not page.next_cursor or not page.records:
            return records
        cursor = page.next_cursor


class RunErasedError(QuipuError):
    """Raised when a run's records read as erased: its principal was forgotten, nothing to plan on."""


@contextlib.contextmanager
def ignoring_erased_runs(run_id: str) -> Iterator[None]:
    """A message about a run whose principal was forgotten is settled without effect: not an error."""
    try:
        yield
    except RunErasedError:
        logger.info("run not advanced: its principal was forgotten", run_id=run_id)


_CALLS_SENT: ContextVar[Callable[[int], None] | None] = ContextVar("quipu_planner_calls_sent", default=None)
"""Set by `expecting_results` in the task of a message's handling: told when a step's calls went out."""


@contextlib.contextmanager
def expecting_results(calls_sent: Callable[[int], None]) -> Iterator[None]:
    """Within it, `calls_sent(n)` runs each time a step's n tool calls went out (their results
    will come): the results consumer fetches them at once (kit.fetch_pace, on call)."""
    token = _CALLS_SENT.set(calls_sent)
    try:
        yield
    finally:
        _CALLS_SENT.reset(token)


async def load_view(store: Store, run_id: str) -> RunView | None:
    """The run as its records say, or None when the store does not know it; RunErasedError when
    its principal was forgotten."""
    try:
        records = await load_records(store, run_id)
    except StoreError as error:
        if error.code is ErrorCode.RUN_NOT_FOUND:
            return None
        raise
    if any(is_erased(record.payload) for record in records):
        raise RunErasedError(run_id)
    try:
        return RunView.of(records)
    except (TranscriptError, ValueError, KeyError) as error:
        # Not the error's own text: a decoder's message may quote the record, someone's words.
        raise PermanentError(
            f"run {run_id!r}: its records cannot be read ({describe_error(error)})"
        ) from error


# --- publishing ---------------------------------------------------------------------------------


class Publisher(Protocol):
    """Publishes the planner's messages, each to its topic with its key (`kit.publishing`)."""

    async def publish(self, message: Output) -> None:
        """Publish one message and wait for the broker to take it."""
        ...

    async def queue(self, message: Output) -> Awaitable[None]:
        """Queue one message behind every one queued or published before it, without waiting for
        the broker: returns what waits for the broker to take it (PublishError)."""
        ...


# --- context and tools --------------------------------------------------------------------------


class SessionHistoryContext:
    """The default `ContextSource`: the last completed turns of the session, as plain text.

    Each completed root run of the session is one turn: what the user said and what the agent
    answered (tool traffic is left out). At most `max_messages` messages, whole turns only.
    """

    def __init__(self, store: Store, max_messages: int = 12) -> None:
        self._store = store
        self._max_messages = max_messages

    async def context(
        self,
        session_id: str,
        principal_id: str,
        agent_id: str,
        *,
        tenant_id: str = "",
        query: str = "",
        memory_opt_out: bool = False,
    ) -> ContextBlocks:
        wanted = self._max_messages // 2
        if not wanted:
            return ContextBlocks()
        runs = await self._store.list_runs_by_session(session_id, [RunStatus.COMPLETED])
        turns: list[tuple[str, str]] = []
        for run in reversed([run for run in runs if not run.parent_run_id]):
            if len(turns) >= wanted:
                break
            try:
                messages = await build_messages_from_run_log(self._store, run.run_id)
            except TranscriptError:
                continue
            turn = completed_turn(messages)
            if turn is not None:
                turns.append(turn)
        return ContextBlocks(history=history_window(list(reversed(turns)), self._max_messages))


class CallRouter:
    """Publishes each tool call to the topic of the toolset that announced its tool.

    The route is the registry's (what the deployment's executors announced), looked up by the
    tool's name; a call is only made for an announced tool, so the default topic (`tools.calls`)
    is left only for a tool whose toolset was withdrawn between the step and its dispatch.
    """

    def __init__(self, publisher: TopicPublisher, registry: ToolsetRegistry) -> None:
        self._publisher = publisher
        self._registry = registry

    async def publish(self, call: ToolCallRequested) -> None:
        """Publish `call` to its toolset's calls topic."""
        await self._publisher.publish(call, within=self._registry.calls_topic(call.tool_name))


class StepWriter:
    """Commits a step's records, then has the tool calls they justify published (never before).

    Through a store with an outbox (`Store.outbox`: the storage owner's client) the step's command
    carries its calls and the owner publishes them once the records commit, and again on an exact
    retry: the calls leave without waiting for the reply's hop back and the planner's turn. Any
    other store commits here, then the calls are published here. Either way none is published
    when the step met an ended session: the run is closed instead, and runs no tool.
    """

    def __init__(self, store: Store, publisher: Publisher, registry: ToolsetRegistry | None) -> None:
        self._store = store
        self._publisher = publisher
        self._registry = registry

    def dispatched(self, call: ToolCallRequested) -> DispatchedCall:
        """`call` with the toolset that announced its tool (the registry's, as `CallRouter` routes)."""
        offered = self._registry.find(call.tool_name) if self._registry is not None else None
        return DispatchedCall(toolset=offered.toolset if offered is not None else DEFAULT_TOOLSET, call=call)

    async def append(
        self, records: Sequence[Record], calls: Sequence[ToolCallRequested], follows: LogBasis | None = None
    ) -> list[AppendResult]:
        """Append `records` as one command (only while the run's log is `follows`, when given);
        `calls` go out once it committed (not on a refusal, not in an ended session)."""
        results = await self._commit(records, calls, follows)
        calls_sent = _CALLS_SENT.get()
        if calls and calls_sent is not None:
            calls_sent(len(calls))
        return results

    async def _commit(
        self, records: Sequence[Record], calls: Sequence[ToolCallRequested], follows: LogBasis | None
    ) -> list[AppendResult]:
        outbox = self._store.outbox
        if outbox is not None:
            dispatched = [self.dispatched(call) for call in calls]
            return await outbox.append_run_records(records, dispatched, follows=follows)
        if follows is not None:
            results = await self._store.append_run_records(records, follows=follows)
        else:
            results = await self._store.append_run_records(records)
        if not any(result.in_ended_session for result in results):
            for call in calls:
                await self._publisher.publish(call)
        return results


class PublishedTurns:
    """A `Publisher` that remembers the turns it published: the `RecentTurns` of this planner.

    The recorder writes history asynchronously (`history.turns`), so a user who answers at once
    can start a turn before the previous one is recorded. A session's turns are planned by one
    planner at a time (its partition), which published that previous turn itself: the last
    turns of each session are kept here and shown word for word until the history holds them.
    After a rebalance, a turn finished by another copy moments before is not known here; it
    appears once the recorder has recorded it. Bounded: `turns_per_session` turns for the
    `sessions` sessions last served.
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        calls: CallRouter | None = None,
        turns_per_session: int = 6,
        sessions: int = 2048,
    ) -> None:
        """Tool calls go through `calls` when given (each to its toolset's topic)."""
        self._publisher = publisher
        self._calls = calls
        self._turns_per_session = max(1, turns_per_session)
        self._sessions = max(1, sessions)
        self._recent: OrderedDict[str, list[SpokenTurn]] = OrderedDict()

    async def publish(self, message: Output) -> None:
        if isinstance(message, ToolCallRequested) and self._calls is not None:
            await self._calls.publish(message)
        else:
            await self._publisher.publish(message)
        if isinstance(message, TurnCompleted) and message.session_id:
            self._remember(message)

    async def queue(self, message: Output) -> Awaitable[None]:
        if isinstance(message, ToolCallRequested | TurnCompleted):
            # Routed by toolset, or remembered once taken: these go at once.
            await self.publish(message)
            return taken()
        return await self._publisher.queue(message)

    def _remember(self, turn: TurnCompleted) -> None:
        turns = self._recent.pop(turn.session_id, [])
        if all(known.turn_id != turn.run_id for known in turns):
            # A replayed old turn takes its place in time, never the newest one's.
            turns.append(
                SpokenTurn(turn.run_id, turn.user_text, turn.assistant_text, to_millisecond(turn.occurred_at))
            )
            turns.sort(key=lambda known: known.completed_at or turn.occurred_at)
        self._recent[turn.session_id] = turns[-self._turns_per_session :]
        while len(self._recent) > self._sessions:
            self._recent.popitem(last=False)

    async def unrecorded(
        self, session_id: str, recorded: Collection[str], since: datetime | None, limit: int
    ) -> list[SpokenTurn]:
        newer = [
            turn
            for turn in self._recent.get(session_id, [])
            if turn.turn_id not in recorded
            and (since is None or turn.completed_at is None or turn.completed_at >= since)
        ]
        return newer[-limit:] if limit > 0 else []


class MissingToolsError(QuipuError):
    """Raised when an agent declares tools that no toolset announced and no agent is."""

    def __init__(self, agent_id: str, names: list[str]) -> None:
        super().__init__(
            f"agent {agent_id!r} declares tools nobody serves: {', '.join(names)} "
            "(no executor announced them on tools.registry, and no agent has that id)"
        )
        self.names = names


def tool_book(
    agent: AgentDefinition, agents: AgentRegistry, registry: ToolsetRegistry
) -> dict[str, ToolInfo]:
    """The tools `agent` may call: tools some toolset announced (on their toolset's topic), and
    other agents as agent-tools (child runs); MissingToolsError for the rest."""
    book: dict[str, ToolInfo] = {}
    missing: list[str] = []
    for name in agent.tools:
        offered = registry.find(name)
        if offered is not None:
            book[name] = ToolInfo(spec=offered.spec, timeout_s=offered.timeout_s)
        elif agents.is_agent_tool(name):
            callee = agents.get_agent(name)
            definition = agent_tool(name, callee.description or f"The {name} agent.", callee.id)
            book[name] = ToolInfo(spec=definition.spec(), timeout_s=None, agent_id=definition.agent_id)
        else:
            missing.append(name)
    if missing:
        raise MissingToolsError(agent.id, missing)
    return book


# --- session owners -----------------------------------------------------------------------------


class SessionOwners:
    """Whose each session is, claimed by the session's owner before a turn's run starts.

    A session has one owner (its tenant and principal). When the gateway created it, that is the
    owner it recorded on the session from the creator's credential; only a session created without
    one (`quipu run --session`) is its first turn's. The history's owner is claimed for exactly
    that owner, whoever's turn comes first, so the two always agree and a turn of anybody else is
    refused before any model call (instead of answered, then lost from history). `claims` is the
    rule over both stores (`SessionClaims`): through the storage owner's client one command, which
    the owner applies to its own data, so the check runs beside the turn's memory read. An owner
    never changes, so the answers are kept (at most `sessions` of them): a session's later turns
    cost no store command.
    """

    def __init__(self, claims: SessionClaims, *, sessions: int = 4096) -> None:
        self._claims = claims
        self._sessions = max(1, sessions)
        self._owners: OrderedDict[str, tuple[str, str]] = OrderedDict()

    @classmethod
    def over(cls, store: Store, memory: MemoryStore) -> SessionOwners:
        """Through the storage owner's client (`memory.turn_claims`): one command, which the owner
        applies over its own two stores; else the same rule, here, over `store` and `memory`."""
        claims: SessionClaims = memory.turn_claims or SessionClaimRule(store, memory)
        return cls(claims)

    async def require(self, session_id: str, scope: MemoryScope) -> None:
        """Pass when `scope` owns the session (claiming it when unowned); StoreError else."""
        owner = self._owners.get(session_id)
        if owner is None:
            claimed = await self._claims.claim_session_for_turn(session_id, scope)
            owner = (claimed.tenant_id, claimed.principal_id)
            self._owners[session_id] = owner
            while len(self._owners) > self._sessions:
                self._owners.popitem(last=False)
        require_turn_of(owner, scope, session_id)
