"""How a run starts: its identity, its first records, its context and its input message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.lifecycle import (
    canonical_json,
    encode_child_run_linked,
    encode_run_completed,
    encode_run_started,
)
from quipu.contracts.runs import ParentToolCall, RunKind, RunRequested
from quipu.contracts.store import CancellationReason, LifecycleType, Record, RunStart, RunStatus
from quipu.contracts.transcript import (
    TRANSCRIPT_MESSAGES_APPENDED,
    TRANSCRIPT_MESSAGES_SEEDED,
    Message,
    TextPart,
    ToolResultPart,
    TranscriptError,
    bounded_tool_result,
    encode_messages,
)
from quipu.contracts.wire import to_millisecond
from quipu.services.domain.memory.context import ContextBlocks
from quipu.services.planner.logic.context import seed_messages
from quipu.services.planner.logic.keys import (
    CONTEXT_KEY,
    CONTEXT_TYPE,
    INPUT_KEY,
    MEMORY_CONTEXT_KEY,
    MEMORY_CONTEXT_TYPE,
    SEED_KEY,
    STARTED_KEY,
    STOPPED_KEY,
)
from quipu.services.planner.logic.payloads import PendingInput, RunContext
from quipu.services.planner.logic.tool_results import result_part
from quipu.services.planner.logic.view import RunView


@dataclass(frozen=True)
class StartPlan:
    """The store call that starts a run: identity, its two records, and a link for children."""

    run: RunStart
    started: Record
    stopped: Record
    parent_link: Record | None = None


def first_records(
    plan: StartPlan,
    context: RunContext,
    opening: Message,
    at: datetime,
    blocks: ContextBlocks | None = None,
    *,
    seed: Sequence[Message] = (),
) -> list[Record]:
    """A run's first records, carried by its start (one write): its context; for a turn the memory
    it is shown (the memory record first: whatever the model is shown, the run says which memory
    it was), then the seed (the memory's, or `seed`: a continuation's predecessor's transcript);
    and the message that opens it (a turn's text, a continuation's answer)."""
    run, when = plan.run, to_millisecond(at)
    records = [run.record(CONTEXT_KEY, CONTEXT_TYPE, context.encode(), at=when)]
    if blocks is not None:
        if blocks.memory is not None:
            memory = canonical_json(blocks.memory.payload())
            records.append(run.record(MEMORY_CONTEXT_KEY, MEMORY_CONTEXT_TYPE, memory, at=when))
        seed = seed_messages(blocks)
    if seed:
        records.append(run.record(SEED_KEY, TRANSCRIPT_MESSAGES_SEEDED, encode_messages(list(seed)), at=when))
    records.append(run.record(INPUT_KEY, TRANSCRIPT_MESSAGES_APPENDED, encode_messages([opening]), at=when))
    return records


def start_plan(run: RunStart, link: tuple[ParentToolCall, str] | None = None) -> StartPlan:
    """The canonical `started`/`stopped` records of `run`, and its parent link (with its key)."""
    started = run.record(STARTED_KEY, LifecycleType.RUN_STARTED.value, encode_run_started(run))
    stopped = run.record(
        STOPPED_KEY,
        LifecycleType.RUN_COMPLETED.value,
        encode_run_completed(
            RunStatus.CANCELED, run.labels, cancellation_reason=CancellationReason.SESSION_ENDED.value
        ),
    )
    parent_link = None
    if link is not None:
        parent, key = link
        parent_link = Record(
            event_key=key,
            run_id=parent.parent_run_id,
            agent_id=parent.parent_agent_id,
            session_id=run.session_id,
            type=LifecycleType.CHILD_RUN_LINKED.value,
            payload=encode_child_run_linked(parent.tool_name, parent.tool_call_id, run.run_id, run.agent_id),
            timestamp=run.started_at,
        )
    return StartPlan(run=run, started=started, stopped=stopped, parent_link=parent_link)


def run_start(
    request: RunRequested,
    *,
    agent_id: str,
    session_id: str,
    parent_run_id: str = "",
    inherited: RunContext | None = None,
) -> RunStart:
    """The identity of the run a request starts; `started_at` is the request's time, so retries repeat it.

    The principal (the request's, else the predecessor's, as in `run_context`) goes to the store,
    which seals the run's records under that person's data key.
    """
    return RunStart(
        run_id=request.run_id,
        agent_id=agent_id,
        session_id=session_id,
        parent_run_id=parent_run_id,
        predecessor_run_id=request.predecessor_run_id if request.kind is RunKind.RESUME else "",
        started_at=to_millisecond(request.occurred_at),
        labels=request.labels,
        tenant_id=request.tenant_id or (inherited.tenant_id if inherited else ""),
        principal_id=request.principal_id or (inherited.principal_id if inherited else ""),
    )


def run_context(
    request: RunRequested, agent: AgentDefinition, inherited: RunContext | None = None
) -> RunContext:
    """Budgets, tenant and principal of a new run: the request's, else the predecessor's, else the
    agent's."""
    return RunContext(
        principal_id=request.principal_id or (inherited.principal_id if inherited else ""),
        max_steps=request.max_steps or (inherited.max_steps if inherited else agent.max_steps),
        max_output_tokens=request.max_tokens
        or (inherited.max_output_tokens if inherited else agent.max_output_tokens),
        parent=request.parent if request.kind is RunKind.CHILD else (inherited.parent if inherited else None),
        tenant_id=request.tenant_id or (inherited.tenant_id if inherited else ""),
    )


def user_message(text: str) -> Message:
    """The user's words as a transcript message."""
    return Message(role="user", parts=(TextPart(text=text),))


def answer_message(predecessor: RunView, pending: Sequence[PendingInput], answer: Any) -> Message:
    """The user message that closes a suspended group: every result in tool-use order.

    Completed tools keep the results they gave (they are never run again); each use that waited
    for input gets the answer (or, when `answer` is an object keyed by the waiting ids, its own).
    """
    waiting = {item.tool_use_id for item in pending}
    per_use = isinstance(answer, dict) and waiting and waiting <= set(answer)
    parts: list[ToolResultPart] = []
    for use in predecessor.last_tool_uses():
        if use.id in waiting:
            given = answer[use.id] if per_use else answer
            parts.append(ToolResultPart(tool_use_id=use.id, content=bounded_tool_result(given, False)))
            continue
        result = predecessor.results.get(use.id)
        if result is None:
            raise TranscriptError(f"tool use {use.id!r} of the suspended run has no result")
        parts.append(result_part(result))
    return Message(role="user", parts=tuple(parts))
