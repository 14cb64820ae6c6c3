"""`python -m bench.fleet_child`: one child process of the fleet bench (bench.fleet).

Its roles are named in `BENCH_FLEET_ROLES` (space-separated), any number in one process, started
in order and stopped in reverse on SIGTERM:

- `all`: every service of the catalog in this process, the gateway included (on a free port), as
  `quipu up` runs them without `--processes`;
- `toolset:NAME`: a dedicated executor of one of the bench's toolsets (bench.toolsets).

A catalog service alone runs as the deployment runs it, `python -m quipu.services.<name>`; this
module is for what no such command starts. The connections come from the environment
(`QUIPU_KAFKA_...`, `QUIPU_MONGO_...`), as for any service.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

from bench.fleet import ROLES_ENV
from bench.toolsets import TOOLSETS
from quipu.services import catalog
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.settings import KafkaSettings, MongoSettings, ServiceSettings
from quipu.services.tool_executor.app import ToolExecutorDeps
from quipu.services.tool_executor.app import create_app as create_executor
from quipu.services.tool_executor.settings import ToolExecutorSettings

Stop = Callable[[], Awaitable[object]]


async def _start_all(kafka: KafkaSettings) -> list[Stop]:
    from quipu.services.gateway.app import EmbeddedServer, create_app  # noqa: PLC0415 - `all` only
    from quipu.services.gateway.settings import GatewaySettings  # noqa: PLC0415

    connections = Connections(kafka, MongoSettings())
    stops: list[Stop] = []
    for service in catalog.CONSUMING:
        app = service.definition().app(connections)
        await app.start()
        stops.append(app.stop)
    settings = GatewaySettings(host="127.0.0.1", port=0)
    server = EmbeddedServer(create_app(kafka, settings=settings), settings.host, settings.port)
    await server.start()
    stops.append(server.stop)
    return stops


async def _start_toolset(kafka: KafkaSettings, name: str) -> list[Stop]:
    app = create_executor(kafka, ToolExecutorSettings(), ToolExecutorDeps.dedicated(TOOLSETS[name]))
    await app.start()
    return [app.stop]


async def main(roles: list[str]) -> None:
    """Start every role, then wait for SIGTERM and stop them, last started first."""
    configure_logging(ServiceSettings(service_name="bench-fleet", log_level="WARNING"))
    kafka = KafkaSettings()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    stops: list[Stop] = []
    for role in roles:
        if role == "all":
            stops += await _start_all(kafka)
        elif role.startswith("toolset:"):
            stops += await _start_toolset(kafka, role.removeprefix("toolset:"))
        else:
            raise SystemExit(f"unknown role {role!r}")
    await stopping.wait()
    for stop in reversed(stops):
        await stop()


if __name__ == "__main__":
    asyncio.run(main(os.environ[ROLES_ENV].split()))
