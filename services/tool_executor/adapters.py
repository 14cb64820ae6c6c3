"""The record of results given, in this process.

A redelivered call finds its result in the record and is not run again, and the planner never
re-requests a tool use it already has a result for. It is not shared between executor copies or
kept across restarts: a tool whose effects must happen once keys them by the idempotency key.
"""

from __future__ import annotations

from collections import OrderedDict

from quipu.contracts.tools import ToolCallCompleted


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
