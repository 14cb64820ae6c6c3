"""Your App in `quipu up --app` and `quipu serve tools --app`: its toolsets' executors, its agents.

Every toolset of an App is served by an executor of its own (`tools.calls.<toolset>`, consumer group
`tool-executor-<toolset>`, announced on `tools.registry`), beside the default executor of the shipped
tools; the planner learns them from the registry and needs no user code. `quipu up --processes`
runs each toolset's executor as the command a user would run, `quipu serve tools --app SPEC
--toolset NAME`, from the same directory and with it on PYTHONPATH, so the user's module imports.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from quipu.app import AnyToolset, App, AppError, AppLoadError, load_app
from quipu.contracts.errors import QuipuError
from quipu.contracts.tools import ToolsetAnnounced
from quipu.contracts.topics import Topic, toolset_calls_topic
from quipu.mcp import McpOAuth, McpToolset
from quipu.services.catalog import Consumer
from quipu.services.cli.output import CliError, note
from quipu.services.cli.state import adopt_running_stack
from quipu.services.kit.lifecycle import Connections, ServiceDefinition
from quipu.services.kit.publishing import PublishError
from quipu.services.kit.run_events import topic_partitions
from quipu.services.kit.settings import KafkaSettings
from quipu.tools import Toolset

BUILT_IN_APP = "quipu.assistant:app"
"""What `quipu up` serves without `--app`: the built-in assistant, written as a user's App is."""

TOOLS_SERVICE = "tools"
"""`quipu serve tools --app ...`: one toolset's executor."""


def loaded(spec: str) -> App:
    """The App `spec` names; a CliError saying what is wrong otherwise."""
    try:
        return load_app(spec)
    except (AppLoadError, AppError) as error:
        raise CliError(f"--app {spec}: {error}") from error


def chosen_toolset(app: App, spec: str, name: str | None) -> AnyToolset:
    """The toolset `quipu serve tools` serves: the one named, or the app's only one."""
    try:
        return app.toolset(name)
    except AppError as error:
        raise CliError(f"--app {spec}: {error}") from error


def toolset_definition(toolset: AnyToolset) -> ServiceDefinition[Any]:
    """How the executor of `toolset` is built and run, alone or beside the other services."""
    from quipu.services.tool_executor.app import dedicated_definition  # noqa: PLC0415 - lazily

    if not isinstance(toolset, Toolset | McpToolset):
        raise CliError(f"toolset {toolset.name!r}: an executor serves a quipu.Toolset or a quipu.McpToolset")
    return dedicated_definition(toolset)


def serve_tools(spec: str | None, toolset: str | None) -> None:
    """`quipu serve tools --app SPEC [--toolset NAME]`: serve one toolset until SIGTERM."""
    if spec is None:
        raise CliError("`quipu serve tools` serves a toolset of your app: give --app MODULE:ATTRIBUTE")
    serve_beside_running_stack(toolset_definition(chosen_toolset(loaded(spec), spec, toolset)))


def serve_beside_running_stack(definition: ServiceDefinition[Any]) -> None:
    """Run a toolset's executor until SIGTERM, on the running `quipu up`'s Kafka and key channel
    when nothing else is configured (a second terminal needs no variables)."""
    running = adopt_running_stack()
    if running is not None:
        note(f"stack: {running} · kafka {os.environ['QUIPU_KAFKA_BOOTSTRAP']}")
    try:
        definition.main()
    except QuipuError as error:
        # An executor that cannot start (an MCP server out of reach, a secret that cannot be read)
        # says why in one line; its message names no secret and no URL.
        raise CliError(str(error)) from None


@dataclass(frozen=True)
class McpOAuthOptions:
    """`quipu serve mcp`'s `--oauth-*` options (all empty: no OAuth)."""

    client_id: str = ""
    issuer: str = ""
    client_secret_env: str = ""
    client_secret_file: Path | None = None
    scope: str = ""


def mcp_credentials(
    bearer_token_env: str, bearer_token_file: Path | None, oauth: McpOAuthOptions
) -> dict[str, Any]:
    """The `McpToolset` credential fields the options name (where the secrets are, never a secret)."""
    credentials: dict[str, Any] = {}
    if bearer_token_env:
        credentials["bearer_token_env"] = bearer_token_env
    if bearer_token_file is not None:
        credentials["bearer_token_file"] = bearer_token_file
    if oauth != McpOAuthOptions():
        try:
            credentials["oauth"] = McpOAuth(
                client_id=oauth.client_id,
                issuer=oauth.issuer,
                client_secret_env=oauth.client_secret_env,
                client_secret_file=oauth.client_secret_file,
                scope=oauth.scope,
            )
        except ValueError as error:
            raise CliError(
                f"{error} (--oauth-client-id, --oauth-issuer and one --oauth-client-secret-*)"
            ) from None
    return credentials


def serve_mcp(
    toolset: str | None,
    url: str | None,
    command: list[str],
    version: str,
    timeout_s: float,
    server_log: Path | None = None,
    headers: Sequence[str] = (),
    credentials: Mapping[str, Any] | None = None,
) -> None:
    """`quipu serve mcp --toolset NAME (--url URL | -- COMMAND ...)`: an MCP server as toolset NAME;
    `credentials` are `McpToolset` fields (`mcp_credentials`)."""
    if toolset is None:
        raise CliError("`quipu serve mcp` serves an MCP server as a toolset: give --toolset NAME")
    named = [header.partition(":") for header in headers]
    if any(not name.strip() or not sep for name, sep, _ in named):
        raise CliError("--header takes 'NAME: VALUE', e.g. --header 'Authorization: Bearer $TOKEN'")
    try:
        served = McpToolset(
            toolset,
            command=command,
            url=url or "",
            version=version,
            timeout_s=timeout_s,
            server_log=server_log,
            headers={name.strip(): value.strip() for name, _, value in named},
            **(credentials or {}),
        )
    except ValueError as error:
        raise CliError(
            f"{error} (the command goes after `--`: quipu serve mcp --toolset {toolset} -- CMD)"
        ) from None
    serve_beside_running_stack(toolset_definition(served))


