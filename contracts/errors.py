"""Quipu's errors: one root whose type says whether to retry, and the store's error codes.

Every exception the project defines descends from `QuipuError`, and `QuipuError.retryable` is
the one answer to "may the same work succeed if it is tried again?". A class says it once
(`retryable = False` unless the class says otherwise). Where the answer depends on the failure,
the instance says it (a `ModelError`, as its adapter classified the provider's answer) or its
code picks its class (`StoreError(code, message)` is one of two subclasses, as `OSError(ENOENT)`
is a `FileNotFoundError`):

    QuipuError                     retryable = False
    ├── StoreError                 a store operation refused or failed; its code is on the wire
    │   ├── StoreRefusedError      every contract code (STORE_CONTRACT §5): final
    │   └── StoreUnavailableError  UNAVAILABLE: resend the identical command; retryable
    ├── TranscriptError            a transcript that cannot be decoded, replayed or encoded
    ├── PermanentError             an effect's own "never" (`services.kit.delivery`)
    ├── RetryableError             an effect's own "try again" (`services.kit.delivery`); retryable
    ├── ModelError                 a model call failed; retryable as its adapter classified it
    ├── PublishError               the broker did not take a message (`services.kit.publishing`);
    │                              retryable unless the record itself is refused (too large)
    └── ...                        every other error of the project (seals, tools, agents, the
                                   gateway, the CLI, the local stack): permanent

The delivery wrapper asks `is_retryable(error)` and nothing else. A library's exceptions are
turned into these types once, at the adapter that calls the library (pymongo's in the storage
owner, aiokafka's in `TopicPublisher` and the store client, anthropic's in the model adapter; a
pydantic `ValidationError` while decoding is the delivery's `invalid_payload`). What reaches the
wrapper unclassified is a bug, unless it is a lost connection or a timeout, which may heal.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class QuipuError(Exception):
    """Root of every exception Quipu defines; `retryable` says whether trying again may succeed."""

    retryable: bool = False
    """Whether the same work, tried again unchanged, may succeed. False: it never will, so the
    message that failed with it is dead-lettered at once (`permanent_error`)."""


def is_retryable(error: BaseException) -> bool:
    """Whether the work that raised `error` may succeed if tried again, as the error's type says.

    A `QuipuError` answers for itself. Anything else reached the caller unclassified: a lost
    connection or a timeout may heal; any other error (a bug) would fail the same way again.
    """
    if isinstance(error, QuipuError):
        return error.retryable
    return isinstance(error, ConnectionError | TimeoutError)


class ErrorCode(StrEnum):
    """Stable error codes of the runtime store; tests assert codes only."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    SESSION_ENDED = "SESSION_ENDED"
    SESSION_PURGED = "SESSION_PURGED"
    SESSION_ACTIVE = "SESSION_ACTIVE"
    SESSION_HAS_ACTIVE_RUNS = "SESSION_HAS_ACTIVE_RUNS"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    RUN_CONFLICT = "RUN_CONFLICT"
    RUN_TERMINAL_CONFLICT = "RUN_TERMINAL_CONFLICT"
    RUN_CANCELLATION_CONFLICT = "RUN_CANCELLATION_CONFLICT"
    RUN_NOT_ACTIVE = "RUN_NOT_ACTIVE"
    RUN_SUSPENSION_NOT_FOUND = "RUN_SUSPENSION_NOT_FOUND"
    RUN_SUSPENSION_CONFLICT = "RUN_SUSPENSION_CONFLICT"
    RUN_SESSION_MISMATCH = "RUN_SESSION_MISMATCH"
    RECORD_OWNER_MISMATCH = "RECORD_OWNER_MISMATCH"
    EVENT_CONFLICT = "EVENT_CONFLICT"
    RUN_LOG_MOVED = "RUN_LOG_MOVED"
    """A step or a terminal was decided on a log its run no longer has (`follows` of AppendRunRecords
    and RecordRunTerminal)."""
    INVALID_CURSOR = "INVALID_CURSOR"
    MEMORY_CONFLICT = "MEMORY_CONFLICT"
    FACT_NOT_FOUND = "FACT_NOT_FOUND"
    SESSION_PRINCIPAL_MISMATCH = "SESSION_PRINCIPAL_MISMATCH"
    """The session belongs to another principal (or tenant): a run there would be someone else's turn."""
    PRINCIPAL_FORGOTTEN = "PRINCIPAL_FORGOTTEN"
    """The words of a memory write were said before their principal was forgotten (or belong to a
    turn forget erased): writing them would bring back what forget erased. Final, never retried."""
    UNAVAILABLE = "UNAVAILABLE"

    @property
    def retryable(self) -> bool:
        """Only UNAVAILABLE may be retried; every contract error is final."""
        return self is ErrorCode.UNAVAILABLE


class ErrorBody(BaseModel):
    """The error half of a store reply: a stable code and a human message."""

    model_config = ConfigDict(frozen=True)

    code: ErrorCode = Field(description="Stable error code (STORE_CONTRACT §5).")
    message: str = Field(description="Human-readable explanation naming the violated rule.")
    retryable: bool = Field(description="True only for UNAVAILABLE: resend the identical command.")


class StoreError(QuipuError):
    """Raised by every Store implementation when an operation is refused or cannot complete.

    `StoreError(code, message)` is a `StoreRefusedError` or a `StoreUnavailableError` as
    `code.retryable` says, so `except StoreRefusedError` catches exactly the final refusals and
    lets UNAVAILABLE go on to be retried.
    """

    def __new__(cls, code: ErrorCode, message: str) -> StoreError:
        kind = cls
        if cls is StoreError:
            kind = StoreUnavailableError if code.retryable else StoreRefusedError
        elif code.retryable is not cls.retryable:
            raise ValueError(f"{cls.__name__} cannot carry {code.value}")
        return super().__new__(kind, code, message)

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def to_body(self) -> ErrorBody:
        """The wire form of this error."""
        return ErrorBody(code=self.code, message=self.message, retryable=self.retryable)

    @classmethod
    def from_body(cls, body: ErrorBody) -> StoreError:
        """Rebuild the exception a remote store raised (its class from its code)."""
        return StoreError(body.code, body.message)


class StoreRefusedError(StoreError):
    """A store error with a contract code: the operation was refused for good, never retried."""


class StoreUnavailableError(StoreError):
    """A store error with code UNAVAILABLE (database or broker trouble, no reply in time)."""

    retryable = True


def invalid(message: str) -> StoreError:
    """Shorthand for the most common refusal."""
    return StoreError(ErrorCode.INVALID_ARGUMENT, message)
