"""How `quipu` shows things: run events as they arrive, runs, transcripts, sessions.

Lines that carry an id are printed without hard wrapping (`soft_wrap`), and table columns of ids
are as wide as their longest id, so an id is never cut or split on a narrow terminal and can be
copied whole.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from quipu.contracts.errors import ErrorCode
from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
from quipu.contracts.memory import Fact
from quipu.contracts.store import RunMeta, Session, SessionOwner
from quipu.contracts.transcript import Message, message_to_wire
from quipu.contracts.wire import format_timestamp


def compact(value: Any, limit: int = 160) -> str:
    """`value` as one line of JSON, cut at `limit` characters."""
    return _cut(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


PREVIEW_WIDTH = 80
"""How many characters of a tool's result a live `tool_end` line shows."""


def preview(value: Any, limit: int = PREVIEW_WIDTH) -> str:
    """`value` on one line (text as is, anything else as compact JSON), cut with `…` at `limit`."""
    if not isinstance(value, str):
        return compact(value, limit)
    return _cut(" ".join(value.split()), limit)


def tool_end_line(payload: dict[str, Any]) -> Text:
    """`⚙ calculator ok 12 ms → 42`: which tool, how it ended, how long it took, what it returned."""
    failed = bool(payload.get("is_error"))
    line = Text(f"⚙ {payload.get('tool_name') or '?'} ", style="cyan")
    line.append("error" if failed else "ok", style="red" if failed else "green")
    duration = payload.get("duration_ms")
    if isinstance(duration, int | float):
        line.append(f" {duration:,.0f} ms")
    if payload.get("awaiting"):
        line.append(" · waits for an answer")
    elif "result" in payload:
        result = payload["result"]
        if isinstance(result, dict) and result.get("omitted"):  # too big for an event: its cut JSON
            result = result.get("preview", "")
        line.append(f" → {preview(result)}", style="dim")
    return line


def prompt_of(event: RunEvent) -> str:
    """What an `await_*` event asks."""
    payload = event.payload
    for key in ("prompt", "question", "message", "text"):
        if isinstance(payload.get(key), str) and payload[key]:
            return str(payload[key])
    return compact(payload)


def count_by_status(statuses: Iterable[str]) -> str:
    """`7 completed, 1 suspended`: how many of each, most frequent first."""
    counts = collections.Counter(statuses)
    return ", ".join(
        f"{count} {status}" for status, count in sorted(counts.items(), key=lambda i: (-i[1], i[0]))
    )


@dataclass
class EventPrinter:
    """Renders run events as they arrive; streamed reply text is written inline."""

    out: Console
    _inline: bool = False
    _streamed: set[str] = field(default_factory=set)  # runs whose reply text arrived as deltas
    # Phase changes come from the owner, deltas from the planner: one may land mid-sentence.
    _deferred: list[Text] = field(default_factory=list)
    _tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (input, output) so far

    def _line(self, text: Text) -> None:
        self.end_inline()
        self.out.print(text, soft_wrap=True)

    def end_inline(self) -> None:
        """Finish a line of streamed text, then print the phase changes held back meanwhile."""
        if self._inline:
            self.out.print()
            self._inline = False
        for text in self._deferred:
            self.out.print(text, soft_wrap=True)
        self._deferred.clear()

    def show(self, event: RunEvent) -> None:
        """Print one event."""
        kind, payload = event.type, event.payload
        if kind is StreamEventType.ASSISTANT_REPLY:
            chunk = payload.get("text", payload.get("delta", ""))
            if isinstance(chunk, str) and chunk:
                self.out.print(Text(chunk), end="", soft_wrap=True)
                self._inline = True
                self._streamed.add(event.run_id)
        elif kind is StreamEventType.ASSISTANT_TURN:
            self._assistant_turn(event)
        elif kind is StreamEventType.WORKFLOW:
            self._workflow(event.run_id, payload)
        elif kind is StreamEventType.USAGE:
            self._count_tokens(event.run_id, payload)
        elif kind.value.startswith("await_"):
            self._line(Text(f"? {prompt_of(event)}", style="bold yellow"))
        elif kind is StreamEventType.CHILD_RUN_LINKED:
            self._line(
                Text(
                    f"↳ {payload.get('tool_name', '?')}: child run {payload.get('child_run_id', '?')} "
                    f"({payload.get('child_agent_id', '?')})",
                    style="cyan",
                )
            )
        elif kind is StreamEventType.TOOL_END:
            self._line(tool_end_line(payload))
        elif kind in (StreamEventType.TOOL_START, StreamEventType.TOOL_UPDATE):
            name = payload.get("tool_name") or payload.get("name") or ""
            self._line(Text(f"⚙ {kind.value} {name} {compact(payload)}", style="cyan"))
        elif kind is StreamEventType.RUN_STREAM_END:
            self.end_inline()
        else:
            self._line(Text(f"· {kind.value} {compact(payload)}", style="dim"))

    def _assistant_turn(self, event: RunEvent) -> None:
        message = event.payload.get("message")
        parts = message.get("parts", []) if isinstance(message, dict) else []
        streamed = event.run_id in self._streamed
        self._streamed.discard(event.run_id)  # the next step streams its own text
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("kind") == "text" and not streamed and part.get("text"):
                self._line(Text(str(part["text"])))
            elif part.get("kind") == "tool_use":
                self._line(Text(f"→ {part.get('name', '?')} {compact(part.get('input'))}", style="cyan"))
        self.end_inline()

    def _count_tokens(self, run_id: str, usage: dict[str, Any]) -> None:
        seen_in, seen_out = self._tokens.get(run_id, (0, 0))
        taken, given = usage.get("input_tokens"), usage.get("output_tokens")
        if isinstance(taken, int) and isinstance(given, int):
            self._tokens[run_id] = (seen_in + taken, seen_out + given)

    def _workflow(self, run_id: str, payload: dict[str, Any]) -> None:
        phase = str(payload.get("phase", ""))
        failure = payload.get("failure") or {}
        reason = (payload.get("cancellation") or {}).get("reason", "")
        if phase == RunPhase.COMPLETED.value:
            self._closing_line(run_id, Text("✓ completed", style="bold green"))
        elif phase == RunPhase.FAILED.value and failure.get("kind") == ErrorCode.SESSION_PRINCIPAL_MISMATCH:
            # The planner refused the turn before any model call; whose session it is stays unsaid.
            refused = "✗ refused: this session belongs to another principal; pass its owner's --principal"
            self._closing_line(
                run_id, Text(f"{refused} (or leave out --session to start a new one)", style="bold red")
            )
        elif phase == RunPhase.FAILED.value:
            failed = f"✗ failed: {failure.get('message', '')}".rstrip(": ")
            self._closing_line(run_id, Text(failed, style="bold red"))
        elif phase == RunPhase.CANCELED.value:
            self._closing_line(
                run_id, Text(f"✗ canceled{f' ({reason})' if reason else ''}", style="bold yellow")
            )
        elif phase == RunPhase.SUSPENDED.value:
            self._closing_line(run_id, Text("⏸ waiting for an answer", style="bold yellow"))
        elif self._inline:
            self._deferred.append(Text(f"· {phase}", style="dim italic"))
        else:
            self._line(Text(f"· {phase}", style="dim italic"))

    def _closing_line(self, run_id: str, line: Text) -> None:
        """The run's end, with the tokens its model calls took when their usage was streamed."""
        if run_id in self._tokens:
            taken, given = self._tokens.pop(run_id)
            line.append(f"  {taken:,} tokens in, {given:,} out", style="dim")
        self._line(line)


