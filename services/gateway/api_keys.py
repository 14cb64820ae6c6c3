"""API keys: a random secret shown once, kept as a hash with its principal, tenant and scopes.

A key reads `qk_<key id>_<secret>`: the id finds the entry, the secret (32 random bytes) is
compared as its sha256 in constant time. A fast hash is enough because the secret is random and
long: nothing can be guessed from the digest, and slow hashes exist for passwords people choose.

Keys live in a JSON file the operator controls (`QUIPU_GATEWAY_API_KEYS_FILE`), written by
`quipu keys create|list|revoke`, the way a Kubernetes token file or a Prometheus web config holds
credentials: authenticating a request costs a `stat`, not a round trip to the storage owner; the
file is mounted read-only into every gateway copy (a Secret) and re-read when it changes; and no
service that may publish on `storage.commands` can mint itself a key. People who sign in come
through the OIDC issuer instead; keys are for programs, operators and the embedded default.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from quipu.contracts.wire import Timestamp, utc_now_ms
from quipu.services.gateway.access import Caller, Scope

PREFIX = "qk"
"""First part of every key, so a key is told from a JWT (and found by secret scanners)."""


class StoredKey(BaseModel):
    """One issued key as the file keeps it: never the secret, only its digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(description="Public identifier of the key (hex), part of the key itself.")
    secret_sha256: str = Field(description="Hex sha256 of the key's secret.")
    tenant_id: str = Field(description="Tenant the key acts in.")
    principal_id: str = Field(min_length=1, description="Principal the key acts as.")
    scopes: list[Scope] = Field(description="What the key may do.")
    name: str = Field(default="", description="What the key is for (shown by `quipu keys list`).")
    created_at: Timestamp = Field(description="When the key was issued.")
    revoked_at: Timestamp | None = Field(default=None, description="When it was revoked; null while valid.")

    def caller(self) -> Caller:
        """Who a request with this key is."""
        return Caller(
            tenant_id=self.tenant_id,
            principal_id=self.principal_id,
            scopes=frozenset(self.scopes),
            credential=f"key:{self.key_id}",
        )


class KeyFileContent(BaseModel):
    """The whole keys file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: list[StoredKey] = Field(
        default_factory=list, description="Every key issued, revoked ones included."
    )


def digest(secret: str) -> str:
    """The hex sha256 the file keeps for a secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(presented: str) -> tuple[str, str] | None:
    """`(key id, secret)` of a well-formed key, else None."""
    prefix, _, rest = presented.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != PREFIX or not key_id or not secret:
        return None
    return key_id, secret


def new_key(
    *, tenant_id: str, principal_id: str, scopes: list[Scope], name: str = "", now: datetime | None = None
) -> tuple[str, StoredKey]:
    """A fresh key (the text to hand over once) and the entry to store."""
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    stored = StoredKey(
        key_id=key_id,
        secret_sha256=digest(secret),
        tenant_id=tenant_id,
        principal_id=principal_id,
        scopes=sorted(set(scopes)),
        name=name,
        created_at=now or utc_now_ms(),
    )
    return f"{PREFIX}_{key_id}_{secret}", stored


def verify(presented: str, keys: dict[str, StoredKey]) -> StoredKey | None:
    """The valid, unrevoked key `presented` is, else None (the digest compared in constant time)."""
    parts = split_key(presented)
    if parts is None:
        return None
    key_id, secret = parts
    stored = keys.get(key_id)
    if stored is None or stored.revoked_at is not None:
        return None
    return stored if hmac.compare_digest(digest(secret), stored.secret_sha256) else None


class KeyFile:
    """The keys file: read for the gateway (again whenever it changed), edited under a lock by the CLI."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._keys: dict[str, StoredKey] = {}

    def current(self) -> dict[str, StoredKey]:
        """The keys by id as the file holds them now; a missing file holds none."""
        try:
            status = self.path.stat()
        except FileNotFoundError:
            self._seen, self._keys = None, {}
            return self._keys
        seen = (status.st_mtime_ns, status.st_size, status.st_ino)
        if seen != self._seen:
            self._keys = {key.key_id: key for key in self.read().keys}
            self._seen = seen
        return self._keys

    def read(self) -> KeyFileContent:
        """The file's content (empty when it does not exist)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return KeyFileContent()
        return KeyFileContent.model_validate(json.loads(text)) if text.strip() else KeyFileContent()

    def add(self, key: StoredKey) -> None:
        """Append a key."""
        with self._editing() as content:
            content.append(key)

    def revoke(self, key_id: str, *, now: datetime | None = None) -> StoredKey | None:
        """Mark a key revoked (kept for the record); None when there is no such key."""
        with self._editing() as content:
            for index, key in enumerate(content):
                if key.key_id == key_id:
                    if key.revoked_at is None:
                        content[index] = key.model_copy(update={"revoked_at": now or utc_now_ms()})
                    return content[index]
        return None

    def revoke_named(self, name: str, *, now: datetime | None = None) -> int:
        """Revoke every valid key with this name (the embedded default's previous local key)."""
        revoked = 0
        with self._editing() as content:
            for index, key in enumerate(content):
                if key.name == name and key.revoked_at is None:
                    content[index] = key.model_copy(update={"revoked_at": now or utc_now_ms()})
                    revoked += 1
        return revoked

    @contextlib.contextmanager
    def _editing(self) -> Iterator[list[StoredKey]]:
        # One editor at a time (a lock file beside it); readers see the old or the new file, whole.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            keys = list(self.read().keys)
            yield keys
            staged = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(KeyFileContent(keys=keys).model_dump_json(indent=2))
            os.replace(staged, self.path)
