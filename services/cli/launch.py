"""`quipu up` and `quipu serve`: the embedded stack and the services, in this process or supervised.

`quipu up` refuses to start when another live `quipu up` owns the same state file (clients would
silently switch to the new stack), and when the gateway's port is taken (a gateway that cannot
bind would leave the stack without its HTTP API); `--gateway-port 0` picks a free port and says
which. `--processes` runs each service as a supervised child process (quipu.deploy.local.services).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from quipu.services import catalog
from quipu.services.cli.keys import local_gateway_access
from quipu.services.cli.output import CliError, console, warn
from quipu.services.cli.state import read_state, remove_state, shown_path, state_file, write_state
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.settings import KafkaSettings, MongoSettings

GATEWAY_HOST = "127.0.0.1"

_PREFIX_STYLES = ("cyan", "magenta", "blue", "green", "yellow", "bright_cyan", "bright_magenta")


def quipu_command() -> str:
    """How to run `quipu` from here: `quipu` when that is this program on PATH, else its path."""
    script = Path(sys.executable).parent / "quipu"
    on_path = shutil.which("quipu")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "quipu"
    if not script.exists():
        return f"{sys.executable} -m quipu.services.cli"
    with contextlib.suppress(ValueError):
        return str(Path(os.path.abspath(script)).relative_to(Path.cwd()))
    return str(script)


def gateway_port_to_use(port: int) -> int:
    """The gateway's port: `port` if it is free (else CliError, before anything starts); 0 picks one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((GATEWAY_HOST, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise CliError(f"gateway port {port}: {error.strerror}") from error
            raise CliError(
                f"port {port} is taken (another program listens on {GATEWAY_HOST}:{port}); "
                "choose one with --gateway-port N, or --gateway-port 0 for any free port"
            ) from error
        chosen: int = probe.getsockname()[1]
    return chosen


def refuse_a_second_stack(path: Path) -> None:
    """CliError when a live `quipu up` owns the state file: a second one would take over its clients."""
    running = read_state(path)
    if running is not None:
        raise CliError(
            f"another `quipu up` (pid {running['pid']}) is running and {shown_path(path)} points "
            "clients at it; stop it first, or give this one its own state file: "
            f"QUIPU_STATE_FILE=/tmp/quipu-2.json {quipu_command()} up --gateway-port 0"
        )


@dataclass
class Started:
    """A service started in this process by `quipu up`, and how to stop it."""

    name: str
    stop: Callable[[], Any]


async def _start_in_process(
    kafka: KafkaSettings, mongo: MongoSettings, gateway_port: int, started: list[Started], keys_file: Path
) -> str:
    connections = Connections(kafka, mongo)
    for service in catalog.CONSUMING:
        try:
            app = service.definition().app(connections)
            await app.start()
        except Exception as error:
            warn(f"{service.name}: did not start ({error!r}); skipped")
            continue
        started.append(Started(service.name, app.stop))
        console.print(Text(f"  ✓ {service.name}", style="green"))
    from quipu.services.gateway.app import EmbeddedServer  # noqa: PLC0415 - lazily, like every service
    from quipu.services.gateway.app import create_app as create_gateway  # noqa: PLC0415
    from quipu.services.gateway.settings import GatewaySettings  # noqa: PLC0415

    settings = GatewaySettings(host=GATEWAY_HOST, port=gateway_port, api_keys_file=keys_file)
    server = EmbeddedServer(create_gateway(kafka, settings=settings), settings.host, settings.port)
    try:
        await server.start()
    except (Exception, SystemExit) as error:  # uvicorn exits when it cannot bind
        raise CliError(f"the gateway did not start on port {gateway_port}: {error!r}") from error
    started.append(Started("gateway", server.stop))
    console.print(Text(f"  ✓ gateway on {server.url} (API docs at {server.url}/docs)", style="green"))
    return server.url


def _show_line(styles: dict[str, str], width: int) -> Callable[[str, str], None]:
    def show(name: str, line: str) -> None:
        prefix = Text(f"{name:<{width}} | ", style=styles[name])
        console.print(prefix + Text(line), soft_wrap=True, highlight=False)

    return show


def _show_notice(styles: dict[str, str], width: int) -> Callable[[str, str], None]:
    def show(name: str, notice: str) -> None:
        prefix = Text(f"{name:<{width}} | ", style=styles[name])
        console.print(prefix + Text(notice, style="bold yellow"), soft_wrap=True)

    return show


KEY_CHANNEL = ("QUIPU_KEYS_URL", "QUIPU_KEYS_TOKEN_FILE", "QUIPU_OWNER_KEYS_PORT")
"""The variables of the local key channel: where services and clients ask the owner for data keys."""


def local_key_channel(folder: Path) -> dict[str, str]:
    """The embedded default seals what it puts on its topics, as a deployment does: the owner serves
    its key endpoint on a free loopback port, and the service token goes to a file only this user
    can read (fresh at every start). The token itself is never in the state file or the banner:
    they name the file, and clients read it from there."""
    folder.mkdir(parents=True, exist_ok=True)
    token_file = folder / "keys-token"
    token_file.unlink(missing_ok=True)
    descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_urlsafe(32))
    port = gateway_port_to_use(0)
    return {
        "QUIPU_KEYS_URL": f"http://{GATEWAY_HOST}:{port}",
        "QUIPU_KEYS_TOKEN_FILE": str(token_file),
        "QUIPU_OWNER_KEYS_PORT": str(port),
    }


def child_environment(environment: dict[str, str], verbose: bool) -> dict[str, str]:
    """What the supervised services get: the stack, and logging as quiet as `quipu up` itself."""
    extra = dict(environment)
    if "QUIPU_LOG_LEVEL" not in os.environ:
        extra["QUIPU_LOG_LEVEL"] = "INFO" if verbose else "WARNING"
    if "QUIPU_JSON_LOGS" not in os.environ and console.is_terminal:
        extra["QUIPU_JSON_LOGS"] = "false"  # a person reads them: the pretty form, prefixed
    return extra


