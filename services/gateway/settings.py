"""Settings of the gateway, on top of the shared Kafka settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from quipu.services.kit.settings import StoreClientSettings


class GatewaySettings(StoreClientSettings):
    """Where the gateway listens and how it talks to the store and streams events."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_GATEWAY_")

    host: str = Field(
        default="127.0.0.1", description="Interface the HTTP server binds (QUIPU_GATEWAY_HOST)."
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port of the HTTP server; 0 picks one.")
    keepalive_s: float = Field(
        default=15.0,
        gt=0,
        description="An event stream idle this long gets a keep-alive comment, so proxies keep it open.",
    )
    tenant_id: str = Field(
        default="",
        description=(
            "The default tenant: where sessions created without an owner (by `quipu run`, or before "
            "sessions recorded one) belong, so only this tenant's admins reach them."
        ),
    )
    shutdown_grace_s: int = Field(
        default=3,
        ge=0,
        description="At shutdown, open event streams get this long before their connections are closed.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description=(
            "JSON file of API keys (`quipu keys create|list|revoke` writes it; only hashes are kept). "
            "Re-read when it changes, so a new or revoked key counts at the next request."
        ),
    )
    oidc_issuer: str = Field(
        default="", description="Issuer (`iss`) of accepted OAuth2/OIDC bearer JWTs; empty: JWTs are refused."
    )
    oidc_audience: str = Field(
        default="", description="Audience (`aud`) the JWTs must name (required with an issuer)."
    )
    oidc_jwks: str = Field(
        default="",
        description=(
            "Signing keys of the issuer: a JWKS file path, or an https URL (cached; refetched when a "
            "token names an unknown key id)."
        ),
    )
    oidc_algorithms: str = Field(
        default="RS256,ES256,PS256,EdDSA", description="Comma-separated signature algorithms accepted."
    )
    oidc_principal_claim: str = Field(default="sub", description="Claim naming the principal.")
    oidc_tenant_claim: str = Field(
        default="tenant_id", description="Claim naming the tenant; a JWT without it is refused."
    )
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted; a larger one is refused with 413 before it is read.",
    )
    api_tokens: SecretStr | None = Field(
        default=None,
        description=(
            "Replaced by API keys (QUIPU_GATEWAY_API_KEYS_FILE): shared tokens named nobody. A gateway "
            "with it set refuses to start and says how to issue keys."
        ),
    )
