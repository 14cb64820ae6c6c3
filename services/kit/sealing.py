"""The sealed-field format: a value encrypted under one principal's data key (pure crypto, no I/O).

A sealed value is `version (1 byte) | key tag (8) | nonce (12) | AES-256-GCM ciphertext and tag`.
The associated data is a context string naming where the value belongs (a record's run and key,
a checkpoint's run), so a ciphertext moved elsewhere does not open. The key tag (an HMAC of a
fixed label under the data key, which says nothing about the key) tells "sealed under a key that
is no longer the principal's" — the principal was forgotten and a fresh key made since — apart
from "altered": the first reads as erased, the second is an error.

A sealed message (quipu.contracts.sealed) is a topic message's JSON object whose word-carrying fields
travel as one sealed value in `sealed`, bound to the message's clear fields.

Who holds the keys is not this module's business: the storage owner keeps them wrapped by its
master key in MongoDB and hands them out over a channel that keeps nothing.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import functools
import hashlib
import hmac
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quipu.contracts.errors import QuipuError
from quipu.contracts.sealed import SEALED_FIELD, SealedFor

VERSION = 1
KEY_BYTES = 32
_TAG = 8
_NONCE = 12
_HEADER = 1 + _TAG + _NONCE


class SealError(QuipuError):
    """Raised when a sealed value cannot be opened; never carries the value."""


class OtherKeyError(SealError):
    """Raised when a value was sealed under another data key than the one given (a shredded one)."""


class BrokenSealError(SealError):
    """Raised when a value is not in the sealed format, or was altered, or belongs to another place."""


@functools.lru_cache(maxsize=4096)
def _cipher(key: bytes) -> AESGCM:
    # Building the cipher costs more than sealing a short value; keys repeat across values.
    return AESGCM(key)


@functools.lru_cache(maxsize=4096)
def key_tag(key: bytes) -> bytes:
    """The 8-byte tag naming a data key inside sealed values (an HMAC: it reveals nothing of the key)."""
    return hmac.new(key, b"quipu sealed-field key tag", hashlib.sha256).digest()[:_TAG]


def seal(key: bytes, plaintext: bytes, context: str) -> bytes:
    """`plaintext` sealed under `key`, bound to `context` (random nonce: two seals differ)."""
    nonce = os.urandom(_NONCE)
    header = bytes([VERSION]) + key_tag(key) + nonce
    return header + _cipher(key).encrypt(nonce, plaintext, context.encode())


def is_sealed(value: bytes) -> bool:
    """Whether `value` has the sealed format's shape (version byte and minimum length)."""
    return len(value) >= _HEADER + 16 and value[0] == VERSION


def sealed_key_tag(value: bytes) -> bytes:
    """The key tag a sealed value carries (raises BrokenSealError when it is not a sealed value)."""
    if not is_sealed(value):
        raise BrokenSealError("not a sealed value")
    return value[1 : 1 + _TAG]


def open_sealed(key: bytes, value: bytes, context: str) -> bytes:
    """The plaintext of a sealed value; OtherKeyError or BrokenSealError when it does not open."""
    if sealed_key_tag(value) != key_tag(key):
        raise OtherKeyError("sealed under another data key")
    nonce = value[1 + _TAG : _HEADER]
    try:
        return _cipher(key).decrypt(nonce, value[_HEADER:], context.encode())
    except InvalidTag as error:
        raise BrokenSealError(f"a sealed value does not open ({context})") from error


# --- sealed messages (quipu.contracts.sealed) ---------------------------------------------------------


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise BrokenSealError("a sealed message repeats a key")  # the key is input: not named
    return value


