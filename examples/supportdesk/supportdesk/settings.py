"""Where the desk keeps its tickets and asks for the shop's status: `SUPPORTDESK_...` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DeskSettings(BaseSettings):
    """Read when a tool runs (never at import), so each executor copy takes its own environment."""

    model_config = SettingsConfigDict(env_prefix="SUPPORTDESK_")

    ledger: Path = Field(
        default=Path("supportdesk-tickets.jsonl"),
        description="The ticket ledger, one JSON line per ticket: every executor copy writes the same file.",
    )
    status_url: str = Field(
        default="http://127.0.0.1:8765",
        description="The base URL of the shop's status page (`GET <url>/status/<service>`).",
    )
