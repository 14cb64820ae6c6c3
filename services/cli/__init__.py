"""`quipu`: start the runtime, talk to agents, inspect and administer sessions and runs.

    quipu up                               # embedded broker + database + every service, one process
    quipu up --processes                   # one supervised process per service (restarted when it dies)
    quipu status                           # what runs, and how far each consumer group lags
    quipu run "what time is it?"           # a turn, shown live until the run ends
    quipu run - < prompt.txt               # the message from stdin (or --file prompt.txt)
    quipu answer RUN_ID "Lima"             # answer a suspended run, then follow its continuation
    quipu runs show RUN_ID                 # a run's state and transcript
    quipu sessions end|purge|show ID       # session administration
    quipu memory list|export|forget P      # what Quipu remembers about a person; delete P FACT; reindex
    quipu keys create|list|revoke          # the gateway's API keys (services/cli/keys.py)
    quipu agents apply|list|delete         # your agents on agents.registry (services/cli/agents.py)
    quipu serve planner                    # one service alone, against QUIPU_KAFKA_* / QUIPU_MONGO_*
    quipu up --app mypkg.app:app           # your agents and toolsets too (quipu.App, quipu/app.py)
    quipu serve tools --app mypkg.app:app  # one toolset's executor (--toolset NAME); copies share calls

Client commands find Kafka in `QUIPU_KAFKA_*`, or else in the state file a running `quipu up`
writes (`QUIPU_STATE_FILE`, default `~/.cache/quipu/up.json`), and say on stderr which stack they
talk to. How long they wait for the store is `QUIPU_CLI_*` (services/cli/settings.py).

This module only declares the commands: each one imports what it does when it runs
(services/cli/commands.py, launch.py, status.py), so `quipu --help` starts fast.

Exit codes of `quipu run` and `quipu answer`: 0 the run completed; 1 it failed or was canceled, or
something went wrong; 3 it waits for an answer that could not be asked here (not a terminal).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="quipu",
    help="Quipu: a distributed runtime for AI agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help and errors: typer's rich formatting imports markdown-it
)
sessions_app = typer.Typer(help="Administer sessions.", no_args_is_help=True, rich_markup_mode=None)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(sessions_app, name="sessions")
app.add_typer(runs_app, name="runs")
memory_app = typer.Typer(
    help="See, export and delete what Quipu remembers about a person.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(memory_app, name="memory")
from quipu.services.cli.keys import keys_app  # noqa: E402 - declared in its own module, registered here

app.add_typer(keys_app, name="keys")
from quipu.services.cli.agents import agents_app  # noqa: E402 - declared in its own module, registered here

app.add_typer(agents_app, name="agents")

CANCELLATION_REASONS = ("user_requested", "engine_canceled")
"""What `quipu cancel --reason` accepts (`CancellationReason` without the store's own)."""


def _quiet_logging(verbose: bool = False) -> None:
    """Library logs only when they matter; QUIPU_LOG_LEVEL still wins."""
    import os  # noqa: PLC0415

    from quipu.services.kit.logging import configure_logging  # noqa: PLC0415 - not for --help
    from quipu.services.kit.settings import ServiceSettings  # noqa: PLC0415

    level = "INFO" if verbose else "WARNING"
    overrides: dict[str, Any] = {} if "QUIPU_LOG_LEVEL" in os.environ else {"log_level": level}
    configure_logging(ServiceSettings(service_name="quipu-cli", **overrides))


def _interactive(flag: bool | None) -> bool:
    from quipu.services.cli.output import console  # noqa: PLC0415

    return flag if flag is not None else sys.stdin.isatty() and console.is_terminal


# --- client commands --------------------------------------------------------------------------------

SessionOption = Annotated[
    str | None,
    typer.Option("--session", "-s", help="Session to talk in (created if new); default: a new one."),
]
AgentOption = Annotated[str, typer.Option("--agent", "-a", help="Agent that answers.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", min=1, help="Give up after this many seconds.")]
InteractiveOption = Annotated[
    bool | None,
    typer.Option(
        "--interactive/--no-interactive", help="Ask for answers on the terminal (default: when on a TTY)."
    ),
]


def message_text(message: str | None, file: Path | None) -> str:
    """The turn's text: the argument, stdin (`-`, or no argument with stdin not a terminal), or a file.

    A long prompt cannot be an argument (the system's argument list is limited), hence stdin and
    `--file`; one trailing newline (what `echo` and editors add) is dropped.
    """
    if message is not None and file is not None:
        raise typer.BadParameter("give the message or --file, not both", param_hint="MESSAGE")
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise typer.BadParameter(f"cannot read {file}: {error}", param_hint="--file") from error
    elif message == "-" or (message is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
    elif message is None:
        raise typer.BadParameter(
            "say something: MESSAGE, `-` for stdin, or --file PATH", param_hint="MESSAGE"
        )
    else:
        text = message
    text = text.removesuffix("\n")
    if not text.strip():
        raise typer.BadParameter("the message is empty", param_hint="MESSAGE")
    return text


@app.command()
def run(
    message: Annotated[
        str | None, typer.Argument(help="What you say to the agent; `-` reads it from stdin.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the message from this file.", dir_okay=False)
    ] = None,
    session: SessionOption = None,
    agent: AgentOption = "assistant",
    principal: Annotated[str, typer.Option("--principal", help="The person the agent acts for.")] = "",
    timeout: TimeoutOption = 300.0,
    interactive: InteractiveOption = None,
) -> None:
    """Send a message to an agent and show the run live: phases, tools, the streamed reply."""
    text = message_text(message, file)
    from quipu.services.cli import commands  # noqa: PLC0415 - the heavy part, only when it runs

    _quiet_logging()
    raise typer.Exit(
        commands.run(
            text,
            session=session,
            agent=agent,
            principal=principal,
            timeout=timeout,
            interactive=_interactive(interactive),
        )
    )


def parse_answer(text: str, as_json: bool) -> Any:
    """The answer as given, or decoded from JSON with `--json`."""
    if not as_json:
        return text
    try:
        return json.loads(text)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint="ANSWER") from error


@app.command()
def answer(
    run_id: Annotated[str, typer.Argument(help="The suspended run.")],
    text: Annotated[str, typer.Argument(help="Your answer; `-` reads it from stdin.")],
    as_json: Annotated[bool, typer.Option("--json", help="The answer is a JSON value.")] = False,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Show the continuation live.")] = True,
    timeout: TimeoutOption = 300.0,
    interactive: InteractiveOption = None,
) -> None:
    """Answer a suspended run: its continuation starts in the same session."""
    value = parse_answer(sys.stdin.read().removesuffix("\n") if text == "-" else text, as_json)
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    raise typer.Exit(
        commands.answer(run_id, value, follow=follow, timeout=timeout, interactive=_interactive(interactive))
    )


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.")],
    reason: Annotated[
        str, typer.Option(help=f"Why: {' or '.join(CANCELLATION_REASONS)}.")
    ] = CANCELLATION_REASONS[0],
) -> None:
    """Ask for a running run to be canceled."""
    if reason not in CANCELLATION_REASONS:
        raise typer.BadParameter(
            f"{reason!r} is not one of {', '.join(CANCELLATION_REASONS)}", param_hint="--reason"
        )
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.cancel(run_id, reason)