def message_context(clear: Mapping[str, Any]) -> str:
    """The associated data of a sealed message: its clear fields as canonical JSON."""
    return json.dumps(clear, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def seal_message(key: bytes, clear: Mapping[str, Any], words: bytes) -> bytes:
    """The wire form of a message: its `clear` fields, and `words` (the JSON object of its
    word-carrying fields) sealed under `key` in `sealed`, bound to the clear fields."""
    sealed = seal(key, words, message_context(clear))
    return json.dumps({**clear, SEALED_FIELD: base64.b64encode(sealed).decode("ascii")}).encode()


def sealed_parts(body: bytes) -> tuple[dict[str, Any], bytes] | None:
    """A sealed message's clear fields and sealed bytes; None for a plaintext message.

    Raises BrokenSealError for a body that is not a JSON object with a well-formed `sealed`.
    """
    if SEALED_FIELD.encode() not in body:
        return None  # the fast path: a plaintext message never mentions the field
    try:
        message = json.loads(body, object_pairs_hook=_refuse_duplicates)
    except (ValueError, RecursionError):
        return None  # not JSON at all: the payload decoder refuses it with its own reason
    if not isinstance(message, dict) or SEALED_FIELD not in message:
        return None
    sealed = message.pop(SEALED_FIELD)
    try:
        return message, base64.b64decode(str(sealed).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise BrokenSealError("the sealed part is not padded base64") from error


def open_message(key: bytes, clear: dict[str, Any], sealed: bytes) -> bytes:
    """The plaintext JSON of a sealed message (OtherKeyError, BrokenSealError when it does not open).

    The opened fields are spliced in as they were sealed, never parsed here (the payload decoder
    parses the message once): the sealed part is authenticated, only a holder of the key wrote it.
    """
    try:
        words = open_sealed(key, sealed, message_context(clear))
    except BrokenSealError:
        # Not the context in the error: it is the message's clear part, and errors reach logs.
        raise BrokenSealError("the sealed part does not open (altered, or moved)") from None
    if not (words.startswith(b"{") and words.endswith(b"}")):
        raise BrokenSealError("the sealed part is not a JSON object")
    head = json.dumps(clear).encode()
    inner = words[1:-1].strip()
    return head if not inner else head[:-1] + b"," + inner + b"}"


# --- whose words a service is working on --------------------------------------------------------


_SEALING_FOR: contextvars.ContextVar[SealedFor | None] = contextvars.ContextVar("sealing_for", default=None)
_SOURCE_KEY: contextvars.ContextVar[tuple[SealedFor, bytes] | None] = contextvars.ContextVar(
    "source_key", default=None
)


@contextlib.contextmanager
def sealing_for(tenant_id: str, principal_id: str) -> Iterator[None]:
    """Within the block, storage commands that name no principal themselves (run records, reads of
    a run) are sealed under this principal's key: the person whose run the service is working on."""
    token = _SEALING_FOR.set(
        SealedFor(tenant_id=tenant_id, principal_id=principal_id) if principal_id else None
    )
    try:
        yield
    finally:
        _SEALING_FOR.reset(token)


@contextlib.contextmanager
def sealing_as(whose: SealedFor | None, source_key_tag: bytes | None = None) -> Iterator[None]:
    """`sealing_for` with the principal a consumed message was sealed for (None: no one), and the
    tag of the key it was sealed under: what the block seals for that principal must go under the
    same key (`source_key_tag`)."""
    source = _SOURCE_KEY.set((whose, source_key_tag) if whose and source_key_tag else None)
    try:
        with sealing_for(whose.tenant_id if whose else "", whose.principal_id if whose else ""):
            yield
    finally:
        _SOURCE_KEY.reset(source)


def source_key_tag(whose: SealedFor) -> bytes | None:
    """The tag of the key the consumed message being handled was sealed under, when it was sealed
    for `whose`: words taken from it are sealed under that key or not at all, so that a forget
    (which shreds it) reaches them too, never a key made anew since."""
    source = _SOURCE_KEY.get()
    return source[1] if source is not None and source[0] == whose else None


def current_sealing_for() -> SealedFor | None:
    """The principal set by the innermost `sealing_for` block, if any."""
    return _SEALING_FOR.get()
