"""OAuth2/OIDC bearer JWTs: signature checked against the issuer's JWKS, then issuer, audience, expiry.

The JWKS comes from a file (re-read when it changes; tests and air-gapped installs) or an https
URL (fetched in a thread, cached, refetched when a token names an unknown key id). The principal
is the `sub` claim (configurable), the tenant a claim of its own (a token without one is
refused), and the scopes the OAuth2 `scope` string or an `scp` list; unknown scopes are ignored.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jwt

from quipu.contracts.errors import QuipuError
from quipu.services.gateway.access import Caller, Scope

LEEWAY_S = 30
"""Clock skew tolerated on `exp`, `nbf` and `iat`."""


class InvalidTokenError(QuipuError):
    """Raised when a bearer JWT is not one this gateway accepts; the message says which check failed."""


class _FileKeys:
    """A JWKS file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen: tuple[int, int] | None = None
        self._keys: dict[str, jwt.PyJWK] = {}

    async def key(self, kid: str | None) -> jwt.PyJWK:
        status = self._path.stat()
        if (status.st_mtime_ns, status.st_size) != self._seen:
            document = json.loads(self._path.read_text())
            self._keys = {key.key_id or "": key for key in jwt.PyJWKSet.from_dict(document).keys}
            self._seen = (status.st_mtime_ns, status.st_size)
        return _pick(self._keys, kid)


class _UrlKeys:
    """A JWKS URL (PyJWT's client caches it and refetches on an unknown key id)."""

    def __init__(self, url: str) -> None:
        self._client = jwt.PyJWKClient(url, cache_keys=True, lifespan=300, timeout=5)

    async def key(self, kid: str | None) -> jwt.PyJWK:
        if kid is None:
            keys = await asyncio.to_thread(self._client.get_signing_keys)
            return _pick({key.key_id or "": key for key in keys}, kid)
        return await asyncio.to_thread(self._client.get_signing_key, kid)


def _pick(keys: dict[str, jwt.PyJWK], kid: str | None) -> jwt.PyJWK:
    if kid is not None and kid in keys:
        return keys[kid]
    if kid is None and len(keys) == 1:
        return next(iter(keys.values()))
    raise InvalidTokenError("the token's signing key is not in the issuer's JWKS")


def scopes_of(claims: dict[str, Any]) -> frozenset[Scope]:
    """The known scopes a token grants (`scope`: space-separated; `scp`: a list or a string)."""
    granted: list[str] = []
    for claim in ("scope", "scp"):
        value = claims.get(claim)
        if isinstance(value, str):
            granted.extend(value.split())
        elif isinstance(value, list):
            granted.extend(item for item in value if isinstance(item, str))
    known = {scope.value for scope in Scope}
    return frozenset(Scope(name) for name in granted if name in known)


class JwtVerifier:
    """Validates bearer JWTs of one issuer and audience and names their caller."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks: str,
        algorithms: list[str],
        principal_claim: str = "sub",
        tenant_claim: str = "tenant_id",
    ) -> None:
        if not (issuer and audience and jwks):
            raise ValueError("OIDC needs an issuer, an audience and a JWKS (file or URL)")
        if any(name.upper().startswith("HS") or name.lower() == "none" for name in algorithms):
            raise ValueError("only public-key algorithms are accepted for OIDC tokens")
        self._issuer = issuer
        self._audience = audience
        self._algorithms = algorithms
        self._principal_claim = principal_claim
        self._tenant_claim = tenant_claim
        self._keys = _UrlKeys(jwks) if jwks.startswith(("https://", "http://")) else _FileKeys(Path(jwks))

    async def caller(self, token: str) -> Caller:
        """The caller a valid token names; InvalidTokenError otherwise."""
        try:
            header = jwt.get_unverified_header(token)
            key = await self._keys.key(header.get("kid"))
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud", self._principal_claim]},
            )
        except (jwt.PyJWTError, OSError, ValueError) as error:
            raise InvalidTokenError(f"the bearer token was refused: {type(error).__name__}") from error
        principal, tenant = claims.get(self._principal_claim), claims.get(self._tenant_claim)
        if not isinstance(principal, str) or not principal:
            raise InvalidTokenError(f"the token's {self._principal_claim!r} claim names no principal")
        if not isinstance(tenant, str):
            raise InvalidTokenError(f"the token has no {self._tenant_claim!r} claim")
        return Caller(
            tenant_id=tenant,
            principal_id=principal,
            scopes=scopes_of(claims),
            credential=f"jwt:{self._issuer}",
        )
