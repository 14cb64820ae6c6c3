"""The fact extractor's I/O: the memory store, the model, and `FactExtractor`, which runs the logic.

One recorded turn, in order:

1. skip it when the agent keeps no memory (`memory_opt_out`) or the turn has no principal;
2. load the turn's rows (the user's row, the answer, and the assistant message before it) and
   the scope's current facts;
3. ask the model for operations (structured output), validate them in code (`logic`), and apply
   what passed in one atomic `apply_fact_operations` keyed by the turn id: a redelivered
   `HistoryRecorded` finds its operations already applied (or, with the facts they created now
   current, proposes nothing new) and changes nothing;
4. on every N-th turn of a session, rewrite the principal's short profile from the user's recent
   words, the current facts and the previous profile (best effort: a model failure keeps the old
   profile until the next N-th turn).

A turn whose principal was forgotten while it was being read meets the store's refusal
(`PRINCIPAL_FORGOTTEN`) and is settled as skipped: nothing of it is kept.

Logs carry identifiers, counts, reasons and categories; never a fact's text or the user's words.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.errors import ErrorCode, StoreRefusedError
from quipu.contracts.memory import (
    Fact,
    FactChanged,
    HistoryMessage,
    HistoryRecorded,
    HistoryRole,
    MemoryScope,
    Profile,
)
from quipu.contracts.wire import to_millisecond
from quipu.services.domain.memory.context import is_anonymous_principal
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.models.factory import make_model
from quipu.services.domain.models.port import ModelClient, ModelError, ModelRequest, ModelResponse, StopReason
from quipu.services.fact_extractor.logic.profile import (
    ProfileLimits,
    profile_due,
    profile_request,
    profile_text,
)
from quipu.services.fact_extractor.logic.proposals import (
    ModelOutputError,
    decode_json_object,
    decode_proposals,
)
from quipu.services.fact_extractor.logic.turn import TurnRows, extraction_request
from quipu.services.fact_extractor.logic.validation import (
    Refusal,
    RefusalReason,
    ValidationLimits,
    validate_operations,
)
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.kit.delivery import PermanentError, RetryableError
from quipu.services.kit.logging import bound_ids, get_logger
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import KafkaSettings

logger = get_logger(__name__)

APPLY_ATTEMPTS = 3
"""Times a batch is re-validated and applied when a fact it touches vanished meanwhile."""

_LOUD_REFUSALS = frozenset({RefusalReason.UNKNOWN_FACT_ID, RefusalReason.SENSITIVE})
"""Refusals logged as warnings: an invented id or sensitive data is worth an operator's look."""


@dataclass(frozen=True)
class TurnOutcome:
    """What one recorded turn did to memory (for tests and logs)."""

    skipped: str = ""
    """Why the turn was not looked at (`memory_opt_out`, `no_principal`, `rows_missing`) or kept
    nothing (`forgotten`: its principal was forgotten while it was read), or ""."""
    changes: list[FactChanged] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    profile: Profile | None = None
    """The profile saved by this turn, if it rewrote one."""


def open_memory_store(kafka: KafkaSettings, settings: FactExtractorSettings) -> KafkaMemoryStore:
    """The storage owner's memory commands over Kafka (start it before use)."""
    return KafkaMemoryStore.for_service(kafka, settings)


def open_model(kafka: KafkaSettings, settings: FactExtractorSettings) -> ModelClient:
    """The configured model, its whole-call deadline capped by the extractor's model timeout."""
    model_settings = settings.model
    if model_settings.deadline_s > settings.model_timeout_s:
        model_settings = model_settings.model_copy(update={"deadline_s": settings.model_timeout_s})
    return make_model(model_settings, max_poll_interval_ms=kafka.max_poll_interval_ms)


def _require_principal(rows: list[HistoryMessage], scope: MemoryScope) -> None:
    """A row of another principal never feeds this principal's memory: the event is dead-lettered."""
    for row in rows:
        if row.principal_id and row.principal_id != scope.principal_id:
            raise PermanentError(f"history of session {row.session_id} belongs to another principal")


