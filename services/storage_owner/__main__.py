"""`python -m quipu.services.storage_owner`: the owner alone, against the configured Kafka and MongoDB."""

from __future__ import annotations

import asyncio

from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, MongoSettings, ServiceSettings
from quipu.services.storage_owner.app import SERVICE, create_app
from quipu.services.storage_owner.settings import OwnerSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = OwnerSettings()
    app = create_app(KafkaSettings(), MongoSettings(), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