def executor_name(toolset: AnyToolset) -> str:
    """The name a toolset's executor goes by in `quipu up` and `quipu status`."""
    return f"{TOOLS_SERVICE}-{toolset.name}"


def toolset_consumers(state: dict[str, Any] | None) -> tuple[Consumer, ...]:
    """The consumer group of each toolset's executors a `quipu up` runs (its state's `toolsets`)."""
    from quipu.services.tool_executor.settings import ToolExecutorSettings  # noqa: PLC0415

    group = ToolExecutorSettings.model_fields["group"].default  # a toolset's group is `<group>-<toolset>`
    names: list[str] = (state or {}).get("toolsets", [])
    return tuple(
        Consumer(f"{TOOLS_SERVICE}-{name}", f"{group}-{name}", toolset_calls_topic(name)) for name in names
    )


def serve_tools_command(spec: str, toolset: AnyToolset) -> tuple[str, ...]:
    """The interpreter's arguments for `quipu serve tools --app SPEC --toolset NAME`."""
    return ("-m", "quipu.services.cli", "serve", TOOLS_SERVICE, "--app", spec, "--toolset", toolset.name)


def user_code_environment() -> dict[str, str]:
    """PYTHONPATH with the current directory first: a child imports the user's module as `up` did."""
    here = str(Path.cwd())
    given = os.environ.get("PYTHONPATH", "")
    paths = [here, *(path for path in given.split(os.pathsep) if path and path != here)]
    return {"PYTHONPATH": os.pathsep.join(paths)}


async def announced(
    kafka: KafkaSettings, toolsets: list[str], within_s: float
) -> dict[str, ToolsetAnnounced]:
    """The announcements of `toolsets` on `tools.registry`, once each has one or `within_s` passed.

    `quipu up --app` says it is up once every toolset of the app can be called: with `--processes`
    a toolset's executor is a process of its own, which may announce after the planner is up, and
    a run arriving before would fail with `missing_tool`.
    """
    found: dict[str, ToolsetAnnounced] = {}
    if not toolsets:
        return found
    registry = kafka.topic_prefix + Topic.TOOLS_REGISTRY
    reader = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        client_id="quipu-up",
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
    )
    await reader.start()
    try:
        partitions = [TopicPartition(registry, p) for p in await topic_partitions(reader, registry)]
        reader.assign(partitions)
        await reader.seek_to_beginning(*partitions)
        deadline = time.monotonic() + within_s
        while set(toolsets) - set(found) and time.monotonic() < deadline:
            batches = await reader.getmany(timeout_ms=200)
            for record in (record for batch in batches.values() for record in batch):
                with contextlib.suppress(ValueError):
                    announcement = ToolsetAnnounced.model_validate_json(record.value or b"")
                    if announcement.toolset in toolsets:
                        found[announcement.toolset] = announcement
    finally:
        await reader.stop()
    return found


def readiness(app: App, announcements: dict[str, ToolsetAnnounced]) -> list[str]:
    """What stands between the app and its runs, in lines to show: toolsets not announced, and
    agents naming tools no toolset announced (a run of theirs would fail with `missing_tool`)."""
    late = [each.name for each in app.toolsets if each.name not in announcements]
    problems = [f"not announced (its executor is still starting?): {name}" for name in late]
    if not late:
        tools = [tool.name for announcement in announcements.values() for tool in announcement.tools]
        problems += [
            f"agent {agent!r} names tools no toolset announced: {', '.join(missing)}"
            for agent, missing in app.unserved_tools(tools).items()
        ]
    return problems


async def publish_agents(kafka: KafkaSettings, app: App) -> None:
    """Publish the app's agents on `agents.registry` (every planner follows it); CliError if refused."""
    from quipu.services.domain.agent_publisher import publish_agents as publish  # noqa: PLC0415

    try:
        await publish(kafka, app.agents, client_id="quipu-up")
    except PublishError as error:
        raise CliError(f"the app's agents were not published: {error}") from error


@contextlib.asynccontextmanager
async def app_served(connections: Connections, app: App, *, ready_s: float = 60.0) -> AsyncIterator[None]:
    """Serve `app` in this process beside services already running there (the demo, a test): its
    toolsets' topics created, its agents published, an executor started for each toolset and
    announced; they are stopped on exit. CliError when a toolset is not announced within `ready_s`."""
    from quipu.deploy.local.stack import create_topics  # noqa: PLC0415 - the embedded stack only

    kafka = connections.kafka
    await create_topics(kafka.bootstrap, kafka.topic_prefix, toolsets=[each.name for each in app.toolsets])
    await publish_agents(kafka, app)
    async with contextlib.AsyncExitStack() as running:
        for toolset in app.toolsets:
            executor = toolset_definition(toolset).app(connections)
            await executor.start()
            running.push_async_callback(executor.stop)
        problems = readiness(app, await announced(kafka, [each.name for each in app.toolsets], ready_s))
        if problems:
            raise CliError("; ".join(problems))
        yield
