"""Settings of the gateway, on top of the shared Kafka settings."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Where the gateway listens and how it talks to the store and streams events."""

    model_config = SettingsConfigDict(env_prefix="QUIPU_GATEWAY_", frozen=True, extra="ignore")

    host: str = Field(
        default="127.0.0.1", description="Interface the HTTP server binds (QUIPU_GATEWAY_HOST)."
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port of the HTTP server; 0 picks one.")
    keepalive_s: float = Field(
        default=15.0,
        gt=0,
        description="An event stream idle this long gets a keep-alive comment, so proxies keep it open.",
    )
    store_reply_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long one store command waits for the owner's reply before it is resent.",
    )
    store_attempts: int = Field(
        default=3,
        ge=1,
        description="Sends of one store command before the request fails with 503 UNAVAILABLE.",
    )
    tenant_id: str = Field(default="", description="Tenant stamped on the messages the gateway publishes.")
    shutdown_grace_s: int = Field(
        default=3,
        ge=0,
        description="At shutdown, open event streams get this long before their connections are closed.",
    )
    api_tokens: SecretStr | None = Field(
        default=None,
        description=(
            "Comma-separated bearer tokens callers must present on every /v1 route (header or the "
            "quipu_token cookie). Unset: the gateway lets every caller in, which suits only a "
            "development stack on loopback."
        ),
    )