def meta_lines(meta: RunMeta) -> Group:
    """A run's metadata, one `name  value` line each, ids whole."""
    values = {
        name: value if isinstance(value, str) else compact(value)
        for name, value in meta.model_dump(mode="json").items()
        if value not in ("", {}, None)
    }
    width = max(map(len, values), default=0)
    return Group(*(Text.assemble((name.ljust(width), "bold"), "  ", value) for name, value in values.items()))


def message_panel(message: Message) -> Panel:
    """One transcript message: its parts in order, tool traffic in colour."""
    lines: list[Text] = []
    for part in message_to_wire(message)["parts"]:
        kind = part.get("kind")
        if kind == "text":
            lines.append(Text(str(part.get("text", ""))))
        elif kind == "thinking":
            lines.append(Text("(thinking)", style="dim italic"))
        elif kind == "tool_use":
            lines.append(Text(f"→ {part.get('name')} {compact(part.get('input'))}", style="cyan"))
        elif kind == "tool_result":
            style = "red" if part.get("is_error") else "green"
            lines.append(Text(f"← {part.get('tool_use_id')}: {compact(part.get('content'))}", style=style))
        else:
            lines.append(Text(f"[{kind}]", style="dim"))
    colour = {"user": "blue", "assistant": "green"}.get(message.role, "white")
    return Panel(Group(*lines), title=message.role, title_align="left", border_style=colour)


def session_line(session: Session) -> Text:
    """`session ID: status since WHEN`."""
    when = format_timestamp(session.ended_at or session.created_at)
    return Text(f"session {session.session_id}: {session.status.value} since {when}")


def runs_table(runs: list[RunMeta]) -> Table:
    """A session's runs; the run column is as wide as its longest id, so no id is cut."""
    table = Table(title=count_by_status(meta.status.value for meta in runs), title_justify="left")
    table.add_column("run", no_wrap=True, min_width=max((len(meta.run_id) for meta in runs), default=3))
    for name in ("agent", "status", "started"):
        table.add_column(name)
    for meta in runs:
        table.add_row(meta.run_id, meta.agent_id, meta.status.value, format_timestamp(meta.started_at))
    return table


FACTS_OUTLIVE_SESSIONS = "facts stay in memory after the session they came from is purged"
"""Why a fact can name a session that no longer exists."""


def fact_lines(fact: Fact, *, session_purged: bool) -> list[Text]:
    """A fact, then where it came from (marked when that session was purged)."""
    session = fact.provenance.session_id + (" (purged)" if session_purged else "")
    where = f"session {session}, turn {fact.provenance.turn_id}"
    owner = f"agent {fact.scope.agent_id} · " if fact.scope.agent_id else ""
    updated = format_timestamp(fact.updated_at)
    return [
        Text.assemble((fact.fact_id, "bold"), f"  {fact.text}"),
        Text(f"    {owner}v{fact.version} · from {where} · updated {updated}", style="dim"),
    ]


def facts_outlive_purge(owner: SessionOwner | None) -> Text:
    """What a purge leaves: the facts learned in the session, and the commands that show or remove them."""
    who = owner.principal_id if owner else "PRINCIPAL"
    whose = f"{owner.principal_id}'s" if owner else "the person's"
    where = f" --tenant {owner.tenant_id}" if owner and owner.tenant_id else ""
    return Text(
        f"facts learned in it stay in {whose} memory: `quipu memory list {who}{where}` shows them, "
        f"`quipu memory delete {who} FACT_ID{where}` removes one, `quipu memory forget {who}{where}` all",
        style="dim",
    )
