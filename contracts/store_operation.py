"""The base of every storage command (runtime store and memory), kept apart so both command
modules can build on it without importing each other."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.store import Record, RunStart


class Backend(StrEnum):
    """Which store of the owner applies a command."""

    RUNTIME = "runtime"
    MEMORY = "memory"


_ENVELOPE_FIELDS = frozenset(Envelope.model_fields) | {"op"}


class StoreOperation(Envelope):
    """Base of a storage command: the envelope plus the operation's arguments."""

    method: ClassVar[str]
    result_type: ClassVar[Any]
    backend: ClassVar[Backend] = Backend.RUNTIME
    op: str = Field(description="Operation name (STORE_CONTRACT wire name).")

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the matching store method."""
        return {name: getattr(self, name) for name in type(self).model_fields if name not in _ENVELOPE_FIELDS}

    def partition_key(self) -> str:
        """Session id when the command has one, else the run id (ordering only, never correctness)."""
        for name in ("session_id", "run", "record", "run_id"):
            value = getattr(self, name, None)
            if isinstance(value, RunStart | Record):
                return value.session_id or value.run_id
            if isinstance(value, str) and value:
                return value
        return ""