@app.command()
def status() -> None:
    """What runs (services, pids, restarts) and how far each consumer group lags."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.status()


@runs_app.command("show")
def runs_show(run_id: Annotated[str, typer.Argument(help="The run.")]) -> None:
    """A run's state and its transcript."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.show_run(run_id)


SessionArgument = Annotated[str, typer.Argument(help="The session.")]


@sessions_app.command("show")
def sessions_show(session_id: SessionArgument) -> None:
    """A session's status and its runs."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.show_session(session_id)


@sessions_app.command("end")
def sessions_end(session_id: SessionArgument) -> None:
    """End a session: running runs may finish; new runs stop at once."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.end_session(session_id)


@sessions_app.command("purge")
def sessions_purge(
    session_id: Annotated[str, typer.Argument(help="The session (ended, no run running).")],
) -> None:
    """Delete an ended session and all its runs for good; its id can never be used again."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.purge_session(session_id)


# --- memory -----------------------------------------------------------------------------------------

PrincipalArgument = Annotated[str, typer.Argument(help="The person (principal id).")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant of the principal.")]
MemoryAgentOption = Annotated[
    str, typer.Option("--agent", "-a", help="Only this agent's facts and the principal-wide ones.")
]


@memory_app.command("list")
def memory_list(
    principal: PrincipalArgument, tenant: TenantOption = "", agent: MemoryAgentOption = ""
) -> None:
    """The person's current facts, with the session and turn each came from."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.memory_list(principal, tenant, agent)