class FactExtractor:
    """Turns each recorded turn into validated fact operations, and every N turns into a profile."""

    def __init__(
        self,
        memory: MemoryStore,
        model: ModelClient,
        settings: FactExtractorSettings,
        agents: Mapping[str, AgentDefinition] | None = None,
    ) -> None:
        """`agents`, when given, adds the registry's `memory_opt_out` to the event's own flag."""
        self._memory = memory
        self._model = model
        self._settings = settings
        self._agents = agents or {}
        self._limits = ValidationLimits(
            max_operations=settings.max_operations_per_turn,
            max_fact_chars=settings.max_fact_chars,
            max_facts=settings.max_facts_per_scope,
        )
        self._profile_limits = ProfileLimits(
            max_lines=settings.profile_max_lines,
            max_line_chars=settings.profile_max_line_chars,
            max_chars=settings.profile_max_chars,
        )

    async def on_history_recorded(self, event: HistoryRecorded) -> None:
        """The handler's effect: process one turn (raises RetryableError / PermanentError)."""
        await self.process(event)

    async def process(self, event: HistoryRecorded) -> TurnOutcome:
        """Extract the turn's facts and, when due, rewrite the profile."""
        with bound_ids(
            run_id=event.turn_id,
            session_id=event.session_id,
            tenant_id=event.tenant_id or event.scope.tenant_id or None,
            event_id=event.event_id,
        ):
            skipped = self._skip_reason(event)
            if skipped:
                logger.info("turn skipped", reason=skipped)
                return TurnOutcome(skipped=skipped)
            rows = await self._turn_rows(event)
            if rows is None:
                logger.warning("turn skipped: its history rows are not there", first_seq=event.first_seq)
                return TurnOutcome(skipped="rows_missing")
            try:
                changes, refusals = await self._extract(event, rows)
                profile = None
                if profile_due(event, self._settings.profile_every_turns):
                    profile = await self._rewrite_profile(event)
            except StoreRefusedError as error:
                if error.code is not ErrorCode.PRINCIPAL_FORGOTTEN:
                    raise
                # Forget erased the turn after its rows were read: keeping nothing is the effect.
                logger.info("turn skipped", reason="forgotten")
                return TurnOutcome(skipped="forgotten")
            return TurnOutcome(changes=changes, refusals=refusals, profile=profile)

    def _skip_reason(self, event: HistoryRecorded) -> str:
        agent = self._agents.get(event.scope.agent_id)
        if event.memory_opt_out or (agent is not None and agent.memory_opt_out):
            return "memory_opt_out"
        if is_anonymous_principal(event.scope.principal_id):
            # A session without a person: its own `session:<id>` principal is never looked up again.
            return "no_principal"
        return ""

    # -- the turn ----------------------------------------------------------------------------------

    async def _turn_rows(self, event: HistoryRecorded) -> TurnRows | None:
        """The user's row, the answer and the assistant message before them; None when absent."""
        after = max(event.first_seq - 2, 0)
        rows = await self._memory.list_history(event.session_id, after, max(event.last_seq - after, 1))
        _require_principal(rows, event.scope)
        by_seq = {row.seq: row for row in rows}
        user = by_seq.get(event.first_seq)
        if user is None or user.role is not HistoryRole.USER or user.turn_id != event.turn_id:
            return None
        assistant = by_seq.get(event.last_seq)
        previous = by_seq.get(event.first_seq - 1)
        return TurnRows(
            user=user,
            assistant=assistant if assistant is not None and assistant.turn_id == event.turn_id else None,
            previous_assistant=previous
            if previous is not None and previous.role is HistoryRole.ASSISTANT
            else None,
        )

    # -- facts -------------------------------------------------------------------------------------

    async def _extract(
        self, event: HistoryRecorded, rows: TurnRows
    ) -> tuple[list[FactChanged], list[Refusal]]:
        if not rows.user.text.strip():
            return [], []
        facts = await self._memory.list_facts(event.scope)
        request = extraction_request(event, rows, facts, self._settings.max_output_tokens)
        response = await self._complete(request)
        if response.stop_reason is StopReason.REFUSAL:
            logger.info("the model declined to propose facts")
            return [], []
        try:
            proposals = decode_proposals(response)
        except ModelOutputError as error:
            logger.warning("model answer unusable; no facts from this turn", reason=str(error))
            return [], []
        refusals: list[Refusal] = []
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            validated = validate_operations(proposals, facts, event, rows, self._limits)
            refusals = validated.refusals
            if not validated.operations:
                self._log_outcome(len(proposals.items) + len(proposals.malformed), [], refusals)
                return [], refusals
            try:
                changes = await self._memory.apply_fact_operations(
                    event.scope, validated.operations, idempotency_key=event.turn_id
                )
            except StoreRefusedError as error:
                if error.code is ErrorCode.PRINCIPAL_FORGOTTEN:
                    raise
                if error.code is ErrorCode.FACT_NOT_FOUND and attempt < APPLY_ATTEMPTS:
                    # A fact went (a user deleted it) between reading and applying: validate again.
                    logger.info("a fact changed meanwhile; validating again", attempt=attempt)
                    facts = await self._memory.list_facts(event.scope)
                    continue
                raise PermanentError(
                    f"fact operations refused: {error.code.value}: {error.message}"
                ) from error
            sent = {(op.fact_id, op.text) for op in validated.operations}
            if {(change.fact_id, change.text) for change in changes} != sent:
                # A redelivery whose answer differs: the turn's first operations stand, unchanged.
                logger.info(
                    "turn already applied under its id; its recorded changes stand", recorded=len(changes)
                )
                self._log_outcome(len(proposals.items) + len(proposals.malformed), [], refusals)
            else:
                self._log_outcome(len(proposals.items) + len(proposals.malformed), changes, refusals)
            return changes, refusals
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    @staticmethod
    def _log_outcome(proposed: int, changes: list[FactChanged], refusals: list[Refusal]) -> None:
        for refusal in refusals:
            log = logger.warning if refusal.reason in _LOUD_REFUSALS else logger.info
            log(
                "proposal refused",
                index=refusal.index,
                reason=refusal.reason.value,
                category=refusal.category.value if refusal.category else None,
                fact_ref=refusal.fact_ref or None,
            )
        kinds = Counter(change.kind.value for change in changes)
        logger.info(
            "facts extracted",
            proposed=proposed,
            applied=len(changes),
            created=kinds["created"],
            updated=kinds["updated"],
            deleted=kinds["deleted"],
            refused=len(refusals),
        )

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        try:
            return await asyncio.wait_for(self._model.complete(request), self._settings.model_timeout_s)
        except TimeoutError as error:
            raise RetryableError(f"model call {request.call_key} timed out") from error
        except ModelError as error:
            if error.retryable:
                raise RetryableError(f"model call {request.call_key}: {error.kind}") from error
            raise PermanentError(f"model call {request.call_key}: {error.kind}: {error}") from error

    # -- the profile -------------------------------------------------------------------------------

    async def _rewrite_profile(self, event: HistoryRecorded) -> Profile | None:
        scope = event.scope
        as_of = to_millisecond(event.occurred_at)
        previous = await self._memory.load_profile(scope)
        if previous is not None and previous.updated_at >= as_of:
            # This turn (redelivered) or a later one already rewrote it.
            logger.info("profile already rewritten as of this turn")
            return None
        turns = self._settings.profile_every_turns
        after = max(event.last_seq - 2 * turns, 0)
        rows = await self._memory.list_history(event.session_id, after, max(event.last_seq - after, 1))
        _require_principal(rows, scope)
        said = [row for row in rows if row.role is HistoryRole.USER]
        if not any(row.text.strip() for row in said):
            return None
        facts: list[Fact] = await self._memory.list_facts(scope)
        request = profile_request(
            event, previous, facts, [row.text for row in said], self._settings.max_output_tokens
        )
        try:
            response = await self._complete(request)
            lines = decode_json_object(response, "lines")
        except (RetryableError, PermanentError, ModelOutputError) as error:
            logger.warning("profile not rewritten; the previous one stays", reason=str(error))
            return None
        result = profile_text(lines, self._profile_limits)
        for category in result.refused:
            logger.warning(
                "profile line refused", reason=RefusalReason.SENSITIVE.value, category=category.value
            )
        if not result.text:
            logger.info("profile rewrite came back empty; the previous one stays", dropped=result.dropped)
            return None
        profile = Profile(
            scope=scope,
            text=result.text,
            source_turns=(previous.source_turns if previous is not None else 0) + len(said),
            updated_at=as_of,
        )
        saved = await self._memory.save_profile(profile)
        logger.info(
            "profile rewritten",
            lines=result.text.count("\n") + 1,
            source_turns=saved.source_turns,
            refused=len(result.refused),
            dropped=result.dropped,
        )
        return saved
