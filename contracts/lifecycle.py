"""Lifecycle record payloads (STORE_CONTRACT §4): strict decoding and canonical encoding.

Decoding runs before any read or write; every violation raises INVALID_ARGUMENT. Encoding is what
writers use so that a retry repeats the same bytes; the store itself never re-encodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from quipu.contracts.errors import QuipuError, invalid
from quipu.contracts.store import CancellationReason, LifecycleType, RunStart, RunStatus

_SURROGATE = re.compile("[\ud800-\udfff]")


class _DuplicateKeyError(QuipuError):
    """Raised inside the JSON hook when an object repeats a key."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


def _check_surrogates(value: Any, where: str) -> None:
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise invalid(f"{where}: lone surrogate escape")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_surrogates(key, where)
            _check_surrogates(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_surrogates(item, where)


def decode_json_object(payload: bytes, what: str) -> dict[str, Any]:
    """Rules 1-2 of strict decoding: valid UTF-8, exactly one JSON object, no duplicate keys."""
    try:
        text = payload.decode("utf-8", errors="strict")
    except UnicodeDecodeError as error:
        raise invalid(f"{what}: payload is not valid UTF-8 ({error.reason})") from error
    try:
        value = json.loads(
            text, object_pairs_hook=_pairs, parse_float=Decimal, parse_constant=_reject_constant
        )
    except _DuplicateKeyError as error:
        raise invalid(f"{what}: duplicate key {error.args[0]!r}") from error
    except ValueError as error:
        raise invalid(f"{what}: payload is not exactly one JSON value ({error})") from error
    if not isinstance(value, dict):
        raise invalid(f"{what}: payload must be a JSON object")
    _check_surrogates(value, what)
    return value


@dataclass(frozen=True)
class _Key:
    name: str
    check: Callable[[Any, str], Any]
    required: bool = True
    nested: tuple[_Key, ...] = ()


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{where} must be a string")
    return value


def _non_empty(value: Any, where: str) -> str:
    text = _string(value, where)
    if not text:
        raise invalid(f"{where} must not be empty")
    return text


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{where} must be an integer literal")
    return value


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{where} must be a boolean")
    return value


def _labels(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be an object of strings")
    for key, item in value.items():
        _string(item, f"{where}.{key}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise invalid(f"{where} must be an array of strings")
    return [_string(item, f"{where}[]") for item in value]


def _exact_keys(value: dict[str, Any], keys: list[_Key], where: str) -> dict[str, Any]:
    """Rule 3: exactly the listed keys, none null, each of its type."""
    allowed = {key.name: key for key in keys}
    for name in value:
        if name not in allowed:
            raise invalid(f"{where}: unknown key {name!r}")
    decoded: dict[str, Any] = {}
    for key in keys:
        if key.name not in value:
            if key.required:
                raise invalid(f"{where}: missing key {key.name!r}")
            continue
        item = value[key.name]
        if item is None:
            raise invalid(f"{where}.{key.name} must not be null")
        decoded[key.name] = key.check(item, f"{where}.{key.name}")
    return decoded


def _object(keys: list[_Key]) -> Callable[[Any, str], dict[str, Any]]:
    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise invalid(f"{where} must be an object")
        return _exact_keys(value, keys, where)

    return check


_FAILURE_KEYS = [
    _Key("message", _non_empty),
    _Key("kind", _non_empty),
    _Key("debug_message", _string, required=False),
    _Key("provider", _string, required=False),
    _Key("operation", _string, required=False),
    _Key("code", _string, required=False),
    _Key("http_status", _integer, required=False),
    _Key("retryable", _boolean),
]
_CANCELLATION_KEYS = [_Key("reason", _non_empty)]

_SCHEMAS: dict[LifecycleType, list[_Key]] = {
    LifecycleType.RUN_STARTED: [
        _Key("parent_run_id", _string, required=False),
        _Key("predecessor_run_id", _string, required=False),
        _Key("labels", _labels, required=False),
    ],
    LifecycleType.CHILD_RUN_LINKED: [
        _Key("tool_name", _non_empty),
        _Key("tool_call_id", _non_empty),
        _Key("child_run_id", _non_empty),
        _Key("child_agent_id", _non_empty),
    ],
    LifecycleType.CANCELLATION_INTENT: [_Key("reason", _non_empty)],
    LifecycleType.RUN_SUSPENDED: [
        _Key("suspension_id", _non_empty),
        _Key("version", _string),
        _Key("pending_count", _integer),
        _Key("required_tools", _strings),
    ],
    LifecycleType.RUN_COMPLETED: [
        _Key("status", _string),
        _Key("phase", _string),
        _Key("failure", _object(_FAILURE_KEYS), required=False, nested=tuple(_FAILURE_KEYS)),
        _Key("cancellation", _object(_CANCELLATION_KEYS), required=False, nested=tuple(_CANCELLATION_KEYS)),
        _Key("labels", _labels, required=False),
    ],
}

_WIRE_TYPES: dict[Callable[[Any, str], Any], str] = {
    _string: "string",
    _non_empty: "non-empty string",
    _integer: "integer literal",
    _boolean: "boolean",
    _labels: "object of string to string",
    _strings: "array of strings",
}


def _wire_type(key: _Key) -> str:
    if key.nested:
        inner = ", ".join(
            f"`{item.name}`{'' if item.required else '?'}: {_wire_type(item)}" for item in key.nested
        )
        return f"object {{{inner}}}"
    return _WIRE_TYPES[key.check]


def lifecycle_payload_keys() -> dict[str, list[tuple[str, str, bool]]]:
    """Each lifecycle record type's payload keys in canonical order: (name, JSON type, required)."""
    return {
        record_type.value: [(key.name, _wire_type(key), key.required) for key in keys]
        for record_type, keys in _SCHEMAS.items()
    }


_TERMINAL_STATUS = {
    "success": RunStatus.COMPLETED,
    "failed": RunStatus.FAILED,
    "canceled": RunStatus.CANCELED,
}


@dataclass(frozen=True)
class RunStartedPayload:
    """Decoded `run_started` payload."""

    parent_run_id: str = ""
    predecessor_run_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self, start: RunStart) -> bool:
        """Whether the payload states exactly the identity of the start."""
        return (
            self.parent_run_id == start.parent_run_id
            and self.predecessor_run_id == start.predecessor_run_id
            and dict(self.labels) == start.labels
        )


@dataclass(frozen=True)
class ChildRunLinkedPayload:
    """Decoded `child_run_linked` payload."""

    tool_name: str
    tool_call_id: str
    child_run_id: str
    child_agent_id: str


@dataclass(frozen=True)
class CancellationIntentPayload:
    """Decoded `runtime.cancellation_intent` payload."""

    reason: str


@dataclass(frozen=True)
class RunSuspendedPayload:
    """Decoded `run_suspended` payload."""

    suspension_id: str
    version: str
    pending_count: int
    required_tools: tuple[str, ...]


@dataclass(frozen=True)
class Failure:
    """Why a run failed."""

    message: str
    kind: str
    retryable: bool
    debug_message: str = ""
    provider: str = ""
    operation: str = ""
    code: str = ""
    http_status: int | None = None


@dataclass(frozen=True)
class RunCompletedPayload:
    """Decoded `run_completed` payload."""

    status: str
    phase: str
    failure: Failure | None = None
    cancellation_reason: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def run_status(self) -> RunStatus:
        """The RunStatus this terminal record sets (`success` → completed)."""
        return _TERMINAL_STATUS[self.status]


def _decoded(payload: bytes, record_type: LifecycleType) -> dict[str, Any]:
    what = f"{record_type.value} payload"
    return _exact_keys(decode_json_object(payload, what), _SCHEMAS[record_type], what)


def decode_run_started(payload: bytes) -> RunStartedPayload:
    """Strictly decode a `run_started` payload."""
    return RunStartedPayload(**_decoded(payload, LifecycleType.RUN_STARTED))


def decode_child_run_linked(payload: bytes) -> ChildRunLinkedPayload:
    """Strictly decode a `child_run_linked` payload."""
    return ChildRunLinkedPayload(**_decoded(payload, LifecycleType.CHILD_RUN_LINKED))


def decode_cancellation_intent(payload: bytes) -> CancellationIntentPayload:
    """Strictly decode a `runtime.cancellation_intent` payload; the reason must be a known one."""
    decoded = CancellationIntentPayload(**_decoded(payload, LifecycleType.CANCELLATION_INTENT))
    if decoded.reason not in {reason.value for reason in CancellationReason}:
        raise invalid(f"cancellation reason {decoded.reason!r} is not one of the three reasons")
    return decoded


def decode_run_suspended(payload: bytes) -> RunSuspendedPayload:
    """Strictly decode a `run_suspended` payload."""
    values = _decoded(payload, LifecycleType.RUN_SUSPENDED)
    if values["pending_count"] < 0:
        raise invalid("run_suspended payload.pending_count must be >= 0")
    values["required_tools"] = tuple(values["required_tools"])
    return RunSuspendedPayload(**values)


def decode_run_completed(payload: bytes) -> RunCompletedPayload:
    """Strictly decode a `run_completed` payload and check the status/phase/failure/cancellation rules."""
    values = _decoded(payload, LifecycleType.RUN_COMPLETED)
    status = values["status"]
    if status not in _TERMINAL_STATUS:
        raise invalid(f"run_completed status {status!r} is not success, failed or canceled")
    if values["phase"] != _TERMINAL_STATUS[status].value:
        raise invalid(f"run_completed phase must be {_TERMINAL_STATUS[status].value!r} for {status!r}")
    failure = values.get("failure")
    cancellation = values.get("cancellation")
    if status == "success" and (failure is not None or cancellation is not None):
        raise invalid("a success carries neither failure nor cancellation")
    if status == "failed" and (failure is None or cancellation is not None):
        raise invalid("a failure carries failure and no cancellation")
    if status == "canceled" and (cancellation is None or failure is not None):
        raise invalid("a cancellation carries cancellation and no failure")
    return RunCompletedPayload(
        status=status,
        phase=values["phase"],
        failure=Failure(**failure) if failure is not None else None,
        cancellation_reason=cancellation["reason"] if cancellation is not None else "",
        labels=values.get("labels", {}),
    )


DECODERS: dict[LifecycleType, Callable[[bytes], object]] = {
    LifecycleType.RUN_STARTED: decode_run_started,
    LifecycleType.CHILD_RUN_LINKED: decode_child_run_linked,
    LifecycleType.CANCELLATION_INTENT: decode_cancellation_intent,
    LifecycleType.RUN_SUSPENDED: decode_run_suspended,
    LifecycleType.RUN_COMPLETED: decode_run_completed,
}
"""Strict decoder per lifecycle type."""


# --- canonical encoding -------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_clean(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def canonical_json(ordered: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, keys in the given order, non-ASCII raw, lone surrogates replaced."""
    return json.dumps(_clean(ordered), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _sorted_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {key: labels[key] for key in sorted(labels)}


def _omit_empty(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: value for key, value in pairs if value not in ("", None, {}, [])}


def encode_run_started(start: RunStart) -> bytes:
    """Canonical `run_started` payload for a start (`{}` for a plain root)."""
    return canonical_json(
        _omit_empty(
            [
                ("parent_run_id", start.parent_run_id),
                ("predecessor_run_id", start.predecessor_run_id),
                ("labels", _sorted_labels(start.labels)),
            ]
        )
    )


def encode_child_run_linked(
    tool_name: str, tool_call_id: str, child_run_id: str, child_agent_id: str
) -> bytes:
    """Canonical `child_run_linked` payload."""
    return canonical_json(
        {
            "tool_name": tool_name,
            "tool_call_id": tool_call_id,
            "child_run_id": child_run_id,
            "child_agent_id": child_agent_id,
        }
    )


def encode_cancellation_intent(reason: CancellationReason) -> bytes:
    """Canonical `runtime.cancellation_intent` payload."""
    return canonical_json({"reason": reason.value})


def encode_run_suspended(
    suspension_id: str, version: str, pending_count: int, required_tools: list[str]
) -> bytes:
    """Canonical `run_suspended` payload (`required_tools` is `[]` when none)."""
    return canonical_json(
        {
            "suspension_id": suspension_id,
            "version": version,
            "pending_count": pending_count,
            "required_tools": list(required_tools),
        }
    )


def _failure_json(failure: Failure) -> dict[str, Any]:
    ordered = _omit_empty(
        [
            ("message", failure.message),
            ("kind", failure.kind),
            ("debug_message", failure.debug_message),
            ("provider", failure.provider),
            ("operation", failure.operation),
            ("code", failure.code),
            ("http_status", failure.http_status),
        ]
    )
    ordered["retryable"] = failure.retryable
    return ordered


def encode_run_completed(
    status: RunStatus,
    labels: Mapping[str, str] | None = None,
    failure: Failure | None = None,
    cancellation_reason: str = "",
) -> bytes:
    """Canonical `run_completed` payload for a final status."""
    wire_status = {value: key for key, value in _TERMINAL_STATUS.items()}[status]
    ordered: dict[str, Any] = {"status": wire_status, "phase": status.value}
    if failure is not None:
        ordered["failure"] = _failure_json(failure)
    if cancellation_reason:
        ordered["cancellation"] = {"reason": cancellation_reason}
    if labels:
        ordered["labels"] = _sorted_labels(labels)
    return canonical_json(ordered)
