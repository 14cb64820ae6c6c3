"""`make demo`: a short conversation with an agent, live, on the embedded stack.

Starts the embedded broker and database and every consuming service of the catalog in this
process (the offline scripted model unless ANTHROPIC_API_KEY is set), then talks to the assistant
in one session: a tool call, an agent called as a tool (a child run), parallel tools, a question
back to the user that suspends the run and is answered by a continuation run, and a later turn
that uses what an earlier one stored. Then the user mentions something about themselves, the
recorder and fact extractor turn it into a curated fact, and a second session — a new
conversation — answers from that memory and says where the fact came from. Every phase, tool
call and streamed word is shown as it happens, read from `runs.events` exactly as `quipu run`
and the gateway's SSE stream read it.

Then a user's own project, `examples/supportdesk` (installed into `.venv` by `make install`),
is served on the same stack as `quipu up --app supportdesk.app:app` serves it: its agents published
on `agents.registry`, an executor for each of its toolsets (one an MCP server), its stand-in status
page started as its README says. The desk searches the help centre, opens a ticket (the ledger's
line is shown) and asks its status agent, a child run that waits on the slow status page.
Exits 0 only when every turn completed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from quipu.app import App, AppLoadError, load_app
from quipu.client import Client
from quipu.contracts.memory import MemoryScope
from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services import catalog
from quipu.services.cli.apps import BUILT_IN_APP, app_served, loaded, publish_agents
from quipu.services.cli.client import RunFollower, planner_diagnosis
from quipu.services.cli.launch import quipu_command
from quipu.services.cli.render import EventPrinter, count_by_status
from quipu.services.cli.settings import CliSettings
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.logging import configure_logging
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.run_events import RunEventReader, StartAt
from quipu.services.kit.settings import KafkaSettings, MongoSettings, ServiceSettings
from quipu.services.kit.store_client import KafkaStore

console = Console()

TURNS: list[tuple[str, Any]] = [
    ("calculate 6*7", None),
    ("ask the math_agent to calculate 12*12", None),
    ("note colour=blue; what time is it", None),
    ("confirm that you will remember my colour", "yes"),
    ("recall colour", None),
    ("by the way, my favourite colour is blue", None),
]
"""What the user says, and the answer given if the agent asks back."""

PRINCIPAL = "demo-user"

OWN_PROJECT = "supportdesk.app:app"
"""The user's own project the demo serves after its own conversation (examples/supportdesk)."""

OWN_TURNS: list[tuple[str, str]] = [
    ("desk", "search_articles about a late parcel"),
    ("desk", "open_ticket customer=ana@example.com: my parcel never arrived"),
    ("desk", "ask the status_agent if payments work"),
]
"""What a customer asks the support desk: (agent, text)."""


async def _turn(
    kafka: KafkaSettings, client: Client, session_id: str, text: str, answer: Any, agent_id: str = "assistant"
) -> bool:
    reader = RunEventReader(kafka, session_id=session_id, client_id="demo")
    await reader.start(start_at=StartAt.NOW)
    follower = RunFollower(
        reader, EventPrinter(console), quiet_diagnosis=planner_diagnosis(kafka, CliSettings())
    )
    try:
        run_id = await client.run(text, session_id=session_id, agent_id=agent_id)
        while True:
            end = await follower.until_closed(run_id, timeout_s=60)
            follower.printer.end_inline()
            if end.phase != "suspended":
                return end.phase == "completed"
            await follower.questions(run_id, end.awaiting, await client.pending_inputs(run_id))
            follower.printer.end_inline()
            console.print(Text(f"  the user answers: {answer!r}", style="bold yellow"))
            run_id = await client.answer(run_id, answer)
    finally:
        follower.printer.end_inline()
        await reader.stop()


async def _second_session(kafka: KafkaSettings, client: Client, store: KafkaStore) -> bool:
    """A new session of the same person: the fact from the first one comes back, with its source."""
    memory = KafkaMemoryStore(store)
    scope = MemoryScope(principal_id=PRINCIPAL)
    for _ in range(100):  # the recorder, the extractor and the owner work behind the first session
        facts = await memory.list_facts(scope)
        if facts:
            break
        await asyncio.sleep(0.2)
    else:
        console.print(Text("no fact was extracted from the first session", style="bold red"))
        return False
    for fact in facts:
        console.print(Text(f"  memory: {fact.text!r} from session {fact.provenance.session_id}", style="dim"))
    session_id = f"demo-{uuid.uuid4().hex[:6]}"
    text = "what is my favourite colour?"
    console.print(Text(f"\n> user, in a new session {session_id}: {text}", style="bold"))
    return await _turn(kafka, client, session_id, text, None)


def _own_project() -> App | None:
    """The example project's App, or None when it is not installed (the demo then says how)."""
    try:
        return load_app(OWN_PROJECT)
    except AppLoadError:
        return None


