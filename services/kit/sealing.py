"""The sealed-field format: a value encrypted under one principal's data key (pure crypto, no I/O).

A sealed value is `version (1 byte) | key tag (8) | nonce (12) | AES-256-GCM ciphertext and tag`.
The associated data is a context string naming where the value belongs (a record's run and key,
a checkpoint's run), so a ciphertext moved elsewhere does not open. The key tag (an HMAC of a
fixed label under the data key, which says nothing about the key) tells "sealed under a key that
is no longer the principal's" — the principal was forgotten and a fresh key made since — apart
from "altered": the first reads as erased, the second is an error.

Who holds the keys is not this module's business: the storage owner keeps them wrapped by its
master key in MongoDB and hands them out over a channel that keeps nothing.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quipu.contracts.errors import QuipuError

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
