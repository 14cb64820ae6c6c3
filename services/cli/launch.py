"""`quipu up` and `quipu serve`: the embedded stack and the services, in this process or supervised.

`quipu up` refuses to start when another live `quipu up` owns the same state file (clients would
silently switch to the new stack), and when the gateway's port is taken (a gateway that cannot
bind would leave the stack without its HTTP API); `--gateway-port 0` picks a free port and says
which. `--processes` runs each service as a supervised child process (quipu.deploy.local.services).
`--app mod:attr` serves the user's App (services/cli/apps.py): its agents published on
`agents.registry`, an executor for each of its toolsets; without it, the built-in assistant's
App (quipu/assistant.py) is served the same way.
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
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from quipu.app import App
from quipu.contracts.tools import DEFAULT_TOOLSET
from quipu.services import catalog
from quipu.services.cli import apps
from quipu.services.cli.keys import local_gateway_access
from quipu.services.cli.output import CliError, console, warn
from quipu.services.cli.state import read_state, remove_state, shown_path, state_file, write_state
from quipu.services.kit.lifecycle import Connections, ServiceDefinition
from quipu.services.kit.settings import KafkaSettings, MongoSettings

if TYPE_CHECKING:
    from quipu.deploy.local.services import Supervisor

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


STORE_OWNER = "storage_owner"
"""Started before and stopped after every other service: each calls the store."""


@dataclass
class Started:
    """A service started in this process by `quipu up`, and how to stop it."""

    name: str
    stop: Callable[[], Any]


def in_process_services(user_app: App) -> list[list[tuple[str, ServiceDefinition[Any]]]]:
    """What `quipu up` starts in its own process before the gateway, in three waves, the services
    of a wave all at once: the storage owner (every other service calls the store); then the
    default tool executor and one for each toolset of the app; then the planner and the rest.
    Every executor has announced its toolset once started, so the planner finds every tool on
    `tools.registry` when it reads it (the App's agents are published before anything starts) and
    no early run waits for an announcement.

    Not one after another: each store client joining rebalanced the reply-claim group every store
    client before it was in, and each start waited that out (3-5 s a service on a busy host)."""
    owner, executors, others = [], [], []
    for service in catalog.CONSUMING:
        if service.name == STORE_OWNER:
            owner.append((service.name, service.definition()))
        elif service.name == "tool_executor":
            executors.append((service.name, service.definition()))
            executors += [(apps.executor_name(ts), apps.toolset_definition(ts)) for ts in user_app.toolsets]
        else:
            others.append((service.name, service.definition()))
    return [owner, executors, others]


def supervised_services(spec: str, user_app: App) -> list[tuple[str, str | tuple[str, ...]]]:
    """What `quipu up --processes` runs: each service of the catalog as `python -m <module>`, and each
    toolset of the app as `quipu serve tools --app SPEC --toolset NAME` (before the gateway)."""
    services: list[tuple[str, str | tuple[str, ...]]] = [(s.name, s.module) for s in catalog.CONSUMING]
    services += [(apps.executor_name(ts), apps.serve_tools_command(spec, ts)) for ts in user_app.toolsets]
    return services + [(s.name, s.module) for s in catalog.SERVICES if s.http]


async def _start_in_process(
    kafka: KafkaSettings,
    mongo: MongoSettings,
    gateway_port: int,
    started: list[Started],
    keys_file: Path,
    user_app: App,
) -> str:
    connections = Connections(kafka, mongo)

    async def start(name: str, definition: ServiceDefinition[Any]) -> Started | None:
        try:
            app = definition.app(connections)
            await app.start()
        except Exception as error:
            warn(f"{name}: did not start ({error!r}); skipped")
            return None
        return Started(name, app.stop)

    for wave in in_process_services(user_app):
        for service in await asyncio.gather(*(start(name, definition) for name, definition in wave)):
            if service is not None:
                started.append(service)
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


async def _stop_in_process(started: list[Started]) -> None:
    """Stop the services of this process: all at once, then the storage owner.

    One after another, each service leaving rebalanced the groups the others share (every store
    client's reply-claim group), and the next one waited out that rebalance before it could leave.
    """

    async def stop(service: Started) -> None:
        try:
            await service.stop()
        except Exception as error:
            warn(f"{service.name}: {error!r} while stopping")

    await asyncio.gather(*(stop(service) for service in started if service.name != STORE_OWNER))
    await asyncio.gather(*(stop(service) for service in started if service.name == STORE_OWNER))


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


async def _start_supervised(
    services: list[tuple[str, str | tuple[str, ...]]],
    environment: dict[str, str],
    on_change: Callable[[Supervisor], None],
) -> Supervisor:
    """`services` started under a supervisor, each line of output shown after its service's name."""
    from quipu.deploy.local.services import Supervisor  # noqa: PLC0415 - only `up` needs it

    names = [name for name, _ in services]
    styles = {n: _PREFIX_STYLES[i % len(_PREFIX_STYLES)] for i, n in enumerate(names)}
    width = max(map(len, names))
    supervisor = Supervisor(
        services,
        environment,
        on_output=_show_line(styles, width),
        on_notice=_show_notice(styles, width),
        on_change=lambda: on_change(supervisor),
        stop_last=(STORE_OWNER,),
    )
    await supervisor.start()
    for name, child in supervisor.states.items():
        console.print(Text(f"  ✓ {name} (pid {child.pid})", style="green"))
    return supervisor


async def _app_ready(kafka: KafkaSettings, user_app: App) -> None:
    """Wait until the shipped tools and every toolset of the app are announced: the planner offers
    only announced tools (a run started before waits for them, a bounded time)."""
    from quipu.services.cli.settings import CliSettings  # noqa: PLC0415

    names = [toolset.name for toolset in user_app.toolsets]
    found = await apps.announced(kafka, [DEFAULT_TOOLSET, *names], CliSettings().toolsets_ready_s)
    problems = apps.readiness(user_app, found)
    if DEFAULT_TOOLSET not in found:
        problems.append("not announced (the default executor is still starting?): the shipped tools")
    for problem in problems:
        warn(problem)
    if names and not problems:
        console.print(Text(f"  ✓ announced: {', '.join(names)}", style="green"))


def _set_on_signals(*signals: signal.Signals) -> asyncio.Event:
    """An event set when one of `signals` arrives (in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    return stop


async def _up(gateway_port: int, processes: bool, verbose: bool, spec: str | None) -> None:
    from quipu.deploy.local.stack import EmbeddedStack, create_topics  # noqa: PLC0415

    path = state_file()
    refuse_a_second_stack(path)
    spec = spec or apps.BUILT_IN_APP
    user_app = apps.loaded(spec)  # a mistake in it: nothing starts
    # In this process the gateway binds port 0 itself; a child process is told the port up front.
    port = gateway_port_to_use(gateway_port) if gateway_port or processes else 0
    if processes and not gateway_port:
        console.print(Text(f"gateway: any free port asked for; using {port}", style="dim"))
    stop = _set_on_signals(signal.SIGINT, signal.SIGTERM)
    console.print(Text("starting the embedded broker and database…", style="dim"))
    async with EmbeddedStack() as stack:
        kafka = KafkaSettings(bootstrap=stack.bootstrap, flavour=stack.kafka_flavour, client_id="quipu")
        mongo = MongoSettings(uri=stack.mongo_uri)
        toolsets = [toolset.name for toolset in user_app.toolsets]
        await create_topics(stack.bootstrap, kafka.topic_prefix, toolsets=toolsets)
        await apps.publish_agents(kafka, user_app)  # before any planner starts: it reads them first
        keys_file, local_key = local_gateway_access()  # the embedded default lets its own user in
        environment = {
            **stack.environment(),
            "QUIPU_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
            "QUIPU_GATEWAY_API_KEYS_FILE": str(keys_file),
            **local_key_channel(path.parent),
        }
        if not processes:  # the services in this process read their key settings from it
            os.environ.update({name: value for name, value in environment.items() if name in KEY_CHANNEL})
        state: dict[str, Any] = {
            "pid": os.getpid(),
            "environment": environment,
            "services": {},
            "app": spec,
            "agents": [agent.id for agent in user_app.agents],
            "toolsets": [toolset.name for toolset in user_app.toolsets],
        }
        started: list[Started] = []
        supervisor: Supervisor | None = None
        try:
            if processes:
                state |= {"mode": "processes", "gateway_url": f"http://{GATEWAY_HOST}:{port}"}
                children = {**environment, "QUIPU_GATEWAY_PORT": str(port), **apps.user_code_environment()}
                supervisor = await _start_supervised(
                    supervised_services(spec, user_app),
                    child_environment(children, verbose),
                    on_change=lambda running: _publish(path, state, running),
                )
            else:
                state |= {"mode": "in-process"}
                state["gateway_url"] = await _start_in_process(
                    kafka, mongo, port, started, keys_file, user_app
                )
                since = time.time()
                state["services"] = {s.name: {"pid": os.getpid(), "started_at": since} for s in started}
            await _app_ready(kafka, user_app)
            state["ready"] = True  # with --processes the file was written before: pids as they started
            _publish(path, state, supervisor)
            _show_up(stack.bootstrap, stack.mongo_uri, state, path, local_key)
            await stop.wait()
        finally:
            console.print(Text("stopping…", style="dim"))
            if supervisor is not None:
                await supervisor.stop()
            await _stop_in_process(started)
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


def _agent_option(state: dict[str, Any]) -> str:
    """` --agent ID` naming the app's first agent, unless it serves the default one (`assistant`)."""
    agents: list[str] = state.get("agents", [])
    return f" --agent {agents[0]}" if agents and "assistant" not in agents else ""


def _panel(bootstrap: str, mongo_uri: str, state: dict[str, Any], path: Path, local_key: str) -> Panel:
    quipu = quipu_command()
    hint = _agent_option(state)
    environment: dict[str, str] = state["environment"]
    return Panel(
        Group(
            Text(f"kafka {bootstrap} · mongodb {mongo_uri.split('?', maxsplit=1)[0]}"),
            Text(f"gateway {state.get('gateway_url') or '(not started)'}"),
            Text("gateway admin key (shown once; `quipu keys` issues others):"),
            Text(local_key, style="bold"),
            Text(f'in another terminal: {quipu} run{hint} "hello"   ·   {quipu} status', style="bold"),
            Text(f"clients find this stack through {shown_path(path)} (QUIPU_STATE_FILE)", style="dim"),
            Text("other programs: " + " ".join(f"{k}={v}" for k, v in environment.items()), style="dim"),
            Text("Ctrl-C stops everything", style="dim"),
        ),
        title="quipu is up",
        title_align="left",
        border_style="green",
    )


def up(gateway_port: int, processes: bool, verbose: bool, spec: str | None = None) -> None:
    """Run `quipu up` until Ctrl-C or SIGTERM, serving the App `spec` (`mod:attr`; default: the
    built-in assistant, `quipu.assistant:app`)."""
    # Each service's lines and each exit are shown as they happen, even through a pipe or a file.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    asyncio.run(_up(gateway_port, processes, verbose, spec))


def serve(service: str) -> None:
    """Run one service of the catalog alone, as `python -m quipu.services.<name>` would."""
    import runpy  # noqa: PLC0415

    runpy.run_module(catalog.named(service).module, run_name="__main__", alter_sys=True)
