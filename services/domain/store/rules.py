"""The runtime store contract, applied once for every backend (STORE_CONTRACT §6-§9).

`RuleStore` implements the `Store` protocol over a `TransactionRunner`: the in-memory store and
the MongoDB store differ only in how they load, save and list inside one atomic unit. Inside an
operation every check runs before the first write, so a refused command writes nothing even
where the backend could not roll back.

One module of over 500 lines on purpose: it is one rule set, the state machine of sessions and
runs (start, append, suspend, cancel, end, purge) that STORE_CONTRACT §6-§9 states, one method
per operation over the same `_Writes` and the same small checks at the bottom. Read in one place
it can be held against the contract section by section and against the one conformance suite
that runs it over three stores; split, a rule and the check it relies on would sit apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import NoReturn

from quipu.contracts.errors import ErrorCode, StoreError, invalid
from quipu.contracts.lifecycle import (
    decode_cancellation_intent,
    decode_child_run_linked,
    decode_run_completed,
    decode_run_suspended,
)
from quipu.contracts.store import (
    AppendResult,
    CancellationReason,
    Checkpoint,
    LifecycleType,
    LogBasis,
    Page,
    Record,
    RunMeta,
    RunStart,
    RunStatus,
    Session,
    SessionOwner,
    SessionStatus,
    StartOutcome,
    StartResult,
    extend_chain,
)
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.store.cursors import CursorCodec
from quipu.services.domain.store.state import (
    RunState,
    SessionState,
    StoredStart,
    StoreTransaction,
    TransactionRunner,
)
from quipu.services.domain.store.validation import (
    check_envelope,
    check_start,
    check_step_records,
    page_limit,
    require_id,
    require_millisecond,
)


def _fail(code: ErrorCode, message: str) -> NoReturn:
    raise StoreError(code, message)


class _Writes:
    """The writes of one operation, applied only after every check passed."""

    def __init__(self, tx: StoreTransaction, session: SessionState | None) -> None:
        self.tx = tx
        self.session = session
        self.runs: dict[str, RunState] = {}
        self.session_changed = False
        self.inserts: list[tuple[RunState, Record, int]] = []

    def run(self, state: RunState) -> RunState:
        return self.runs.get(state.run_id, state)

    async def append(self, run: RunState, record: Record) -> Record:
        """Give the record the next per-run (and per-session) sequence; it is inserted at commit."""
        current = self.run(run)
        sequence = current.record_count + 1
        session_sequence = 0
        if self.session is not None and record.session_id:
            session_sequence = self.session.record_count + 1
            self.session = self.session.model_copy(update={"record_count": session_sequence})
            self.session_changed = True
        stored = record.model_copy(update={"id": str(sequence)})
        chain = None if current.log_chain is None else extend_chain(current.log_chain, stored)
        self.runs[run.run_id] = current.model_copy(update={"record_count": sequence, "log_chain": chain})
        self.inserts.append((current, stored, session_sequence))
        return stored

    def update(self, run: RunState, **changes: object) -> None:
        self.runs[run.run_id] = self.run(run).model_copy(update=changes)

    def count_start(self) -> int:
        """Take the session's next start position."""
        if self.session is None:
            return 0
        self.session = self.session.model_copy(update={"run_count": self.session.run_count + 1})
        self.session_changed = True
        return self.session.run_count

    async def commit(self) -> None:
        if self.inserts:
            # One write for every record of the operation (a step's records, a start's two or three).
            await self.tx.insert_records(self.inserts)
        # Session-scoped writes always bump the session document, so they conflict with a purge.
        for state in self.runs.values():
            await self.tx.save_run(state.model_copy(update={"revision": state.revision + 1}))
        if self.session is not None and self.session_changed:
            await self.tx.save_session(
                self.session.model_copy(update={"revision": self.session.revision + 1})
            )


