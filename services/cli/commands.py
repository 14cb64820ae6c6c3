"""The work of each client command (`run`, `answer`, `cancel`, `runs`, `sessions`, `memory`, `status`).

`quipu.services.cli` declares the commands and imports this module only when one of them runs, so that
`quipu --help` or a mistyped command does not load Kafka and pydantic models.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError
from rich.panel import Panel
from rich.text import Text

from quipu.contracts.errors import ErrorCode, StoreError
from quipu.contracts.memory import MemoryScope
from quipu.contracts.store import CancellationReason, SessionOwner
from quipu.contracts.transcript import Message, TranscriptError
from quipu.contracts.wire import utc_now_ms
from quipu.services.cli.client import (
    connected,
    drive,
    one_line_error,
    run_command,
    store_client,
)
from quipu.services.cli.output import CliError, console
from quipu.services.cli.render import (
    FACTS_OUTLIVE_SESSIONS,
    fact_lines,
    facts_outlive_purge,
    message_panel,
    meta_lines,
    runs_table,
    session_line,
)
from quipu.services.cli.settings import CliSettings
from quipu.services.cli.state import adopt_key_channel, client_settings, client_target
from quipu.services.domain.memory.reindex import Principal, principals_from_changes, reindex
from quipu.services.domain.run_requests import Turn
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.store_client import KafkaStore


def _cli_settings() -> CliSettings:
    adopt_key_channel()  # before any key setting is read
    try:
        return CliSettings()
    except ValidationError as error:
        raise typer.BadParameter(one_line_error(error), param_hint="QUIPU_CLI_*") from error


def run(
    text: str, *, session: str | None, agent: str, principal: str, timeout: float, interactive: bool
) -> int:
    """Send a turn and follow its run; the exit code."""
    settings = _cli_settings()
    kafka = client_settings()
    session_id = session or f"cli-{os.urandom(6).hex()}"
    try:
        body = Turn(agent_id=agent, text=text, session_id=session_id)
    except ValidationError as error:
        raise typer.BadParameter(
            f"{one_line_error(error)} (the message has {len(text):,} characters)", param_hint="MESSAGE"
        ) from error

    async def work() -> int:
        async with connected(kafka, settings) as client:
            await client.open_session(session_id)
            if session is None:
                console.print(
                    Text(f"new session {session_id} (continue it with --session {session_id})", style="dim"),
                    soft_wrap=True,
                )
            request = functools.partial(
                client.run, body.text, agent_id=body.agent_id, session_id=session_id, principal_id=principal
            )
            return await drive(
                kafka,
                client,
                session_id,
                request,
                interactive=interactive,
                timeout_s=timeout,
                settings=settings,
            )

    code: int = run_command(work, kafka, settings)
    return code


def answer(run_id: str, value: Any, *, follow: bool, timeout: float, interactive: bool) -> int:
    """Answer a suspended run, following its continuation unless told not to; the exit code."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> int:
        async with connected(kafka, settings) as client:
            session_id = (await client.status(run_id)).session_id
            if follow and session_id:  # a one-shot run has no continuation: answer() says so below
                request = functools.partial(client.answer, run_id, value)
                return await drive(
                    kafka,
                    client,
                    session_id,
                    request,
                    interactive=interactive,
                    timeout_s=timeout,
                    settings=settings,
                )
            continuation = await client.answer(run_id, value)
            console.print(f"continuation run {continuation} requested", soft_wrap=True)
            return 0

    code: int = run_command(work, kafka, settings)
    return code


def cancel(run_id: str, reason: str) -> None:
    """Ask for a run to be canceled."""
    try:
        why = CancellationReason(reason)
    except ValueError as error:
        choices = ", ".join(member.value for member in CancellationReason)
        raise typer.BadParameter(f"{reason!r} is not one of {choices}", param_hint="--reason") from error
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with connected(kafka, settings) as client:
            await client.cancel(run_id, why)
        console.print(f"cancellation of {run_id} requested", soft_wrap=True)

    run_command(work, kafka, settings)


def show_run(run_id: str) -> None:
    """A run's metadata and transcript."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        from quipu.services.domain.transcript import build_messages_from_run_log  # noqa: PLC0415 - only here

        async with store_client(kafka, settings) as store:
            meta = await store.load_run(run_id)
            try:
                messages: list[Message] | str = await build_messages_from_run_log(store, run_id)
            except TranscriptError as error:
                messages = str(error)
        console.print(Panel(meta_lines(meta), title=f"run {run_id}", title_align="left"))
        if isinstance(messages, str):
            console.print(Text(f"no transcript: {messages}", style="dim"))
            return
        for message in messages:
            console.print(message_panel(message))

    run_command(work, kafka, settings)


def show_session(session_id: str) -> None:
    """A session's status and its runs, counted per status."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with store_client(kafka, settings) as store:
            session = await store.load_session_status(session_id)
            runs = await store.list_runs_by_session(session_id, [])
        console.print(session_line(session), soft_wrap=True)
        if runs:
            console.print(runs_table(runs))

    run_command(work, kafka, settings)


def end_session(session_id: str) -> None:
    """End a session."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with store_client(kafka, settings) as store:
            session = await store.end_session(session_id, utc_now_ms())
        console.print(session_line(session), soft_wrap=True)

    run_command(work, kafka, settings)


def purge_session(session_id: str) -> None:
    """Purge an ended session."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with store_client(kafka, settings) as store:
            owner = await _owner(store, session_id)
            await store.purge_session(session_id)
        console.print(f"session {session_id}: purged", soft_wrap=True)
        console.print(facts_outlive_purge(owner), soft_wrap=True)

    run_command(work, kafka, settings)


