"""`python -m quipu.services.gateway`: the gateway, against the configured Kafka (and its storage owner)."""

from __future__ import annotations

import uvicorn

from quipu.services.gateway.app import SERVICE, create_app
from quipu.services.gateway.settings import GatewaySettings
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings


def main() -> None:
    """Read the settings once, configure logging and serve HTTP until interrupted."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = GatewaySettings()
    app = create_app(KafkaSettings(client_id=SERVICE), settings=settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # uvicorn's loggers go through quipu.services.kit.logging
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )


if __name__ == "__main__":
    main()