class RuleStore:
    """A `Store` whose rules live here and whose state lives behind a `TransactionRunner`."""

    def __init__(
        self,
        transactions: TransactionRunner,
        cursor_secret: bytes,
        clock: Callable[[], datetime] = utc_now_ms,
    ) -> None:
        self._transactions = transactions
        self._cursors = CursorCodec(cursor_secret)
        self._clock = clock

    # --- capabilities: none, each call is applied before it returns (`Store`) -------------------

    @property
    def pipeline(self) -> None:
        """None: a call here is applied before it returns."""
        return None

    @property
    def outbox(self) -> None:
        """None: the caller publishes a step's tool calls once the append returns."""
        return None

    @property
    def owner_memory(self) -> None:
        """None: a direct store keeps no memory of its own."""
        return None

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(
        self, session_id: str, created_at: datetime, owner: SessionOwner | None = None
    ) -> Session:
        require_id("session_id", session_id)
        require_millisecond("created_at", created_at)

        async def apply(tx: StoreTransaction) -> Session:
            await self._refuse_purged(tx, session_id)
            existing = await tx.load_session(session_id)
            if existing is not None:
                if existing.status is SessionStatus.ENDED:
                    _fail(ErrorCode.SESSION_ENDED, "session has ended")
                return existing.session
            session = Session(
                session_id=session_id, status=SessionStatus.ACTIVE, created_at=created_at, owner=owner
            )
            await tx.save_session(SessionState(session=session, revision=1))
            return session

        return await self._transactions.run(apply)

    async def end_session(self, session_id: str, ended_at: datetime) -> Session:
        require_id("session_id", session_id)
        require_millisecond("ended_at", ended_at)

        async def apply(tx: StoreTransaction) -> Session:
            state = await self._session(tx, session_id)
            if state.status is SessionStatus.ENDED:
                return state.session
            session = state.session.model_copy(update={"status": SessionStatus.ENDED, "ended_at": ended_at})
            await tx.save_session(
                state.model_copy(update={"session": session, "revision": state.revision + 1})
            )
            return session

        return await self._transactions.run(apply)

    async def load_session_status(self, session_id: str) -> Session:
        require_id("session_id", session_id)

        async def apply(tx: StoreTransaction) -> Session:
            return (await self._session(tx, session_id)).session

        return await self._transactions.read(apply)  # one document

    async def purge_session(self, session_id: str) -> None:
        require_id("session_id", session_id)

        async def apply(tx: StoreTransaction) -> None:
            if await tx.is_tombstoned(session_id):
                return
            state = await tx.load_session(session_id)
            if state is None:
                _fail(ErrorCode.SESSION_NOT_FOUND, "session was never created")
            if state.status is SessionStatus.ACTIVE:
                _fail(ErrorCode.SESSION_ACTIVE, "end the session before purging it")
            if any(run.status is RunStatus.RUNNING for run in await tx.list_runs(session_id)):
                _fail(ErrorCode.SESSION_HAS_ACTIVE_RUNS, "a run of the session is still running")
            await tx.purge(session_id)

        await self._transactions.run(apply)

    # --- starts ---------------------------------------------------------------------------------

    async def start_root_run(
        self, run: RunStart, started: Record, stopped: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        check_start(run, started, stopped, None, sessioned=True, records=records)
        return await self._start(run, started, stopped, None, records)

    async def start_child_run(
        self,
        run: RunStart,
        parent_link: Record,
        started: Record,
        stopped: Record,
        records: Sequence[Record] = (),
    ) -> StartResult:
        check_start(run, started, stopped, parent_link, sessioned=True, records=records)
        return await self._start(run, started, stopped, parent_link, records)

    async def start_one_shot_run(
        self, run: RunStart, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        check_start(run, started, None, None, sessioned=False, records=records)
        return await self._start(run, started, None, None, records)

    async def start_one_shot_child_run(
        self, run: RunStart, parent_link: Record, started: Record, records: Sequence[Record] = ()
    ) -> StartResult:
        check_start(run, started, None, parent_link, sessioned=False, records=records)
        return await self._start(run, started, None, parent_link, records)

    async def _start(
        self,
        run: RunStart,
        started: Record,
        stopped: Record | None,
        parent_link: Record | None,
        records: Sequence[Record],
    ) -> StartResult:
        carried = list(records)

        async def apply(tx: StoreTransaction) -> StartResult:
            if run.session_id:
                await self._refuse_purged(tx, run.session_id)
            existing = await tx.load_run(run.run_id, likely_absent=True)
            session = await tx.load_session(run.session_id) if run.session_id else None
            if existing is not None:
                result = _retried_start(existing, run, started, stopped, parent_link, session)
                if carried and existing.start_outcome is StartOutcome.PROCEED:
                    await _same_first_records(tx, run.run_id, carried, session)
                return result
            if run.session_id and session is None:
                _fail(ErrorCode.SESSION_NOT_FOUND, "session was never created")
            predecessor = None
            if run.predecessor_run_id:
                predecessor = await self._admissible_predecessor(tx, run, parent_link)
            parent = None
            if parent_link is not None:
                parent = await self._linkable_parent(tx, run, parent_link)
            return await self._write_start(
                tx, run, started, stopped, parent_link, session, parent, predecessor, carried
            )

        return await self._transactions.run(apply)

    async def _admissible_predecessor(
        self, tx: StoreTransaction, run: RunStart, parent_link: Record | None
    ) -> RunState:
        """The continuation checks of §7, in their order."""
        predecessor = await tx.load_run(run.predecessor_run_id)
        if predecessor is None:
            _fail(ErrorCode.RUN_NOT_FOUND, "predecessor run not found")
        if predecessor.session_id != run.session_id:
            _fail(ErrorCode.RUN_SESSION_MISMATCH, "predecessor is in another session")
        if predecessor.status is not RunStatus.SUSPENDED:
            _fail(ErrorCode.RUN_SUSPENSION_NOT_FOUND, "predecessor is not suspended")
        if predecessor.successor_run_id:
            _fail(ErrorCode.RUN_CONFLICT, "predecessor already has a successor")
        if predecessor.agent_id != run.agent_id or bool(predecessor.parent_run_id) != bool(run.parent_run_id):
            _fail(ErrorCode.RUN_CONFLICT, "continuation must keep the agent and the parent shape")
        old_link = predecessor.start.parent_link
        if parent_link is not None and old_link is not None:
            old, new = decode_child_run_linked(old_link.payload), decode_child_run_linked(parent_link.payload)
            if (old.tool_name, old.tool_call_id, old.child_agent_id) != (
                new.tool_name,
                new.tool_call_id,
                new.child_agent_id,
            ):
                _fail(ErrorCode.RUN_CONFLICT, "a child continuation repeats its tool call")
            new_parent = await tx.load_run(run.parent_run_id)
            if new_parent is not None and new_parent.agent_id != old_link.agent_id:
                _fail(ErrorCode.RUN_CONFLICT, "the new parent must run the old parent's agent")
        return predecessor

    async def _linkable_parent(self, tx: StoreTransaction, run: RunStart, parent_link: Record) -> RunState:
        parent = await tx.load_run(run.parent_run_id)
        if parent is None:
            _fail(ErrorCode.RUN_NOT_FOUND, "parent run not found")
        if parent.session_id != run.session_id:
            _fail(ErrorCode.RUN_SESSION_MISMATCH, "parent is in another session")
        if parent_link.agent_id != parent.agent_id:
            _fail(ErrorCode.RECORD_OWNER_MISMATCH, "child_run_linked names another parent agent")
        if parent.status is not RunStatus.RUNNING:
            _fail(ErrorCode.RUN_NOT_ACTIVE, "parent run is not running")
        if await tx.load_record(parent.run_id, parent_link.event_key) is not None:
            _fail(ErrorCode.EVENT_CONFLICT, "link key already used on the parent")
        return parent

    async def _write_start(
        self,
        tx: StoreTransaction,
        run: RunStart,
        started: Record,
        stopped: Record | None,
        parent_link: Record | None,
        session: SessionState | None,
        parent: RunState | None,
        predecessor: RunState | None,
        carried: list[Record],
    ) -> StartResult:
        now = self._clock()
        stop = session is not None and session.status is SessionStatus.ENDED
        writes = _Writes(tx, session)
        start_order = writes.count_start()
        link_id = ""
        if parent is not None and parent_link is not None:
            link_id = (await writes.append(parent, parent_link)).id
        state = RunState(
            run_id=run.run_id,
            agent_id=run.agent_id,
            session_id=run.session_id,
            parent_run_id=run.parent_run_id,
            predecessor_run_id=run.predecessor_run_id,
            started_at=run.started_at,
            labels=run.labels,
            tenant_id=run.tenant_id,
            principal_id=run.principal_id,
            status=RunStatus.CANCELED if stop else RunStatus.RUNNING,
            start_outcome=StartOutcome.STOP if stop else StartOutcome.PROCEED,
            cancellation_reason=CancellationReason.SESSION_ENDED.value if stop else "",
            updated_at=now,
            start=StoredStart(started=started, stopped=stopped, parent_link=parent_link, started_id=""),
            terminal_key=stopped.event_key if stop and stopped is not None else "",
            start_order=start_order,
            log_chain="",
        )
        started_id = (await writes.append(state, started)).id
        stopped_id = (await writes.append(state, stopped)).id if stop and stopped is not None else ""
        for record in [] if stop else carried:
            await writes.append(state, record)  # a stopped run never plans: its first step is not written
        writes.update(
            state,
            start=state.start.model_copy(
                update={"started_id": started_id, "stopped_id": stopped_id, "parent_link_id": link_id}
            ),
        )
        if predecessor is not None:
            writes.update(predecessor, successor_run_id=run.run_id, updated_at=now)
        await writes.commit()
        return _start_result(writes.run(state), session, inserted=True)

    # --- record writes --------------------------------------------------------------------------

    async def append_run_record(self, record: Record) -> AppendResult:
        return (await self.append_run_records([record]))[0]

    async def append_run_records(
        self, records: Sequence[Record], *, follows: LogBasis | None = None
    ) -> list[AppendResult]:
        step = list(records)
        check_step_records(step)

        async def apply(tx: StoreTransaction) -> list[AppendResult]:
            run, session = await self._record_owner(tx, *step)
            stored, chained = await _read_for(tx, run, step, follows)
            retried = [_retried(stored, record, session) for record in step]
            new = [record for record, result in zip(step, retried, strict=True) if result is None]
            _check_follows(follows, run, stored, chained, writes_anew=bool(new))
            if new and run.status.closed:
                _fail(ErrorCode.RUN_NOT_ACTIVE, "run is closed")
            writes = _Writes(tx, session)
            appended = iter([await writes.append(run, record) for record in new])
            await writes.commit()
            status = _status(session)
            return [
                result or AppendResult(record_id=next(appended).id, inserted=True, session_status=status)
                for result in retried
            ]

        return await self._transactions.run(apply)

    async def record_run_cancellation(self, record: Record) -> AppendResult:
        check_envelope(record, LifecycleType.CANCELLATION_INTENT)
        reason = decode_cancellation_intent(record.payload).reason

        async def apply(tx: StoreTransaction) -> AppendResult:
            run, session = await self._record_owner(tx, record)
            if run.cancellation_reason and run.cancellation_reason != reason:
                _fail(ErrorCode.RUN_CANCELLATION_CONFLICT, "another cancellation reason is stored")
            if run.cancellation_key:
                if run.cancellation_key != record.event_key:
                    _fail(ErrorCode.RUN_CANCELLATION_CONFLICT, "another cancellation intent is stored")
                return await _exact_retry_or_conflict(tx, record, session)
            await _refuse_used_key(tx, record)
            if run.status.closed:
                _fail(ErrorCode.RUN_NOT_ACTIVE, "run is closed")
            return await self._append(
                tx,
                run,
                session,
                record,
                cancellation_reason=reason,
                cancellation_key=record.event_key,
            )

        return await self._transactions.run(apply)

    async def record_run_suspension(self, checkpoint: Checkpoint, record: Record) -> AppendResult:
        check_envelope(record, LifecycleType.RUN_SUSPENDED)
        require_id("checkpoint.suspension_id", checkpoint.suspension_id)
        if not checkpoint.data:
            raise invalid("checkpoint data must be non-empty")
        if decode_run_suspended(record.payload).suspension_id != checkpoint.suspension_id:
            raise invalid("run_suspended suspension_id must equal the checkpoint's")

        async def apply(tx: StoreTransaction) -> AppendResult:
            run, session = await self._record_owner(tx, record)
            if run.status.final:
                _fail(ErrorCode.RUN_TERMINAL_CONFLICT, "run has already ended")
            if run.status is RunStatus.SUSPENDED:
                if run.checkpoint != checkpoint or run.suspension_key != record.event_key:
                    _fail(ErrorCode.RUN_SUSPENSION_CONFLICT, "run is suspended with another checkpoint")
                return await _exact_retry_or_conflict(tx, record, session)
            if run.cancellation_reason:
                _fail(ErrorCode.RUN_CANCELLATION_CONFLICT, "a cancellation was requested")
            await _refuse_used_key(tx, record)
            return await self._append(
                tx,
                run,
                session,
                record,
                status=RunStatus.SUSPENDED,
                checkpoint=checkpoint,
                suspension_key=record.event_key,
                terminal_key=record.event_key,
            )

        return await self._transactions.run(apply)

    async def record_run_terminal(
        self, record: Record, records: Sequence[Record] = (), *, follows: LogBasis | None = None
    ) -> AppendResult:
        check_envelope(record, LifecycleType.RUN_COMPLETED)
        carried = list(records)
        if carried:
            check_step_records(carried, closing=record)
        payload = decode_run_completed(record.payload)

        async def apply(tx: StoreTransaction) -> AppendResult:
            run, session = await self._record_owner(tx, record, *carried)
            # One read answers the terminal's key, every carried record's and the log it follows
            # (§6.7, §6.4.1).
            sent = [record, *carried]
            stored, chained = await _read_for(tx, run, sent, follows)
            anew = not all(_stored_as_sent(stored, each) for each in sent)
            _check_follows(follows, run, stored, chained, writes_anew=anew)
            if run.status.closed:
                if run.status is not payload.run_status or run.terminal_key != record.event_key:
                    _fail(ErrorCode.RUN_TERMINAL_CONFLICT, "run already closed otherwise")
                result = _retried(stored, record, session)
                if result is None:
                    _fail(ErrorCode.EVENT_CONFLICT, "stored key has no record")
                if any(_retried(stored, carried_record, session) is None for carried_record in carried):
                    _fail(ErrorCode.RUN_NOT_ACTIVE, "run is closed")
                return result
            if dict(payload.labels) != run.labels:
                raise invalid("run_completed labels must equal the run's")
            _check_provenance(run, payload.run_status, payload.cancellation_reason)
            if record.event_key in stored:
                _fail(ErrorCode.EVENT_CONFLICT, "event key already used by another record")
            new = [
                carried_record
                for carried_record in carried
                if _retried(stored, carried_record, session) is None
            ]
            return await self._append(
                tx,
                run,
                session,
                record,
                new,
                status=payload.run_status,
                terminal_key=record.event_key,
            )

        return await self._transactions.run(apply)

    async def _record_owner(
        self, tx: StoreTransaction, record: Record, *others: Record
    ) -> tuple[RunState, SessionState | None]:
        """Record checks of §6.4 after validation: tombstone, run, ownership (`others` are records
        of the same run, checked for validation's sake by `check_step_records`)."""
        if record.session_id:
            await self._refuse_purged(tx, record.session_id)
        run = await tx.load_run(record.run_id)
        if run is None:
            _fail(ErrorCode.RUN_NOT_FOUND, "run not found")
        for each in (record, *others):
            if (run.agent_id, run.session_id) != (each.agent_id, each.session_id):
                _fail(ErrorCode.RECORD_OWNER_MISMATCH, "record names another agent or session")
        session = await tx.load_session(run.session_id) if run.session_id else None
        return run, session

    async def _append(
        self,
        tx: StoreTransaction,
        run: RunState,
        session: SessionState | None,
        record: Record,
        before: Sequence[Record] = (),
        **changes: object,
    ) -> AppendResult:
        """Append `before` (ordinary records carried by the operation), then `record`, and apply `changes`."""
        writes = _Writes(tx, session)
        for carried in before:
            await writes.append(run, carried)
        stored = await writes.append(run, record)
        if changes:
            writes.update(run, updated_at=self._clock(), **changes)
        await writes.commit()
        return AppendResult(record_id=stored.id, inserted=True, session_status=_status(session))

    # --- reads ----------------------------------------------------------------------------------

    async def load_run(self, run_id: str) -> RunMeta:
        require_id("run_id", run_id)

        async def apply(tx: StoreTransaction) -> RunMeta:
            return (await _run(tx, run_id)).meta()

        return await self._transactions.run(apply)

    async def load_run_suspension(self, run_id: str) -> Checkpoint:
        require_id("run_id", run_id)

        async def apply(tx: StoreTransaction) -> Checkpoint:
            checkpoint = (await _run(tx, run_id)).checkpoint
            if checkpoint is None:
                _fail(ErrorCode.RUN_SUSPENSION_NOT_FOUND, "run has no checkpoint")
            return checkpoint

        return await self._transactions.run(apply)

    async def list_run_records(self, run_id: str, cursor: str, limit: int) -> Page:
        require_id("run_id", run_id)
        size = page_limit(limit)
        scope = f"run:{run_id}"
        after = self._cursors.read(scope, cursor)

        async def apply(tx: StoreTransaction) -> Page:
            await _run(tx, run_id)
            records = await tx.list_records(run_id, after, size + 1)
            return self._page(scope, [(int(record.id), record) for record in records], size)

        return await self._transactions.run(apply)

    async def list_session_run_records(self, session_id: str, cursor: str, limit: int) -> Page:
        require_id("session_id", session_id)
        size = page_limit(limit)
        scope = f"session:{session_id}"
        after = self._cursors.read(scope, cursor)

        async def apply(tx: StoreTransaction) -> Page:
            await self._session(tx, session_id)
            return self._page(scope, await tx.list_session_records(session_id, after, size + 1), size)

        return await self._transactions.run(apply)

    async def list_runs_by_session(self, session_id: str, statuses: list[RunStatus]) -> list[RunMeta]:
        require_id("session_id", session_id)
        wanted = set(statuses)

        async def apply(tx: StoreTransaction) -> list[RunMeta]:
            await self._session(tx, session_id)
            runs = await tx.list_runs(session_id)
            return [run.meta() for run in runs if not wanted or run.status in wanted]

        return await self._transactions.run(apply)

    def _page(self, scope: str, rows: list[tuple[int, Record]], size: int) -> Page:
        shown = rows[:size]
        next_cursor = self._cursors.make(scope, shown[-1][0]) if len(rows) > size else ""
        return Page(records=[record for _, record in shown], next_cursor=next_cursor)

    # --- shared checks --------------------------------------------------------------------------

    async def _refuse_purged(self, tx: StoreTransaction, session_id: str) -> None:
        if await tx.is_tombstoned(session_id):
            _fail(ErrorCode.SESSION_PURGED, "session was purged")

    async def _session(self, tx: StoreTransaction, session_id: str) -> SessionState:
        await self._refuse_purged(tx, session_id)
        state = await tx.load_session(session_id)
        if state is None:
            _fail(ErrorCode.SESSION_NOT_FOUND, "session was never created")
        return state


# --- pure helpers -------------------------------------------------------------------------------


def _status(session: SessionState | None) -> str:
    return session.status.value if session is not None else ""


async def _run(tx: StoreTransaction, run_id: str) -> RunState:
    run = await tx.load_run(run_id)
    if run is None:
        _fail(ErrorCode.RUN_NOT_FOUND, "run not found")
    return run


async def _read_for(
    tx: StoreTransaction, run: RunState, written: Sequence[Record], follows: LogBasis | None
) -> tuple[dict[str, Record], bool | None]:
    """What a write of `written` following `follows` is decided on, in one read: the records at
    its own keys and, unless the run's chain answers whether its log is still `follows` (the
    second value, None when it cannot), those at the basis's keys."""
    keys = [record.event_key for record in written]
    chained = await _holds_chained(tx, run, follows, keys)
    basis = follows.keys if follows is not None and chained is None else []
    stored = await tx.load_records(run.run_id, keys + basis, likely_absent=_new_unless_closed(run, keys))
    return stored, chained


def _new_unless_closed(run: RunState, keys: list[str]) -> list[str]:
    """A write's own keys, expected absent while its run is open (a closed run's write is most
    likely a redelivery, whose keys are there)."""
    return [] if run.status.closed else keys


async def _holds_chained(
    tx: StoreTransaction, run: RunState, follows: LogBasis | None, keys: list[str]
) -> bool | None:
    """Whether the run's log is still `follows`, as the run's chain answers it without a read;
    None when it cannot (no basis or no chain on either side, a log since erased, or one of the
    write's own keys among the basis's, which only a read of that record settles)."""
    if follows is None or follows.chain is None or not set(keys).isdisjoint(follows.keys):
        return None
    chain = await tx.log_chain(run)
    return None if chain is None else follows.holds_chained(run.record_count, chain)


def _check_follows(
    follows: LogBasis | None,
    run: RunState,
    stored: dict[str, Record],
    chained: bool | None,
    *,
    writes_anew: bool,
) -> None:
    """RUN_LOG_MOVED when a write that is not an exact retry follows a log that is no longer the
    run's (§6.4, §6.7): as the run's chain answers (`chained`), else as the records read at the
    basis's keys (`stored`) do."""
    if not writes_anew or follows is None:
        return
    holds = follows.holds(run.record_count, stored) if chained is None else chained
    if not holds:
        _fail(ErrorCode.RUN_LOG_MOVED, "the run's log is no longer the one the write was decided on")


def _stored_as_sent(stored: dict[str, Record], record: Record) -> bool:
    """Whether `stored` (records by key, read in this transaction) holds this very record."""
    existing = stored.get(record.event_key)
    return existing is not None and existing.same_content(record)


def _retried(stored: dict[str, Record], record: Record, session: SessionState | None) -> AppendResult | None:
    """The original result when `stored` (records by key, read in this transaction) holds this
    very record at its key; None when the key is free; EVENT_CONFLICT when it holds another."""
    existing = stored.get(record.event_key)
    if existing is None:
        return None
    if not existing.same_content(record):
        _fail(ErrorCode.EVENT_CONFLICT, "event key holds a different record")
    return AppendResult(record_id=existing.id, inserted=False, session_status=_status(session))


async def _exact_retry(
    tx: StoreTransaction, record: Record, session: SessionState | None
) -> AppendResult | None:
    """The original result when the key holds this very record; EVENT_CONFLICT if another."""
    existing = await tx.load_record(record.run_id, record.event_key)
    return _retried({} if existing is None else {record.event_key: existing}, record, session)


async def _exact_retry_or_conflict(
    tx: StoreTransaction, record: Record, session: SessionState | None
) -> AppendResult:
    retried = await _exact_retry(tx, record, session)
    if retried is None:
        # The run's bookkeeping names this key, so the record must exist; treat a gap as a conflict.
        _fail(ErrorCode.EVENT_CONFLICT, "stored key has no record")
    return retried


async def _refuse_used_key(tx: StoreTransaction, record: Record) -> None:
    if await tx.load_record(record.run_id, record.event_key) is not None:
        _fail(ErrorCode.EVENT_CONFLICT, "event key already used by another record")


def _check_provenance(run: RunState, status: RunStatus, reason: str) -> None:
    """§9: a stored reason allows only `canceled` with it; none allows only `engine_canceled`."""
    stored = run.cancellation_reason
    if stored and (status is not RunStatus.CANCELED or reason != stored):
        _fail(ErrorCode.RUN_CANCELLATION_CONFLICT, f"run must end canceled with {stored}")
    if not stored and status is RunStatus.CANCELED and reason != CancellationReason.ENGINE_CANCELED:
        _fail(ErrorCode.RUN_CANCELLATION_CONFLICT, "cancel without a request needs engine_canceled")


async def _same_first_records(
    tx: StoreTransaction, run_id: str, carried: list[Record], session: SessionState | None
) -> None:
    """A retried start of a run that proceeded carries exactly what it wrote (a stop wrote none):
    a key it does not hold is RUN_CONFLICT, other content EVENT_CONFLICT."""
    stored = await tx.load_records(run_id, [record.event_key for record in carried])
    for record in carried:
        if _retried(stored, record, session) is None:
            _fail(ErrorCode.RUN_CONFLICT, "the start carries records its first attempt did not write")


def _same_start(stored: Record | None, given: Record | None) -> bool | None:
    """None when keys differ (RUN_CONFLICT); False when same key, other content (EVENT_CONFLICT)."""
    if stored is None or given is None:
        return True if stored is given else None
    if stored.event_key != given.event_key:
        return None
    return (stored.type, stored.payload, stored.timestamp, stored.turn_id) == (
        given.type,
        given.payload,
        given.timestamp,
        given.turn_id,
    )


def _retried_start(
    existing: RunState,
    run: RunStart,
    started: Record,
    stopped: Record | None,
    parent_link: Record | None,
    session: SessionState | None,
) -> StartResult:
    identity = (
        existing.agent_id,
        existing.session_id,
        existing.parent_run_id,
        existing.predecessor_run_id,
        existing.started_at,
        existing.labels,
        existing.tenant_id,
        existing.principal_id,
    )
    if identity != (
        run.agent_id,
        run.session_id,
        run.parent_run_id,
        run.predecessor_run_id,
        run.started_at,
        run.labels,
        run.tenant_id,
        run.principal_id,
    ):
        _fail(ErrorCode.RUN_CONFLICT, "run exists with another start")
    comparisons = [
        _same_start(existing.start.started, started),
        _same_start(existing.start.stopped, stopped),
        _same_start(existing.start.parent_link, parent_link),
    ]
    if None in comparisons:
        _fail(ErrorCode.RUN_CONFLICT, "start carries other record keys")
    if False in comparisons:
        _fail(ErrorCode.EVENT_CONFLICT, "start record key holds other content")
    return _start_result(existing, session, inserted=False)


def _start_result(state: RunState, session: SessionState | None, inserted: bool) -> StartResult:
    status = _status(session)

    def result(record_id: str) -> AppendResult:
        return AppendResult(record_id=record_id, inserted=inserted, session_status=status)

    start = state.start
    return StartResult(
        decision=state.start_outcome,
        run_status=state.status,
        started=result(start.started_id),
        parent_link=result(start.parent_link_id) if start.parent_link is not None else None,
        stopped=result(start.stopped_id) if state.start_outcome is StartOutcome.STOP else None,
    )
