"""Storage commands and replies (`storage.commands`, `storage.replies`), one model per operation.

Each command names a `Store` method; its arguments are exactly the command's own fields, so the
owner dispatches with `getattr(store, command.method)(**command.arguments())`.

The framing (docs/wire.md): a command is one JSON object decoded strictly by `decode_command`;
its reply goes to the deployment's replies topic, on the partition its `quipu-reply-partition`
header names (never to a topic a message names).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from quipu.contracts.errors import ErrorBody
from quipu.contracts.memory_commands import MemoryCommand
from quipu.contracts.sealed import SealedFor, refuse_unopened, without_empty
from quipu.contracts.store import (
    AppendResult,
    Checkpoint,
    LogBasis,
    Page,
    Record,
    RunMeta,
    RunStart,
    RunStatus,
    Session,
    SessionOwner,
    StartResult,
)
from quipu.contracts.store_operation import StoreOperation as StoreOperation  # noqa: PLC0414  re-exported
from quipu.contracts.tools import TOOLSET_NAME_PATTERN, ToolCallRequested
from quipu.contracts.wire import Timestamp


class CreateSession(StoreOperation, result_type=Session):
    """Create a session, or return the active one unchanged."""

    session_id: str = Field(description="Session to create.")
    created_at: Timestamp = Field(description="Creation time (millisecond precision).")
    owner: SessionOwner | None = Field(
        default=None,
        exclude_if=lambda owner: owner is None,  # a command without one encodes as before the field
        description="Owner recorded on a new session; an existing one keeps its first owner.",
    )


class EndSession(StoreOperation, result_type=Session):
    """End a session; running runs may still write and close."""

    session_id: str = Field(description="Session to end.")
    ended_at: Timestamp = Field(description="End time (millisecond precision).")


class LoadSessionStatus(StoreOperation, result_type=Session):
    """Read a session's status."""

    session_id: str = Field(description="Session to read.")


class PurgeSession(StoreOperation, result_type=None):
    """Tombstone an ended session and delete all of its runs and records."""

    session_id: str = Field(description="Session to purge.")


def _first_records() -> Any:
    """The `records` field of every start (docs/store-contract.md §6.3)."""
    return Field(
        default_factory=list,
        exclude_if=lambda records: not records,  # a start carrying none encodes as before the field
        description="The run's first ordinary records (its context, memory and input), appended after "
        "run_started when the run proceeds, in the same transaction; never written on a stop.",
    )


class StartRootRun(StoreOperation, result_type=StartResult):
    """Start a root run (or a root continuation) in a session."""

    run: RunStart = Field(description="Identity of the run.")
    started: Record = Field(description="The run_started record.")
    stopped: Record = Field(description="The run_completed record written if the session has ended.")
    records: list[Record] = _first_records()


class StartChildRun(StoreOperation, result_type=StartResult):
    """Start a child run in a session, linked on its running parent."""

    run: RunStart = Field(description="Identity of the child run.")
    parent_link: Record = Field(description="The child_run_linked record, written on the parent.")
    started: Record = Field(description="The run_started record.")
    stopped: Record = Field(description="The run_completed record written if the session has ended.")
    records: list[Record] = _first_records()


class StartOneShotRun(StoreOperation, result_type=StartResult):
    """Start a sessionless run."""

    run: RunStart = Field(description="Identity of the run (no session).")
    started: Record = Field(description="The run_started record.")
    records: list[Record] = _first_records()


class StartOneShotChildRun(StoreOperation, result_type=StartResult):
    """Start a sessionless child of a sessionless parent."""

    run: RunStart = Field(description="Identity of the child run (no session).")
    parent_link: Record = Field(description="The child_run_linked record, written on the parent.")
    started: Record = Field(description="The run_started record.")
    records: list[Record] = _first_records()


class AppendRunRecord(StoreOperation, result_type=AppendResult):
    """Append an ordinary record to a running run."""

    record: Record = Field(description="The record to append (not a lifecycle type).")


MAX_CARRIED_CALLS = 100
"""The most tool calls one step's command carries."""