@memory_app.command("delete")
def memory_delete(
    principal: PrincipalArgument,
    fact_id: Annotated[str, typer.Argument(help="The fact.")],
    tenant: TenantOption = "",
) -> None:
    """Delete one fact: it leaves retrieval and future prompts at once (its wording stays in the audit)."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.memory_delete(principal, fact_id, tenant)


@memory_app.command("export")
def memory_export(
    principal: PrincipalArgument,
    tenant: TenantOption = "",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Everything remembered about the person (facts, previous versions, profile) as JSON."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.memory_export(principal, tenant, output)


@memory_app.command("forget")
def memory_forget(
    principal: PrincipalArgument,
    tenant: TenantOption = "",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Forget the person: facts, audit, profile, history, summaries and index entries, for good."""
    if not yes and not typer.confirm(f"Erase everything Quipu remembers about {principal}?"):
        raise typer.Exit(1)
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.memory_forget(principal, tenant)


@memory_app.command("reindex")
def memory_reindex(
    principal: Annotated[str | None, typer.Option("--principal", help="Only this person.")] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="Tenant (with --principal: default ''; else: every tenant)."),
    ] = None,
) -> None:
    """Rebuild the derived retrieval index from curated memory (the authority)."""
    from quipu.services.cli import commands  # noqa: PLC0415

    _quiet_logging()
    commands.memory_reindex(principal, tenant)


# --- running services -------------------------------------------------------------------------------


AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help=(
            "Your app: a quipu.App, a Toolset, an Agent or a list of them, e.g. mypkg.app:app "
            "(the module is looked for in the current directory first)."
        ),
    ),
]


