"""What sealing a topic message costs: encode and open of a run event, sealed against plain.

A 2 KB `assistant_turn` event (the size of a typical answer) is encoded and decoded the way a
service does it: plain JSON when no key channel is configured, sealed under its principal's data
key (`MessageSeals` over an in-memory key source, so these are CPU figures, not HTTP ones) when
one is. The key fetch itself is one round trip per person per TTL per process; a burst of
messages of one person costs one fetch (`key_fetches_per_burst_of_100`).

Figures:

- `seal_encode_us_2kb`, `seal_open_decode_us_2kb`: microseconds per message, sealed;
- `plain_encode_us_2kb`, `plain_decode_us_2kb`: the same without sealing;
- `seal_overhead_us_2kb`: what sealing adds to one publish and one consume together;
- `sealed_bytes_ratio_2kb`: sealed wire size over plain wire size;
- `key_fetches_per_burst_of_100`: key fetches for 100 concurrent messages of one person (1).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable

from quipu.contracts.events import RunEvent, StreamEventType
from quipu.contracts.sealed import SealedFor
from quipu.contracts.wire import utc_now_ms
from quipu.services.kit.keys import KeyClient, MessageSeals

ROUNDS = 2000
PERSON = SealedFor(tenant_id="bench", principal_id="ada")


class _Keys:
    """Data keys in memory, counting fetches (the owner's endpoint answers the same)."""

    def __init__(self) -> None:
        self.keys: dict[SealedFor, bytes] = {}
        self.fetches = 0

    async def data_key(self, whose: SealedFor, *, create: bool) -> bytes | None:
        self.fetches += 1
        await asyncio.sleep(0)
        if create and whose not in self.keys:
            self.keys[whose] = secrets.token_bytes(32)
        return self.keys.get(whose)


async def _per_call_us(action: Callable[[], Awaitable[object]]) -> float:
    await action()  # warm: the key is fetched and cached, the cipher built
    started = time.perf_counter()
    for _ in range(ROUNDS):
        await action()
    return (time.perf_counter() - started) / ROUNDS * 1e6


async def measure_sealing() -> dict[str, float]:
    """Sealed against plain encode and decode of a 2 KB run event, and the key fetches of a burst."""
    event = RunEvent(
        type=StreamEventType.ASSISTANT_TURN,
        event_key="run-1/assistant/0",
        run_id="run-1",
        session_id="session-1",
        timestamp=utc_now_ms(),
        payload={"message": {"role": "assistant", "content": "word " * 400}},
        sealed_for=PERSON,
    )
    plain_event = event.model_copy(update={"sealed_for": None})
    seals = MessageSeals(KeyClient(_Keys()))
    sealed = await seals.encode(event)
    plain = plain_event.model_dump_json().encode()

    async def encode_plain() -> bytes:
        return plain_event.model_dump_json().encode()

    async def decode_plain() -> RunEvent:
        return RunEvent.model_validate_json(plain)

    async def open_sealed() -> RunEvent:
        return RunEvent.model_validate_json(await seals.open(sealed))

    figures = {
        "plain_encode_us_2kb": await _per_call_us(encode_plain),
        "seal_encode_us_2kb": await _per_call_us(lambda: seals.encode(event)),
        "plain_decode_us_2kb": await _per_call_us(decode_plain),
        "seal_open_decode_us_2kb": await _per_call_us(open_sealed),
        "sealed_bytes_ratio_2kb": len(sealed) / len(plain),
    }
    figures["seal_overhead_us_2kb"] = (
        figures["seal_encode_us_2kb"]
        - figures["plain_encode_us_2kb"]
        + figures["seal_open_decode_us_2kb"]
        - figures["plain_decode_us_2kb"]
    )
    keys = _Keys()
    burst = MessageSeals(KeyClient(keys))
    await asyncio.gather(*(burst.encode(event) for _ in range(100)))
    figures["key_fetches_per_burst_of_100"] = float(keys.fetches)
    return figures