@contextmanager
def _status_page() -> Iterator[str]:
    """The example's stand-in status page, started as its README says; yields its URL."""
    page = subprocess.Popen(
        [sys.executable, "-m", "supportdesk.status_page", "--port", "0", "--delay", "1.0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        found = re.search(r"status page on (http://\S+)", page.stdout.readline() if page.stdout else "")
        if found is None:
            raise RuntimeError("the status page of examples/supportdesk did not start")
        yield found.group(1)
    finally:
        page.terminate()
        page.wait()


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in this process's environment while the block runs: the desk's tools read their
    settings when called, and their executors run in this process."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _own_project_turns(connections: Connections, client: Client, own: App) -> bool:
    """The support desk's agents and tools at work, each turn live; then its ticket ledger."""
    agents = ", ".join(agent.id for agent in own.agents)
    toolsets = ", ".join(toolset.name for toolset in own.toolsets)
    console.rule(f"[bold]your own project: {OWN_PROJECT} (agents {agents}; toolsets {toolsets})")
    with tempfile.TemporaryDirectory() as folder, _status_page() as status_url:
        ledger = Path(folder) / "tickets.jsonl"
        with _environment({"SUPPORTDESK_STATUS_URL": status_url, "SUPPORTDESK_LEDGER": str(ledger)}):
            async with app_served(connections, own):
                session_id = f"desk-{uuid.uuid4().hex[:6]}"
                results = []
                for agent_id, text in OWN_TURNS:
                    console.print(Text(f"\n> customer, to {agent_id}: {text}", style="bold"))
                    results.append(await _turn(connections.kafka, client, session_id, text, None, agent_id))
        tickets = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    for ticket in tickets:
        console.print(Text(f"  ledger: {ticket['ticket_id']}, once for tool use {ticket['idempotency_key']}"))
    return all(results) and len(tickets) == 1


async def run_demo() -> bool:
    """Start everything, hold the conversation, stop everything; True when every turn completed."""
    console.rule("[bold]Quipu demo: an agent conversation on embedded Kafka (Tansu) + MongoDB (SecantusDB)")
    model = "Anthropic (ANTHROPIC_API_KEY is set)" if os.environ.get("ANTHROPIC_API_KEY") else "scripted"
    own = _own_project()
    async with EmbeddedStack() as stack:
        prefix = f"demo{uuid.uuid4().hex[:6]}."
        await create_topics(stack.bootstrap, prefix)
        kafka = stack.kafka_settings(topic_prefix=prefix)
        mongo = MongoSettings(uri=stack.mongo_uri, database=f"demo_{uuid.uuid4().hex[:6]}")
        connections = Connections(kafka, mongo)
        # The planner serves only registered agents: the built-in assistant's, as `quipu up` publishes them.
        await publish_agents(kafka, loaded(BUILT_IN_APP))
        services = [service.definition().app(connections) for service in catalog.CONSUMING]
        for service in services:
            await service.start()
        names = ", ".join(service.name for service in catalog.CONSUMING)
        console.print(f"stack up (kafka {stack.bootstrap}); {names}; {model} model")
        try:
            store = KafkaStore.for_service(kafka, CliSettings())
            async with store, Client(kafka, store=store, principal_id=PRINCIPAL, client_id="demo") as client:
                session_id = f"demo-{uuid.uuid4().hex[:6]}"
                results = []
                for text, answer in TURNS:
                    console.print(Text(f"\n> user: {text}", style="bold"))
                    results.append(await _turn(kafka, client, session_id, text, answer))
                results.append(await _second_session(kafka, client, store))
                runs = await store.list_runs_by_session(session_id, [])
                console.print(
                    Text(
                        f"\nsession {session_id}: {len(runs)} runs "
                        f"({count_by_status(run.status.value for run in runs)}), "
                        f"{sum(1 for run in runs if run.parent_run_id)} child run(s)",
                        style="dim",
                    )
                )
                if own is not None:
                    results.append(await _own_project_turns(connections, client, own))
        finally:
            for service in reversed(services):
                await service.stop()
    ok = all(results)
    console.rule("[bold green]demo finished" if ok else "[bold red]a turn did not complete")
    quipu = quipu_command()
    if own is None:
        console.print(f"(pip install -e examples/supportdesk to see your own project here: {OWN_PROJECT})")
    console.print(
        f'your turn: {quipu} up   (then, in another terminal: {quipu} run "calculate 6*7")', soft_wrap=True
    )
    return ok


def main() -> None:
    """Entry point of `python -m quipu.services.demo` (`make demo`)."""
    configure_logging(ServiceSettings(service_name="demo", log_level="WARNING"))
    sys.exit(0 if asyncio.run(run_demo()) else 1)


if __name__ == "__main__":
    main()
