"""Who may call the gateway: bearer tokens from the settings, checked on every `/v1` route.

With `QUIPU_GATEWAY_API_TOKENS` unset the gateway is open (a development stack on loopback) and
says so in its log at startup. Set, a request must present one of the tokens, either as
`Authorization: Bearer <token>` (API clients) or in the `quipu_token` cookie, which the browser
sends with the event stream (EventSource cannot set headers) and which the page sets
`SameSite=Strict`, so other sites cannot ride on it. Health checks, the page and the OpenAPI docs
stay open: they reveal nothing of anyone's runs or memory.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from urllib.parse import unquote

from fastapi import Request

from services.gateway.logic import GatewayError

TOKEN_COOKIE = "quipu_token"
UNAUTHENTICATED = "UNAUTHENTICATED"


def parse_tokens(configured: str) -> tuple[str, ...]:
    """The tokens of a comma-separated setting, blanks dropped."""
    return tuple(token.strip() for token in configured.split(",") if token.strip())


def presented_token(authorization: str | None, cookie: str | None) -> str | None:
    """The token a request carries: the bearer header first, else the cookie."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    # The page writes the cookie percent-encoded (a token may hold `;` or `=`).
    return unquote(cookie) if cookie else None


def is_known(token: str | None, tokens: Sequence[str]) -> bool:
    """Whether `token` is one of `tokens`, compared in constant time (each is compared)."""
    if token is None:
        return False
    presented = token.encode()
    matches = [hmac.compare_digest(presented, known.encode()) for known in tokens]
    return any(matches)


class TokenCheck:
    """A FastAPI dependency refusing callers without a known token (nothing to check when open)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens = tuple(tokens)

    @property
    def open(self) -> bool:
        """No tokens configured: every caller is let in."""
        return not self.tokens

    async def __call__(self, request: Request) -> None:
        if self.open:
            return
        token = presented_token(request.headers.get("authorization"), request.cookies.get(TOKEN_COOKIE))
        if not is_known(token, self.tokens):
            raise GatewayError(
                401,
                UNAUTHENTICATED,
                "send a gateway API token as 'Authorization: Bearer <token>' (or the quipu_token cookie)",
            )
