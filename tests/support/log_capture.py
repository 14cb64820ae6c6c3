"""Logging configured as a service configures it, into a buffer a test reads (`log_output`)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from quipu.services.kit.logging import clear_ids, configure_logging
from quipu.services.kit.settings import ServiceSettings


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """Logging configured as a service would, into a buffer; the old setup restored after."""
    stream = io.StringIO()
    root = logging.getLogger()
    old_level, old_handlers = root.level, list(root.handlers)
    configure_logging(ServiceSettings(service_name="tests", log_level="DEBUG", json_logs=True), stream=stream)
    yield stream
    clear_ids()
    root.handlers[:] = old_handlers
    root.setLevel(old_level)
    structlog.reset_defaults()


def log_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """The JSON lines written so far."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]
