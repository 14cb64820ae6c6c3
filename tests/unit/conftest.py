"""Fixtures of the unit tests."""

from __future__ import annotations

from tests.support.log_capture import log_output

__all__ = ["log_output"]
