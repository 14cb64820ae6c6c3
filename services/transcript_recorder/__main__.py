"""`python -m quipu.services.transcript_recorder`: the recorder, against the configured Kafka (and owner)."""

from __future__ import annotations

import asyncio

from quipu.services.kit.lifecycle import serve
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, ServiceSettings
from quipu.services.transcript_recorder.app import SERVICE, create_app
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings


def main() -> None:
    """Read the settings once, configure logging and serve until SIGTERM (then stop within the grace)."""
    configure_logging(ServiceSettings(service_name=SERVICE))
    settings = TranscriptRecorderSettings()
    app = create_app(KafkaSettings(), settings)
    asyncio.run(serve(app, settings))


if __name__ == "__main__":
    main()
