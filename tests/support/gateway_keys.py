"""API keys for tests of the gateway: a keys file in a temporary directory and callers issued into it."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from quipu.services.gateway.access import Scope
from quipu.services.gateway.api_keys import KeyFile, new_key
from quipu.services.gateway.settings import GatewaySettings

EVERY_SCOPE_BUT_ADMIN: list[Scope] = [scope for scope in Scope if scope is not Scope.ADMIN]


ADMIN_PRINCIPAL = "operator"
"""The principal an admin key is issued to unless a test names another."""


class TestKeys:
    """A keys file of its own; `issue` hands out `Authorization` headers of new keys."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, directory: Path | None = None) -> None:
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="quipu-keys-"))
            # Its own directory goes with it: every suite run left dozens in /tmp.
            weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        self.directory = directory
        self.file = KeyFile(self.directory / "keys.json")

    def issue(
        self, principal_id: str, tenant_id: str = "", scopes: list[Scope] | None = None, name: str = ""
    ) -> dict[str, str]:
        """Headers carrying a new key for the principal (every scope but admin by default)."""
        key, stored = new_key(
            tenant_id=tenant_id,
            principal_id=principal_id,
            scopes=EVERY_SCOPE_BUT_ADMIN if scopes is None else scopes,
            name=name,
        )
        self.file.add(stored)
        return {"Authorization": f"Bearer {key}"}

    def admin(self, tenant_id: str = "", principal_id: str = ADMIN_PRINCIPAL) -> dict[str, str]:
        """Headers of a new admin key of the tenant."""
        return self.issue(principal_id, tenant_id, [Scope.ADMIN])

    def settings(self, **values: Any) -> GatewaySettings:
        """Gateway settings reading this keys file."""
        return GatewaySettings(api_keys_file=self.file.path, **values)
