"""Opaque, integrity-protected listing cursors: scope and position under an HMAC."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from quipu.contracts.errors import ErrorCode, StoreError

_MAC_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorCodec:
    """Makes and reads cursors bound to one listing; the secret makes them valid across restarts."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:_MAC_BYTES]

    def make(self, scope: str, position: int) -> str:
        """A cursor that resumes `scope` after `position`."""
        body = json.dumps([scope, position], separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._mac(body))}"

    def read(self, scope: str, cursor: str) -> int:
        """The position a cursor resumes after (0 for the empty cursor); INVALID_CURSOR otherwise."""
        if cursor == "":
            return 0
        try:
            body_text, mac_text = cursor.split(".")
            body, mac = _unb64(body_text), _unb64(mac_text)
            # The decoder skips stray characters; re-encoding catches any that were added.
            canonical = _b64(body) == body_text and _b64(mac) == mac_text
            valid = canonical and hmac.compare_digest(mac, self._mac(body))
            cursor_scope, position = json.loads(body) if valid else (None, None)
        except (ValueError, binascii.Error, TypeError) as error:
            raise StoreError(ErrorCode.INVALID_CURSOR, "cursor is malformed") from error
        if not valid:
            raise StoreError(ErrorCode.INVALID_CURSOR, "cursor was altered or not made by this store")
        if cursor_scope != scope or not isinstance(position, int) or position < 0:
            raise StoreError(ErrorCode.INVALID_CURSOR, "cursor belongs to another listing")
        return position