async def _owner(store: KafkaStore, session_id: str) -> SessionOwner | None:
    """Who a session belongs to: the owner recorded at its creation, else its history's principal;
    None when unknown (anonymous, or no turn yet). Only the purge's closing hint depends on it."""
    with contextlib.suppress(StoreError):
        session = await store.load_session_status(session_id)
        if session.owner is not None:
            return session.owner
        for row in await KafkaMemoryStore(store).history_tail(session_id, 1):
            return SessionOwner(tenant_id="", principal_id=row.principal_id) if row.principal_id else None
    return None


async def _purged(store: KafkaStore, session_ids: set[str]) -> set[str]:
    """Which of `session_ids` were purged (one status read each)."""

    async def purged(session_id: str) -> bool:
        try:
            await store.load_session_status(session_id)
        except StoreError as error:
            return error.code is ErrorCode.SESSION_PURGED
        return False

    found = await asyncio.gather(*(purged(session_id) for session_id in sorted(session_ids)))
    return {session_id for session_id, gone in zip(sorted(session_ids), found, strict=True) if gone}


def _memory(kafka: Any, settings: CliSettings) -> KafkaMemoryStore:
    return KafkaMemoryStore.for_service(kafka, settings)


def memory_list(principal: str, tenant: str, agent: str) -> None:
    """The person's current facts."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with store_client(kafka, settings) as store:
            facts = await KafkaMemoryStore(store).list_facts(
                MemoryScope(tenant_id=tenant, principal_id=principal, agent_id=agent)
            )
            purged = await _purged(store, {fact.provenance.session_id for fact in facts} - {""})
        if not facts:
            console.print(Text(f"nothing remembered about {principal}", style="dim"))
            return
        for fact in facts:
            for line in fact_lines(fact, session_purged=fact.provenance.session_id in purged):
                console.print(line, soft_wrap=True)
        console.print(
            Text(
                f"{FACTS_OUTLIVE_SESSIONS}; remove one with `quipu memory delete {principal} FACT_ID`",
                style="dim",
            ),
            soft_wrap=True,
        )

    run_command(work, kafka, settings)


def memory_delete(principal: str, fact_id: str, tenant: str) -> None:
    """Delete one fact."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        scope = MemoryScope(tenant_id=tenant, principal_id=principal)
        async with _memory(kafka, settings) as memory:
            await memory.delete_fact(scope, fact_id)
            with contextlib.suppress(StoreError):  # derived: the enricher or a reindex drops it too
                await memory.delete_index_entries(scope, [fact_id])
        console.print(f"fact {fact_id}: deleted", soft_wrap=True)

    run_command(work, kafka, settings)


def memory_export(principal: str, tenant: str, output: Path | None) -> None:
    """Everything remembered about the person, as JSON."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> str:
        async with _memory(kafka, settings) as memory:
            exported = await memory.export_principal(MemoryScope(tenant_id=tenant, principal_id=principal))
        return exported.model_dump_json(indent=2)

    text: str = run_command(work, kafka, settings)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n")
        console.print(f"written to {output}")


def memory_forget(principal: str, tenant: str) -> None:
    """Forget the person for good."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        async with _memory(kafka, settings) as memory:
            erased = await memory.forget_principal(tenant, principal)
        console.print(f"{principal}: forgotten ({erased} documents erased)")

    run_command(work, kafka, settings)


def memory_reindex(principal: str | None, tenant: str | None) -> None:
    """Rebuild the derived retrieval index."""
    settings = _cli_settings()
    kafka = client_settings()

    async def work() -> None:
        if principal is not None:
            principals = [Principal(tenant_id=tenant or "", principal_id=principal)]
        else:
            try:
                principals = await principals_from_changes(kafka, tenant_id=tenant)
            except TimeoutError as error:
                raise CliError(str(error)) from error
        async with _memory(kafka, settings) as memory:
            report = await reindex(memory, principals)
        console.print(
            f"reindexed {report.principals} principal(s): {report.indexed} entries written, "
            f"{report.dropped} dropped"
        )

    run_command(work, kafka, settings)


def status() -> None:
    """What runs (from `quipu up`'s state) and each consumer group's members and lag."""
    from quipu.services.cli.apps import toolset_consumers  # noqa: PLC0415
    from quipu.services.cli.status import CONSUMERS, lag_table, measure, services_table  # noqa: PLC0415

    settings = _cli_settings()
    target = client_target()
    console.print(Text(f"stack: {target.source} · kafka {target.kafka.bootstrap}"), soft_wrap=True)
    if target.state is not None:
        mode = target.state.get("mode", "?")
        console.print(Text(f"services ({mode}; gateway {target.state.get('gateway_url') or '-'})"))
        console.print(services_table(target.state))
    else:
        console.print(Text("services: not started by `quipu up` (QUIPU_KAFKA_BOOTSTRAP is set)", style="dim"))

    consumers = CONSUMERS + toolset_consumers(target.state)

    async def work() -> Any:
        return await measure(target.kafka, consumers, timeout_s=settings.status_timeout_s)

    measured = run_command(work, target.kafka, settings)
    console.print(Text("consumer lag = fetch high-watermark - committed offset, summed over partitions"))
    console.print(lag_table(measured))