class DispatchedCall(BaseModel):
    """A tool call a step's commit justifies, carried by the step's command (docs/store-contract.md
    §6.4): the owner publishes it once the records commit, to the calls topic its own naming gives
    `toolset`, never to a topic the command names."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    toolset: str = Field(
        pattern=TOOLSET_NAME_PATTERN,
        description="The toolset serving the tool, as its executors announced it ('default': tools.calls).",
    )
    call: ToolCallRequested = Field(description="The call, exactly as the planner would publish it.")


class AppendRunRecords(StoreOperation, result_type=list[AppendResult]):
    """Append the ordinary records of one step to a running run, in order, atomically; then the
    owner publishes the tool calls the step carries (again on an exact retry, never on a refusal)."""

    records: list[Record] = Field(
        description="The step's records, 1 to 100, of one run, keys pairwise distinct (not lifecycle types)."
    )
    calls: list[DispatchedCall] = Field(
        default_factory=list,
        max_length=MAX_CARRIED_CALLS,
        exclude_if=lambda calls: not calls,  # a step carrying none encodes as before the field
        description="Tool calls of the step's run (same run, session and agent as its records) that "
        "the records justify, published by the owner after the commit (not stored).",
    )
    follows: LogBasis | None = Field(
        default=None,
        exclude_if=lambda follows: follows is None,  # an unconditional step encodes as before the field
        description="The run's whole log the step was decided on: a step with a record not yet stored "
        "is refused with RUN_LOG_MOVED unless the run's log is still exactly that (a step sent before "
        "its run's start was answered).",
    )

    published_fields: ClassVar[frozenset[str]] = frozenset({"calls"})


class RecordRunCancellation(StoreOperation, result_type=AppendResult):
    """Record a cancellation intent; the first reason is permanent."""

    record: Record = Field(description="The runtime.cancellation_intent record.")


class RecordRunSuspension(StoreOperation, result_type=AppendResult):
    """Suspend a running run with its checkpoint."""

    checkpoint: Checkpoint = Field(description="Private resume state, stored byte for byte.")
    record: Record = Field(description="The run_suspended record.")


class RecordRunTerminal(StoreOperation, result_type=AppendResult):
    """Close a run as completed, failed or canceled, with the closing step's records."""

    record: Record = Field(description="The run_completed record.")
    records: list[Record] = Field(
        default_factory=list,
        exclude_if=lambda records: not records,  # a terminal carrying none encodes as before the field
        description="Ordinary records of the closing step (the final answer), appended before the "
        "run_completed record in the same transaction.",
    )
    follows: LogBasis | None = Field(
        default=None,
        exclude_if=lambda follows: follows is None,  # an unconditional terminal encodes as before the field
        description="The run's whole log the closing step was decided on: a terminal not yet stored is "
        "refused with RUN_LOG_MOVED unless the run's log is still exactly that (a run's first answer "
        "sent before its start was answered).",
    )


class LoadRun(StoreOperation, result_type=RunMeta):
    """Read a run's metadata."""

    run_id: str = Field(description="Run to read.")


class LoadRunSuspension(StoreOperation, result_type=Checkpoint):
    """Read a suspended run's checkpoint."""

    run_id: str = Field(description="Run whose checkpoint to read.")


class ListRunRecords(StoreOperation, result_type=Page):
    """Page through one run's records in per-run order."""

    run_id: str = Field(description="Run to list.")
    cursor: str = Field(default="", description="Opaque cursor; empty starts at the beginning.")
    limit: int = Field(description="Page size, 1..500 (larger values are capped).")


class ListSessionRunRecords(StoreOperation, result_type=Page):
    """Page through a session's records in commit order across runs."""

    session_id: str = Field(description="Session to list.")
    cursor: str = Field(default="", description="Opaque cursor; empty starts at the beginning.")
    limit: int = Field(description="Page size, 1..500 (larger values are capped).")


class ListRunsBySession(StoreOperation, result_type=list[RunMeta]):
    """List a session's runs in start order, optionally filtered by status."""

    session_id: str = Field(description="Session to list.")
    statuses: list[RunStatus] = Field(default_factory=list, description="Statuses to keep; empty = all.")


