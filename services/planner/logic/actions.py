"""The next step of a run as a small typed value (`Action`), the trigger that asked for it, and
the messages the planner publishes (`Output`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from quipu.contracts.events import RunEvent
from quipu.contracts.runs import CancelRun, RunRequested, TurnCompleted
from quipu.contracts.store import Checkpoint, Record
from quipu.contracts.tools import ToolCallCompleted, ToolCallRequested
from quipu.contracts.transcript import ToolUsePart


@dataclass(frozen=True)
class Trigger:
    """The message that made the planner look at a run."""

    at: datetime
    """Its `occurred_at`: the timestamp of every record written in response to it."""
    event_id: str = ""
    result_for: str = ""
    """For a tool result: the tool use it answers (its group is already dispatched)."""


@dataclass(frozen=True)
class Wait:
    """Nothing to do until another message arrives."""

    why: str


@dataclass(frozen=True)
class Closed:
    """The run is closed; publish again what its end published (redelivery is harmless)."""

    outputs: list[Output]


@dataclass(frozen=True)
class Append:
    """Append one ordinary record, then look again."""

    record: Record


@dataclass(frozen=True)
class Intend:
    """Record a cancellation intent (the session ended under a running run), then look again."""

    record: Record


@dataclass(frozen=True)
class Dispatch:
    """Send the tool uses of call `step` that have no result yet."""

    step: int
    uses: list[ToolUsePart]


@dataclass(frozen=True)
class Suspend:
    """Every use has a result and some wait for input: suspend with a checkpoint."""

    checkpoint: Checkpoint
    record: Record


@dataclass(frozen=True)
class CallModel:
    """Call the model for step `step` (the last message is the user's)."""

    step: int


@dataclass(frozen=True)
class Finish:
    """Close the run with a terminal record (what the end publishes follows from `Closed`)."""

    record: Record


Output = ToolCallRequested | RunRequested | ToolCallCompleted | TurnCompleted | CancelRun | RunEvent
"""A message the planner publishes."""

Action = Wait | Closed | Append | Intend | Dispatch | Suspend | CallModel | Finish
"""The next step of a run."""
