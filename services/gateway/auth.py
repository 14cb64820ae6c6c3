"""Who is calling: every `/v1` route authenticates its caller as a principal within a tenant.

Two credentials are accepted, both as `Authorization: Bearer <credential>` or in the `quipu_token`
cookie (the page's event stream cannot set headers; the page sets it `SameSite=Strict`, so other
sites cannot ride on it):

- an API key (`qk_…`, see `api_keys`), issued per principal or per tenant admin;
- an OAuth2/OIDC JWT of the configured issuer and audience (see `oidc`).

Without either configured nobody gets in (the gateway says so at startup). Health checks, the
page and the OpenAPI docs stay open: they reveal nothing of anyone's runs or memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import unquote

from fastapi import Depends, Request
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from quipu.services.gateway.access import Caller, Scope
from quipu.services.gateway.api_keys import KeyFile, split_key, verify
from quipu.services.gateway.logic import GatewayError
from quipu.services.gateway.oidc import InvalidTokenError, JwtVerifier
from quipu.services.gateway.settings import GatewaySettings

TOKEN_COOKIE = "quipu_token"
UNAUTHENTICATED = "UNAUTHENTICATED"

_bearer = HTTPBearer(auto_error=False, description="An API key (`qk_…`) or an OIDC access token (JWT).")
_cookie = APIKeyCookie(name=TOKEN_COOKIE, auto_error=False, description="The same credential, for the page.")


def presented_token(authorization: str | None, cookie: str | None) -> str | None:
    """The credential a request carries: the bearer header first, else the cookie."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    # The page writes the cookie percent-encoded.
    return unquote(cookie) if cookie else None


@dataclass
class Authenticator:
    """Turns a presented credential into a `Caller`, or refuses it with 401."""

    keys: KeyFile | None = None
    tokens: JwtVerifier | None = None

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Authenticator:
        """The credentials the settings configure (ValueError on an incomplete or retired setting)."""
        if settings.api_tokens is not None and settings.api_tokens.get_secret_value().strip():
            raise ValueError(
                "QUIPU_GATEWAY_API_TOKENS is replaced by API keys tied to a principal: issue them with "
                "`quipu keys create` and set QUIPU_GATEWAY_API_KEYS_FILE"
            )
        tokens = None
        if settings.oidc_issuer or settings.oidc_jwks:
            tokens = JwtVerifier(
                issuer=settings.oidc_issuer,
                audience=settings.oidc_audience,
                jwks=settings.oidc_jwks,
                algorithms=[name.strip() for name in settings.oidc_algorithms.split(",") if name.strip()],
                principal_claim=settings.oidc_principal_claim,
                tenant_claim=settings.oidc_tenant_claim,
            )
        keys = KeyFile(settings.api_keys_file) if settings.api_keys_file is not None else None
        return cls(keys=keys, tokens=tokens)

    @property
    def configured(self) -> bool:
        """Whether any credential can be accepted at all."""
        return self.keys is not None or self.tokens is not None

    async def caller(self, presented: str | None) -> Caller:
        """The caller of a credential; 401 when it is missing, unknown, revoked, expired or invalid."""
        if presented is None:
            raise _refused("send an API key or an OIDC token as 'Authorization: Bearer <credential>'")
        if split_key(presented) is not None:
            stored = verify(presented, self.keys.current()) if self.keys is not None else None
            if stored is None:
                raise _refused("the API key is unknown or revoked")
            return stored.caller()
        if self.tokens is None:
            raise _refused("this gateway accepts API keys only")
        try:
            return await self.tokens.caller(presented)
        except InvalidTokenError as error:
            raise _refused(str(error)) from error


def _refused(message: str) -> GatewayError:
    return GatewayError(401, UNAUTHENTICATED, message)


async def authenticate(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    cookie: Annotated[str | None, Depends(_cookie)],
) -> Caller:
    """The request's caller (a FastAPI dependency on every `/v1` route)."""
    authenticator: Authenticator = request.app.state.authenticator
    header = request.headers.get("authorization")
    presented = presented_token(header, cookie) if bearer is None else bearer.credentials
    caller = await authenticator.caller(presented)
    request.state.caller = caller
    return caller


def with_scope(scope: Scope) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency: the authenticated caller, refused with 403 unless it has `scope`."""

    async def dependency(caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
        caller.require(scope)
        return caller

    return dependency


RunsReader = Annotated[Caller, Depends(with_scope(Scope.RUNS_READ))]
RunsWriter = Annotated[Caller, Depends(with_scope(Scope.RUNS_WRITE))]
MemoryReader = Annotated[Caller, Depends(with_scope(Scope.MEMORY_READ))]
MemoryWriter = Annotated[Caller, Depends(with_scope(Scope.MEMORY_WRITE))]
Admin = Annotated[Caller, Depends(with_scope(Scope.ADMIN))]
