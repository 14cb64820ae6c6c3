"""A tool executor (its own process) serving a user's tool with an effect outside Quipu: `charge`.

`python -m tests.chaos.charging_executor` runs the real executor (`create_app`, the real runner
and delivery) with the toolset `payments`: `charge` writes a charge to a ledger file, the "bank",
keyed by `context.idempotency_key`, and writes nothing when the key is already there, as a
payment provider's idempotency keys work. Each execution journals what it saw, with the pid.

With `QUIPU_TEST_HOLD_AFTER_EFFECT=1` the tool, once the charge is written, waits until its call
is abandoned, so a SIGKILL lands after the effect and before any result: the call was never
answered or committed and is delivered again to the next executor.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from quipu.tools import ToolContext, Toolset

JOURNAL_ENV = "QUIPU_TEST_TOOL_JOURNAL"
LEDGER_ENV = "QUIPU_TEST_LEDGER"
HOLD_ENV = "QUIPU_TEST_HOLD_AFTER_EFFECT"
MODULE = "tests.chaos.charging_executor"

payments = Toolset("payments", version="1")


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line, written with one O_APPEND write: lines of several processes never interleave."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(descriptor)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of `path`."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def charge_once(ledger: Path, key: str, amount_cents: int) -> bool:
    """The bank: record a charge under `key` unless one is there; True when this call charged."""
    with ledger.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # check and write as one step, whoever else charges
        handle.seek(0)
        if any(json.loads(line)["key"] == key for line in handle.read().splitlines() if line):
            return False
        handle.write(json.dumps({"key": key, "amount_cents": amount_cents, "pid": os.getpid()}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
        return True


@payments.tool(timeout_s=50.0)
def charge(amount_cents: Annotated[int, Field(ge=1, le=100_000)], context: ToolContext) -> dict[str, Any]:
    """Charges the card on file.

    Args:
        amount_cents: How much to charge, in cents.
    """
    journal, ledger = Path(os.environ[JOURNAL_ENV]), Path(os.environ[LEDGER_ENV])
    seen = {"pid": os.getpid(), "tool_use_id": context.tool_use_id, "key": context.idempotency_key}
    append_line(journal, {"event": "start", "at": time.time(), **seen})
    charged = charge_once(ledger, context.idempotency_key, amount_cents)
    append_line(journal, {"event": "charged" if charged else "already charged", **seen})
    if os.environ.get(HOLD_ENV) == "1":
        context.cancellation.wait_in_thread()  # until killed (or the deadline passes)
    return {"receipt": context.idempotency_key, "charged_now": charged}


def main() -> None:
    """Serve the executor with the shipped tools and `payments` until interrupted."""
    from quipu.services.kit.logging import configure_logging  # noqa: PLC0415 - only in the executor process
    from quipu.services.kit.settings import KafkaSettings, ServiceSettings  # noqa: PLC0415
    from quipu.services.tool_executor.app import SERVICE, ToolExecutorDeps, create_app  # noqa: PLC0415
    from quipu.services.tool_executor.settings import ToolExecutorSettings  # noqa: PLC0415

    configure_logging(ServiceSettings(service_name=SERVICE))
    app = create_app(KafkaSettings(), ToolExecutorSettings(), deps=ToolExecutorDeps.serving(payments))
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
