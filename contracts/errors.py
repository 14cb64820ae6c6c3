"""Store error codes (STORE_CONTRACT §5) and the typed exception that carries them."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


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
    INVALID_CURSOR = "INVALID_CURSOR"
    MEMORY_CONFLICT = "MEMORY_CONFLICT"
    FACT_NOT_FOUND = "FACT_NOT_FOUND"
    SESSION_PRINCIPAL_MISMATCH = "SESSION_PRINCIPAL_MISMATCH"
    """The session belongs to another principal (or tenant): a run there would be someone else's turn."""
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


class StoreError(Exception):
    """Raised by every Store implementation when an operation is refused or cannot complete."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        """Whether the caller may resend the identical command."""
        return self.code.retryable

    def to_body(self) -> ErrorBody:
        """The wire form of this error."""
        return ErrorBody(code=self.code, message=self.message, retryable=self.retryable)

    @classmethod
    def from_body(cls, body: ErrorBody) -> StoreError:
        """Rebuild the exception a remote store raised."""
        return cls(body.code, body.message)


def invalid(message: str) -> StoreError:
    """Shorthand for the most common refusal."""
    return StoreError(ErrorCode.INVALID_ARGUMENT, message)
