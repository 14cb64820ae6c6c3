"""Rotating the key channel's service token without a window where a service is refused.

The owner accepts the new token and, while services move over, the previous one; a service that
reads its token from a file (a mounted Secret) picks a rotated one up on the next refusal, with no
restart. A real endpoint on loopback over a key source in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr

from quipu.contracts.sealed import SealedFor
from quipu.services.kit.keys import HttpKeySource, KeyUnavailableError
from quipu.services.kit.settings import KeySettings
from quipu.services.storage_owner.key_endpoint import KeyEndpoint
from tests.owner_support import free_port

ANA = SealedFor(tenant_id="acme", principal_id="ana")
KEY = bytes(range(32))


class OneKey:
    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        return KEY if whose == ANA else None


@asynccontextmanager
async def endpoint(*tokens: str) -> AsyncIterator[str]:
    port = free_port()
    served = KeyEndpoint(OneKey(), list(tokens), "127.0.0.1", port)
    await served.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await served.stop()


async def key_with(settings: KeySettings) -> bytes | None:
    source = HttpKeySource(settings)
    try:
        return await source.data_key(ANA, create=False)
    finally:
        await source.close()


async def test_the_owner_accepts_the_new_token_and_the_previous_one_during_a_rotation() -> None:
    async with endpoint("new-token", "old-token") as url:
        assert await key_with(KeySettings(url=url, token=SecretStr("new-token"))) == KEY
        assert await key_with(KeySettings(url=url, token=SecretStr("old-token"))) == KEY
        with pytest.raises(KeyUnavailableError, match="401"):
            await key_with(KeySettings(url=url, token=SecretStr("guessed")))


async def test_a_service_reading_its_token_from_a_file_picks_a_rotated_one_up_without_a_restart(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    async with endpoint("new-token") as url:
        source = HttpKeySource(KeySettings(url=url, token_file=token_file))
        try:
            with pytest.raises(KeyUnavailableError, match="401"):
                await source.data_key(ANA, create=False)
            token_file.write_text("new-token\n")  # the Secret was rotated under the running service
            assert await source.data_key(ANA, create=False) == KEY
        finally:
            await source.close()
