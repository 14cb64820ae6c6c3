"""The principals' data keys: one random 256-bit key per (tenant, principal), wrapped at rest.

Hierarchy: the owner's master key (`QUIPU_OWNER_MASTER_KEY`, else one generated once and kept in
`meta`) wraps each principal's data key (AES-256-GCM, bound to the key document's id) in
`memory_keys`; the data key seals that principal's texts wherever they rest (memory rows, run
record payloads, suspension checkpoints). Deleting the key document (forget) makes every copy
sealed under it unreadable at once. Unwrapped keys live only in this process's memory.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
import secrets
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.wire import utc_now_ms
from quipu.services.domain.memory.tombstone import digest

KEYS = "memory_keys"
"""The collection of wrapped data keys (its name predates run-record sealing)."""
MASTER_KEY_ID = "memory_master_key"
"""The `meta` document holding a generated master key when none is configured."""

_NONCE = 12


def parse_master_key(value: str) -> bytes:
    """A master key from settings: standard or URL-safe base64 of exactly 32 bytes."""
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            key = decode(value.strip().encode("ascii"))
        except (binascii.Error, ValueError, UnicodeEncodeError):
            continue
        if len(key) == 32:
            return key
    raise ValueError("the master key must be base64 of 32 random bytes (openssl rand -base64 32)")


def key_id(tenant_id: str, principal_id: str) -> str:
    """The `_id` of a principal's key document (a hash: the id itself is not kept in clear there)."""
    return digest("key", tenant_id, principal_id)


@functools.lru_cache(maxsize=4096)
def _cipher(key: bytes) -> AESGCM:
    # Building the cipher costs more than sealing a short text; keys repeat across documents.
    return AESGCM(key)


def fingerprint(key: bytes) -> str:
    """A data key's name where one is kept beside what it seals (hex; tells keys apart, opens nothing)."""
    return hashlib.sha256(b"quipu data key fingerprint\n" + key).hexdigest()[:32]


def wrap(key: bytes, plaintext: bytes, context: str) -> bytes:
    """`plaintext` sealed under `key` (nonce | ciphertext), bound to `context` (data keys, memory texts)."""
    nonce = os.urandom(_NONCE)
    return nonce + _cipher(key).encrypt(nonce, plaintext, context.encode())


def unwrap(key: bytes, wrapped: bytes, context: str) -> bytes:
    """The inverse of `wrap`; UNAVAILABLE when it does not open (another key, or altered)."""
    try:
        return _cipher(key).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], context.encode())
    except InvalidTag as error:
        raise StoreError(ErrorCode.UNAVAILABLE, f"a sealed value does not open ({context})") from error


class Keyring:
    """Wraps and unwraps data keys with the master key; unwrapped keys are cached by their wrapping."""

    def __init__(self, master_key: bytes) -> None:
        self._master = master_key
        self._unwrapped: dict[bytes, bytes] = {}

    def new_wrapped(self, identifier: str) -> bytes:
        """A fresh random data key, wrapped for the key document `identifier`."""
        return wrap(self._master, secrets.token_bytes(32), f"{KEYS}/{identifier}")

    def unwrap(self, identifier: str, wrapped: bytes) -> bytes:
        """The data key of the key document `identifier`."""
        if wrapped not in self._unwrapped:
            self._unwrapped[wrapped] = unwrap(self._master, wrapped, f"{KEYS}/{identifier}")
        return self._unwrapped[wrapped]


class PrincipalKeys:
    """The principals' data keys as one MongoDB transaction sees them (read once per transaction).

    The key document is read in the transaction's snapshot every time, never served from a cache
    across transactions: a key forgotten by another owner copy must stop opening texts here too.
    """

    def __init__(
        self, keys: AsyncCollection[dict[str, Any]], session: AsyncClientSession, keyring: Keyring
    ) -> None:
        self._keys = keys
        self._session = session
        self._keyring = keyring
        self._read: dict[tuple[str, str], bytes | None] = {}
        self._fenced: set[tuple[str, str]] = set()

    async def reading_key(self, tenant_id: str, principal_id: str) -> bytes | None:
        """The principal's data key, or None when it is gone (forgotten: their texts are unreadable)."""
        who = (tenant_id, principal_id)
        if who not in self._read:
            identifier = key_id(tenant_id, principal_id)
            document = await self._keys.find_one({"_id": identifier}, session=self._session)
            self._read[who] = (
                None if document is None else self._keyring.unwrap(identifier, _bytes(document["wrapped"]))
            )
        return self._read[who]

    async def writing_key(self, tenant_id: str, principal_id: str, *, fence: bool) -> bytes:
        """The principal's data key, created when missing.

        `fence` also bumps the key document, so this transaction conflicts with a racing forget
        and is retried after it (under a fresh key) instead of committing under a key that is
        gone. Without it a racing forget may win, and what this transaction seals is unreadable
        from the start, which is what forgetting asks; writers of run records use that, so that
        a principal's runs in different sessions never conflict on their shared key document.
        """
        who = (tenant_id, principal_id)
        if not fence or who in self._fenced:
            key = await self.reading_key(tenant_id, principal_id)
            if key is not None:
                return key
        identifier = key_id(tenant_id, principal_id)
        update: dict[str, object] = {
            "$setOnInsert": {"wrapped": self._keyring.new_wrapped(identifier), "created_at": utc_now_ms()}
        }
        if fence:
            update["$inc"] = {"writes": 1}
        document = await self._keys.find_one_and_update(
            {"_id": identifier},
            update,
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=self._session,
        )
        assert document is not None
        key = self._keyring.unwrap(identifier, _bytes(document["wrapped"]))
        self._read[who] = key
        if fence:
            self._fenced.add(who)
        return key

    def known(self, tenant_id: str, principal_id: str) -> bytes | None:
        """The principal's data key if this transaction has read or made it already (no read)."""
        return self._read.get((tenant_id, principal_id))

    async def shred(self, tenant_id: str, principal_id: str) -> None:
        """Delete the principal's data key: every text sealed under it becomes unreadable."""
        await self._keys.delete_one({"_id": key_id(tenant_id, principal_id)}, session=self._session)
        self._read[(tenant_id, principal_id)] = None


def _bytes(value: object) -> bytes:
    assert isinstance(value, bytes | bytearray | memoryview)
    return bytes(value)