async def _up(gateway_port: int, processes: bool, verbose: bool) -> None:
    from quipu.deploy.local.services import Supervisor  # noqa: PLC0415 - only `up` needs these
    from quipu.deploy.local.stack import EmbeddedStack, create_topics  # noqa: PLC0415

    path = state_file()
    refuse_a_second_stack(path)
    # In this process the gateway binds port 0 itself; a child process is told the port up front.
    port = gateway_port_to_use(gateway_port) if gateway_port or processes else 0
    if processes and not gateway_port:
        console.print(Text(f"gateway: any free port asked for; using {port}", style="dim"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    console.print(Text("starting the embedded broker and database…", style="dim"))
    async with EmbeddedStack() as stack:
        kafka = KafkaSettings(bootstrap=stack.bootstrap, flavour=stack.kafka_flavour, client_id="quipu")
        mongo = MongoSettings(uri=stack.mongo_uri)
        await create_topics(stack.bootstrap, kafka.topic_prefix)
        keys_file, local_key = local_gateway_access()  # the embedded default lets its own user in
        environment = {
            **stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
            "QUIPU_GATEWAY_API_KEYS_FILE": str(keys_file),
            **local_key_channel(path.parent),
        }
        if not processes:  # the services in this process read their key settings from it
            os.environ.update({name: value for name, value in environment.items() if name in KEY_CHANNEL})
        state: dict[str, Any] = {"pid": os.getpid(), "environment": environment, "services": {}}
        started: list[Started] = []
        supervisor: Supervisor | None = None
        try:
            if processes:
                names = catalog.NAMES
                styles = {n: _PREFIX_STYLES[i % len(_PREFIX_STYLES)] for i, n in enumerate(names)}
                width = max(map(len, names))
                supervisor = Supervisor(
                    [(service.name, service.module) for service in catalog.SERVICES],
                    child_environment({**environment, "QUIPU_GATEWAY_PORT": str(port)}, verbose),
                    on_output=_show_line(styles, width),
                    on_notice=_show_notice(styles, width),
                    on_change=lambda: _publish(path, state, supervisor),
                )
                state |= {"mode": "processes", "gateway_url": f"http://{GATEWAY_HOST}:{port}"}
                await supervisor.start()
                for name, child in supervisor.states.items():
                    console.print(Text(f"  ✓ {name} (pid {child.pid})", style="green"))
            else:
                state |= {"mode": "in-process"}
                state["gateway_url"] = await _start_in_process(kafka, mongo, port, started, keys_file)
                since = time.time()
                state["services"] = {s.name: {"pid": os.getpid(), "started_at": since} for s in started}
            _publish(path, state, supervisor)
            _show_up(stack.bootstrap, stack.mongo_uri, state, path, local_key)
            await stop.wait()
        finally:
            console.print(Text("stopping…", style="dim"))
            if supervisor is not None:
                await supervisor.stop()
            for service in reversed(started):
                try:
                    await service.stop()
                except Exception as error:
                    warn(f"{service.name}: {error!r} while stopping")
            remove_state(path, os.getpid())
    console.print(Text("stopped", style="dim"))


def _publish(path: Path, state: dict[str, Any], supervisor: Any) -> None:
    """Write the state file, with each supervised service's pid and restarts as they are now."""
    if supervisor is not None:
        state["services"] = {name: service.as_json() for name, service in supervisor.states.items()}
    if "mode" in state:  # written once start-up got that far; before, the previous owner's check ran
        write_state(path, state)


def _show_up(bootstrap: str, mongo_uri: str, state: dict[str, Any], path: Path, local_key: str) -> None:
    """The panel saying where everything is, then the page's link signed in with the local key."""
    console.print(_panel(bootstrap, mongo_uri, state, path, local_key))
    if state.get("gateway_url"):
        # Unwrapped, so it can be clicked or copied; the key rides in the fragment, never sent.
        console.print(f"the page, signed in: {state['gateway_url']}/#key={local_key}", soft_wrap=True)


def _panel(bootstrap: str, mongo_uri: str, state: dict[str, Any], path: Path, local_key: str) -> Panel:
    quipu = quipu_command()
    environment: dict[str, str] = state["environment"]
    return Panel(
        Group(
            Text(f"kafka {bootstrap} · mongodb {mongo_uri.split('?', maxsplit=1)[0]}"),
            Text(f"gateway {state.get('gateway_url') or '(not started)'}"),
            Text("gateway admin key (shown once; `quipu keys` issues others):"),
            Text(local_key, style="bold"),
            Text(f'in another terminal: {quipu} run "hello"   ·   {quipu} status', style="bold"),
            Text(f"clients find this stack through {shown_path(path)} (QUIPU_STATE_FILE)", style="dim"),
            Text("other programs: " + " ".join(f"{k}={v}" for k, v in environment.items()), style="dim"),
            Text("Ctrl-C stops everything", style="dim"),
        ),
        title="quipu is up",
        title_align="left",
        border_style="green",
    )


def up(gateway_port: int, processes: bool, verbose: bool) -> None:
    """Run `quipu up` until Ctrl-C or SIGTERM."""
    # Each service's lines and each exit are shown as they happen, even through a pipe or a file.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    asyncio.run(_up(gateway_port, processes, verbose))


def serve(service: str) -> None:
    """Run one service of the catalog alone, as `python -m quipu.services.<name>` would."""
    import runpy  # noqa: PLC0415

    runpy.run_module(catalog.named(service).module, run_name="__main__", alter_sys=True)
