"""The base of every storage command (runtime store and memory), kept apart so both command
modules can build on it without importing each other."""

from __future__ import annotations

import inspect
import re
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field

from quipu.contracts.envelope import Envelope
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import Record, RunStart


class Backend(StrEnum):
    """Which store of the owner applies a command."""

    RUNTIME = "runtime"
    MEMORY = "memory"
    BOTH = "both"
    """A rule over the runtime store and the memory store together: only the owner holds both."""


_ENVELOPE_FIELDS = frozenset(Envelope.model_fields) | {"op"}
"""The fields of a command that are not arguments of its store method (they stay in clear)."""

_BASE: Any = object()
"""`result_type` of a class that is a base of commands rather than a command."""


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class StoreOperation(Envelope):
    """Base of a storage command: the envelope plus the operation's arguments.

    A command's class name is its wire name (`op`, the discriminator of `StoreCommand`) and, in
    snake case, the store method it calls (`CreateSession` calls `create_session`); what that
    method returns is named in the class statement: `class CreateSession(StoreOperation,
    result_type=Session)`. A base of commands (`MemoryOperation`) names no result.
    """

    method: ClassVar[str]
    """The store method the command calls, derived from the class name."""
    result_type: ClassVar[Any]
    """What the method returns (None: nothing), given in the class statement."""
    backend: ClassVar[Backend] = Backend.RUNTIME
    published_fields: ClassVar[frozenset[str]] = frozenset()
    """Messages the command carries for the owner to publish after it commits: not arguments."""
    op: str = Field(default="", description="Operation name (STORE_CONTRACT wire name).")

    def __init_subclass__(cls, *, result_type: Any = _BASE, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if result_type is _BASE:
            return
        cls.method = _snake_case(cls.__name__)
        cls.result_type = result_type
        # Before pydantic collects the fields (that happens after this hook): the wire name is a
        # literal, so the command union discriminates on it and the schema shows it as a constant.
        own = inspect.get_annotations(cls)
        cls.__annotations__ = {"op": Literal[cls.__name__], **own}
        setattr(cls, "op", Field(default=cls.__name__, description="Operation name."))  # noqa: B010

    @classmethod
    def sealed_field_names(cls) -> frozenset[str]:
        """Every argument: a command's ids beyond the envelope route nothing on the topic."""
        return frozenset(cls.model_fields) - _ENVELOPE_FIELDS

    def whose_words(self) -> SealedFor | None:
        """The principal whose words the command carries, when it says so itself (memory commands)."""
        return None

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the matching store method."""
        skipped = _ENVELOPE_FIELDS | self.published_fields
        return {name: getattr(self, name) for name in type(self).model_fields if name not in skipped}

    def field_or_none(self, name: str) -> Any:
        """The field `name` of this command, None when its type has none. Not `getattr` with a
        default: a pydantic model's miss raises inside `__getattr__` first, ~7x the cost, and the
        keys of every command are looked up this way as it is published and applied."""
        return self.__dict__.get(name)

    def partition_key(self) -> str:
        """Session id when the command has one, else the run id (ordering only, never correctness)."""
        for name in ("session_id", "run", "record", "records", "run_id"):
            value = self.field_or_none(name)
            if isinstance(value, list) and value:
                value = value[0]  # a step's records are one run's
            if isinstance(value, RunStart | Record):
                return value.session_id or value.run_id
            if isinstance(value, str) and value:
                return value
        return ""
