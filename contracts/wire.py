"""Wire encodings shared by every contract: RFC 3339 millisecond timestamps and padded base64."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer


def format_timestamp(value: datetime) -> str:
    """RFC 3339 UTC with three fractional digits; a sub-millisecond part is kept so it can be refused."""
    utc = value.astimezone(UTC)
    # Fields, not strftime: every record and event is stamped, and strftime cost twice as much.
    base = f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    if utc.microsecond % 1000:
        return f"{base}.{utc.microsecond:06d}Z"
    return f"{base}.{utc.microsecond // 1000:03d}Z"


def has_sub_millisecond(value: datetime) -> bool:
    """True when the timestamp carries precision finer than a millisecond (INVALID_ARGUMENT)."""
    return value.microsecond % 1000 != 0


_FRACTION = re.compile(r"[T ]\d\d:\d\d:\d\d\.(\d+)")


def _require_aware(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        raise ValueError("timestamps must carry a UTC offset")
    if isinstance(value, str):
        if not (value.endswith("Z") or value[-6:-5] in ("+", "-")):
            raise ValueError("timestamps must be RFC 3339 with a UTC offset")
        fraction = _FRACTION.search(value)
        # A datetime holds microseconds: finer digits would be cut off silently, so they are
        # refused here (sub-millisecond microseconds are refused by the rules that need ms).
        if fraction is not None and fraction.group(1)[6:].strip("0"):
            raise ValueError("timestamps are never truncated: a non-zero digit beyond the microsecond")
    return value


Timestamp = Annotated[
    datetime,
    BeforeValidator(_require_aware),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
]
"""A timezone-aware instant; JSON form `YYYY-MM-DDTHH:MM:SS.mmmZ`."""


def _decode_base64(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as error:
            raise ValueError(f"not padded base64: {error}") from error
    return value


def _encode_base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


WireBytes = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    PlainSerializer(_encode_base64, return_type=str, when_used="json"),
]
"""Bytes that travel as padded standard base64 in JSON and stay raw in Python."""


def to_millisecond(value: datetime) -> datetime:
    """`value` truncated to the millisecond, deterministically: the store keeps milliseconds and
    refuses finer times, so a producer's own time is cut before it becomes a record's."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def utc_now_ms() -> datetime:
    """The current instant truncated to the millisecond: the store clock."""
    return to_millisecond(datetime.now(UTC))