StoreCommand = Annotated[
    CreateSession
    | EndSession
    | LoadSessionStatus
    | PurgeSession
    | StartRootRun
    | StartChildRun
    | StartOneShotRun
    | StartOneShotChildRun
    | AppendRunRecord
    | AppendRunRecords
    | RecordRunCancellation
    | RecordRunSuspension
    | RecordRunTerminal
    | LoadRun
    | LoadRunSuspension
    | ListRunRecords
    | ListSessionRunRecords
    | ListRunsBySession
    | MemoryCommand,
    Field(discriminator="op"),
]
"""The payload of `storage.commands`: one of the store or memory operations, discriminated on `op`."""

STORE_COMMAND = TypeAdapter[StoreCommand](StoreCommand)
"""Decodes a command leniently (the models' own configuration); the owner decodes with `STRICT_COMMAND`."""

REPLY_PARTITION_HEADER = "quipu-reply-partition"
"""Header of a command: the partition of the replies topic its reply goes to (ASCII decimal)."""

REPLY_TO_HEADER = "quipu-reply-to"
"""Header of older clients: accepted only when it names the deployment's own replies topic."""


def _refuse(error_type: str, message: str) -> ValidationError:
    detail = InitErrorDetails(type=PydanticCustomError(error_type, message), loc=(), input=None)
    return ValidationError.from_exception_data("StoreCommand", [detail])


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        # The key itself is input, so it is not named.
        raise _refuse("duplicate_key", "a JSON object in the command repeats a key")
    return value


class StrictCommandDecoder:
    """The owner's decoding of `storage.commands`: one strictness for the whole command.

    Unknown fields are refused at every level (top level and nested alike, as records always
    were), so are duplicate keys anywhere in the JSON, and a command needs a non-empty
    `correlation_id`, the only way its reply can be matched. Every refusal is a
    `ValidationError` whose messages carry no input value.
    """

    def validate_json(self, data: bytes | str) -> StoreCommand:
        """Decode one command, or raise `ValidationError` naming the broken rule."""
        command = STORE_COMMAND.validate_json(data, extra="forbid")
        # Only a valid command gets here, so this second parse cannot fail on the JSON itself.
        json.loads(data, object_pairs_hook=_unique_keys)
        if not command.correlation_id:
            raise _refuse("missing_correlation_id", "a command needs a non-empty correlation_id")
        return command


STRICT_COMMAND = StrictCommandDecoder()
"""The decoder the storage owner applies to every message on `storage.commands`."""


class StoreReply(BaseModel):
    """The payload of `storage.replies`: a result or a typed error for one correlation id."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    correlation_id: str = Field(description="The command's correlation id.")
    op: str = Field(default="", description="The operation that was applied.")
    result: Any = Field(default=None, description="JSON form of the operation's result.")
    error: ErrorBody | None = Field(default=None, description="Set instead of result on refusal.")
    sealed_for: SealedFor | None = Field(
        default=None,
        exclude_if=without_empty,
        description=(
            "Whose data key seals `result`: the person whose words it reads back, as the owner's "
            "data says (the same key as at rest); absent: plaintext."
        ),
    )

    sealed_fields: ClassVar[frozenset[str]] = frozenset({"result"})
    """A result may carry anything read back (record payloads, history, facts): sealed when the
    command was (errors name rules and ids, never content, and stay in clear)."""

    _refuse_unopened = model_validator(mode="before")(refuse_unopened)

    @classmethod
    def sealed_field_names(cls) -> frozenset[str]:
        """The fields a sealed reply carries encrypted."""
        return cls.sealed_fields


def encode_result(value: object) -> Any:
    """The JSON form of a `Store` method's return value."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [encode_result(item) for item in value]
    return value


def decode_result(command: StoreOperation, value: Any) -> Any:
    """Parse a reply's result into the command's result type."""
    if command.result_type is None:
        return None
    return TypeAdapter(command.result_type).validate_python(value)
