"""`quipu agents apply|list|delete`: the agents on `agents.registry`, which every planner serves.

    quipu agents apply agents.yaml          # or agents.toml, or mypkg.agents:team (module:attr)
    quipu agents list                       # what the registry holds
    quipu agents delete forecaster          # runs for it are refused from then on

A file holds one agent, a list of them, or a list under `agents` (see `quipu.agents`); applying it
again is harmless (the same definition publishes the same event id). The stack is found as every
client command finds it (QUIPU_KAFKA_*, else a running `quipu up`). Like every command, what it
does is imported when it runs.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

agents_app = typer.Typer(
    help="Publish, list and remove agents (every planner serves them at once).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@agents_app.command("apply")
def apply(
    source: Annotated[
        str, typer.Argument(help="A .yaml, .yml or .toml file, or module:attr (an Agent, a list, an App).")
    ],
) -> None:
    """Define (or redefine) the agents in SOURCE on agents.registry."""
    from quipu.agents import AgentFileError, load_agents  # noqa: PLC0415 - not for --help
    from quipu.services.cli.output import console, fail  # noqa: PLC0415
    from quipu.services.cli.state import CLIENT_ID, client_settings  # noqa: PLC0415
    from quipu.services.domain.agent_publisher import publish_agents  # noqa: PLC0415
    from quipu.services.kit.publishing import PublishError  # noqa: PLC0415

    try:
        agents = load_agents(source)
    except AgentFileError as error:
        fail(str(error))
    kafka = client_settings()
    try:
        asyncio.run(publish_agents(kafka, agents, client_id=CLIENT_ID))
    except PublishError as error:
        fail(f"the agents were not published: {error}")
    console.print(
        f"applied {len(agents)} agent(s): {', '.join(agent.id for agent in agents)}", soft_wrap=True
    )


@agents_app.command("list")
def list_agents() -> None:
    """The agents agents.registry holds (not the planner's built-in ones)."""
    from rich.table import Table  # noqa: PLC0415

    from quipu.services.cli.output import console, fail, warn  # noqa: PLC0415
    from quipu.services.cli.state import CLIENT_ID, client_settings  # noqa: PLC0415
    from quipu.services.domain.agent_publisher import registered_agents  # noqa: PLC0415
    from quipu.services.kit.topic_replay import TopicMissingError  # noqa: PLC0415

    kafka = client_settings()
    try:
        agents, skipped = asyncio.run(registered_agents(kafka, client_id=CLIENT_ID))
    except (TopicMissingError, TimeoutError) as error:
        fail(str(error))
    if skipped:
        warn(f"{skipped} record(s) of agents.registry skipped: not a servable agent entry")
    table = Table("agent", "tools", "model", "description")
    for agent_id in agents.registered():
        agent = agents.get_agent(agent_id)
        table.add_row(agent_id, ", ".join(agent.tools), agent.model or "(default)", agent.description)
    console.print(table if agents.registered() else "no agent is registered")


@agents_app.command("delete")
def delete(agent_ids: Annotated[list[str], typer.Argument(help="Ids of the agents to remove.")]) -> None:
    """Remove agents from agents.registry: runs for them are refused from then on."""
    from quipu.services.cli.output import console, fail  # noqa: PLC0415
    from quipu.services.cli.state import CLIENT_ID, client_settings  # noqa: PLC0415
    from quipu.services.domain.agent_publisher import remove_agents  # noqa: PLC0415
    from quipu.services.kit.publishing import PublishError  # noqa: PLC0415

    kafka = client_settings()
    try:
        asyncio.run(remove_agents(kafka, agent_ids, client_id=CLIENT_ID))
    except PublishError as error:
        fail(f"the removals were not published: {error}")
    console.print(f"removed {len(agent_ids)} agent(s): {', '.join(agent_ids)}", soft_wrap=True)