@app.command()
def serve(
    service: Annotated[
        str,
        typer.Argument(
            help=(
                "tools (a toolset of --app), mcp (an MCP server as a toolset), or a service: "
                "storage-owner, planner, tool-executor, gateway, …"
            )
        ),
    ],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[-- COMMAND ARGS...]",
            help="mcp: the MCP server's command, after `--`; it is started as a subprocess (stdio).",
        ),
    ] = None,
    app_spec: AppOption = None,
    toolset: Annotated[
        str | None,
        typer.Option(
            "--toolset",
            metavar="NAME",
            help="tools: which toolset of --app (default: its only one). mcp: the toolset's name.",
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", metavar="URL", help="mcp: the server's streamable HTTP URL, e.g. http://host:8000/mcp."
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            metavar="'NAME: VALUE'",
            help="mcp with --url: sent with every request, e.g. 'X-Tenant: acme' (repeatable).",
        ),
    ] = None,
    bearer_token_env: Annotated[
        str,
        typer.Option(
            "--bearer-token-env",
            metavar="VARIABLE",
            help="mcp with --url: send `Authorization: Bearer <its value>` (never on the command line).",
        ),
    ] = "",
    bearer_token_file: Annotated[
        Path | None,
        typer.Option(
            "--bearer-token-file",
            metavar="FILE",
            help="mcp with --url: the same, the token read from FILE at every request (a mounted Secret).",
        ),
    ] = None,
    oauth_client_id: Annotated[
        str,
        typer.Option("--oauth-client-id", metavar="ID", help="mcp with --url: OAuth 2 client credentials."),
    ] = "",
    oauth_issuer: Annotated[
        str,
        typer.Option(
            "--oauth-issuer", metavar="URL", help="with --oauth-client-id: the authorization server."
        ),
    ] = "",
    oauth_client_secret_env: Annotated[
        str,
        typer.Option(
            "--oauth-client-secret-env",
            metavar="VARIABLE",
            help="with --oauth-client-id: where the secret is.",
        ),
    ] = "",
    oauth_client_secret_file: Annotated[
        Path | None,
        typer.Option(
            "--oauth-client-secret-file", metavar="FILE", help="with --oauth-client-id: or this file."
        ),
    ] = None,
    oauth_scope: Annotated[
        str,
        typer.Option("--oauth-scope", metavar="SCOPE", help="with --oauth-client-id: the scope to ask for."),
    ] = "",
    version: Annotated[str, typer.Option("--version", help="mcp: announced with its tools.")] = "1",
    server_log: Annotated[
        Path | None,
        typer.Option(
            "--server-log", metavar="FILE", help="mcp: append the server's stderr here (else dropped)."
        ),
    ] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", min=0.001, help="mcp: the deadline of one call, in seconds.")
    ] = 10.0,
) -> None:
    """Run one service alone against QUIPU_KAFKA_* (and QUIPU_MONGO_* for the owner).

    `quipu serve tools --app mypkg.app:app [--toolset NAME]` runs the executor of one toolset of
    your app on its own topic; `quipu serve mcp --toolset files -- python -m files_server` (or
    `--url http://host:8000/mcp`) serves an MCP server's tools as toolset `files`. Start as many
    copies as you like: they share the toolset's calls. Every other service needs no user code.
    """
    from quipu.services import catalog  # noqa: PLC0415 - not for --help
    from quipu.services.cli.output import CliError, fail  # noqa: PLC0415

    if service == "mcp":
        from quipu.services.cli import apps  # noqa: PLC0415

        if app_spec is not None:
            raise typer.BadParameter(
                "an MCP server is no Python code of yours: give --toolset NAME and -- COMMAND"
            )

        try:
            credentials = apps.mcp_credentials(
                bearer_token_env,
                bearer_token_file,
                apps.McpOAuthOptions(
                    oauth_client_id,
                    oauth_issuer,
                    oauth_client_secret_env,
                    oauth_client_secret_file,
                    oauth_scope,
                ),
            )
            apps.serve_mcp(
                toolset, url, command or [], version, timeout_s, server_log, header or [], credentials
            )
        except CliError as error:
            fail(str(error))
        return
    if command or url is not None:
        raise typer.BadParameter(f"{service} takes no command or --url; they go with `quipu serve mcp`")
    if service == "tools":
        from quipu.services.cli import apps  # noqa: PLC0415

        try:
            apps.serve_tools(app_spec, toolset)
        except CliError as error:
            fail(str(error))
        return
    if app_spec is not None or toolset is not None:
        raise typer.BadParameter(
            f"{service} needs no user code; --app and --toolset go with `quipu serve tools`",
            param_hint="--app",
        )
    try:
        name = catalog.named(service).name
    except KeyError:
        raise typer.BadParameter(
            f"unknown service {service!r}; one of: tools, {', '.join(catalog.NAMES)}", param_hint="SERVICE"
        ) from None
    from quipu.services.cli import launch  # noqa: PLC0415

    launch.serve(name)


@app.command()
def up(
    gateway_port: Annotated[
        int, typer.Option("--gateway-port", help="Port of the HTTP gateway; 0 picks a free one.")
    ] = 8080,
    processes: Annotated[
        bool,
        typer.Option("--processes", help="One supervised process per service (restarted when it exits)."),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
    app_spec: AppOption = None,
) -> None:
    """Start the embedded broker and database and every service; Ctrl-C stops them all.

    With `--app mypkg.app:app`, your agents and an executor for each of your toolsets too.
    """
    from quipu.services.cli import launch  # noqa: PLC0415
    from quipu.services.cli.output import CliError, fail  # noqa: PLC0415

    _quiet_logging(verbose)
    try:
        launch.up(gateway_port, processes, verbose, app_spec)
    except CliError as error:
        fail(str(error))


def main() -> None:
    """Entry point of `python -m quipu.services.cli`."""
    app()
