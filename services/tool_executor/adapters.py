"""The I/O behind the tools: the clock, the notes store, and the record of results given.

The notes store and the record of results live in this process. That is enough for the demo
tools: a redelivered call finds its result in the record and is not run again, and the planner
never re-requests a tool use it already has a result for. It is not shared between executor
copies or kept across restarts: notes written through one copy are not seen by another. A tool
whose effects must outlive the process writes them through the storage owner, keyed by
(run id, tool_use id).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from quipu.contracts.tools import ToolCallCompleted
from quipu.services.domain.shipped_tools import (
    CURRENT_TIME,
    NOTES,
    CurrentTimeArguments,
    NotesArguments,
    ask_user,
    calculator,
)
from quipu.tools import ToolContext, ToolError, ToolImplementation

Clock = Callable[[], datetime]
"""The current time, timezone-aware."""


def system_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def current_time_tool(clock: Clock = system_clock) -> ToolImplementation:
    """The `current_time` tool, reading `clock`."""

    async def current_time(arguments: CurrentTimeArguments, _context: ToolContext) -> dict[str, Any]:
        name = arguments.timezone or "UTC"
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Madrid'") from None
        now = clock().astimezone(zone)
        return {
            "timezone": name,
            "iso": now.isoformat(timespec="seconds"),
            "date": now.date().isoformat(),
            "time": now.strftime("%H:%M:%S"),
            "weekday": now.strftime("%A"),
            "utc_offset": now.strftime("%z"),
        }

    return current_time


NOTES_PER_SCOPE = 200
"""Most notes one person (or session) keeps."""


class NotesStore:
    """Notes by scope and key, in process (see the module docstring for what that means)."""

    def __init__(self, max_notes: int = NOTES_PER_SCOPE) -> None:
        self._max_notes = max_notes
        self._notes: dict[tuple[str, str], dict[str, str]] = {}

    @staticmethod
    def scope(context: ToolContext) -> tuple[str, str]:
        """Whose notebook a call reads: the person's, else the session's, else the run's; per tenant."""
        if context.principal_id:
            owner = f"principal:{context.principal_id}"
        elif context.session_id:
            owner = f"session:{context.session_id}"
        else:
            owner = f"run:{context.run_id}"
        return (context.tenant_id, owner)

    def get(self, scope: tuple[str, str], key: str) -> str | None:
        """The note under `key`, if any."""
        return self._notes.get(scope, {}).get(key)

    def set(self, scope: tuple[str, str], key: str, value: str) -> None:
        """Save a note; raises ToolError when the notebook is full."""
        notes = self._notes.setdefault(scope, {})
        if key not in notes and len(notes) >= self._max_notes:
            raise ToolError(f"the notebook is full ({self._max_notes} notes); overwrite an existing key")
        notes[key] = value

    def keys(self, scope: tuple[str, str]) -> list[str]:
        """Every key, sorted."""
        return sorted(self._notes.get(scope, {}))


def notes_tool(store: NotesStore) -> ToolImplementation:
    """The `notes` tool over `store`."""

    async def notes(arguments: NotesArguments, context: ToolContext) -> dict[str, Any]:
        scope = NotesStore.scope(context)
        if arguments.action == "list":
            return {"keys": store.keys(scope)}
        key = arguments.key or ""
        if arguments.action == "set":
            store.set(scope, key, arguments.value or "")
            return {"key": key, "saved": True}
        value = store.get(scope, key)
        return {"key": key, "found": value is not None, "value": value}

    return notes


class RememberedResults:
    """The last `capacity` results by (run id, tool_use id), in process (`logic.CompletedCalls`)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._results: OrderedDict[tuple[str, str], ToolCallCompleted] = OrderedDict()

    def get(self, run_id: str, tool_use_id: str) -> ToolCallCompleted | None:
        """The result given for this tool use, if remembered."""
        return self._results.get((run_id, tool_use_id))

    def put(self, result: ToolCallCompleted) -> None:
        """Remember a result, forgetting the oldest beyond capacity."""
        key = (result.run_id, result.tool_use_id)
        self._results[key] = result
        self._results.move_to_end(key)
        while len(self._results) > self._capacity:
            self._results.popitem(last=False)

    def __len__(self) -> int:
        return len(self._results)


def default_implementations(
    clock: Clock = system_clock, notes: NotesStore | None = None
) -> dict[str, ToolImplementation]:
    """The implementations of the shipped tools (`quipu.services.domain.shipped_tools.DEFAULT_TOOLS`)."""
    return {
        CURRENT_TIME: current_time_tool(clock),
        calculator.name: calculator.run,
        NOTES: notes_tool(notes or NotesStore()),
        ask_user.name: ask_user.run,
    }
