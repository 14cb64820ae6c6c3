"""What a tool executor process logs (JSON lines): the partitions it holds, the calls it answered;
and waiting until copies of one executor have split their topic's partitions between them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.timing import scaled


class ExecutorLog:
    """The log file of one executor process whose calls consumer is named `consumer`
    (`<group> <topic>`, e.g. `tool-executor tools.calls`)."""

    def __init__(self, path: Path, consumer: str, running: Callable[[], bool]) -> None:
        self.path = path
        self.consumer = consumer
        self.running = running

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines logged so far (anything else is skipped)."""
        if not self.path.exists():
            return []
        lines = []
        for raw in self.path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue
        return lines

    def assignment(self) -> set[int]:
        """The partitions its calls consumer was assigned last."""
        assigned = [
            line
            for line in self.lines()
            if line.get("event") == "partitions assigned" and line.get("consumer") == self.consumer
        ]
        return set(assigned[-1]["partitions"]) if assigned else set()

    def completed(self) -> list[str]:
        """tool_use ids it logged as answered."""
        return [line["tool_use_id"] for line in self.lines() if line.get("event") == "tool call completed"]

    def tail(self) -> str:
        return self.path.read_text(errors="replace")[-3000:] if self.path.exists() else "(no log)"


async def until_split(logs: Sequence[ExecutorLog], partitions: set[int], within: float) -> None:
    """Wait until each process holds some of `partitions` and together they hold each exactly once."""
    deadline = time.monotonic() + scaled(within)
    while True:
        held = [log.assignment() for log in logs]
        if all(held) and set.union(*held) == partitions and sum(map(len, held)) == len(partitions):
            return
        for log in logs:
            assert log.running(), f"an executor exited:\n{log.tail()}"
        if time.monotonic() > deadline:
            tails = "\n---\n".join(log.tail() for log in logs)
            raise AssertionError(f"the group did not settle within {scaled(within)} s: {held}\n{tails}")
        await asyncio.sleep(0.05)
