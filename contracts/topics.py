"""The topic registry (docs/architecture.md, "Topics"): names, keys, partitions and payloads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Topic(StrEnum):
    """Every topic Quipu uses; each carries exactly one payload model."""

    RUNS_REQUESTED = "runs.requested"
    RUNS_CONTROL = "runs.control"
    TOOLS_CALLS = "tools.calls"
    TOOLS_RESULTS = "tools.results"
    STORAGE_COMMANDS = "storage.commands"
    STORAGE_REPLIES = "storage.replies"
    RUNS_EVENTS = "runs.events"
    HISTORY_TURNS = "history.turns"
    HISTORY_RECORDED = "history.recorded"
    MEMORY_CHANGES = "memory.changes"

    @property
    def dlq(self) -> str:
        """The dead-letter sibling: the original message, its error and its headers."""
        return dead_letter_topic(self.value)


def dead_letter_topic(topic: str) -> str:
    """Name of the dead-letter topic of any topic."""
    return f"{topic}.dlq"


@dataclass(frozen=True)
class TopicSpec:
    """How a topic is keyed and partitioned, and what it carries."""

    topic: Topic
    key: str
    payload: str
    partitions: int


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(Topic.RUNS_REQUESTED, "session id (run id when sessionless)", "RunRequested", 8),
    TopicSpec(Topic.RUNS_CONTROL, "session id", "CancelRun", 8),
    TopicSpec(Topic.TOOLS_CALLS, "run id", "ToolCallRequested", 8),
    TopicSpec(Topic.TOOLS_RESULTS, "session id", "ToolCallCompleted", 8),
    TopicSpec(Topic.STORAGE_COMMANDS, "session id, else run id", "StoreCommand", 8),
    TopicSpec(Topic.STORAGE_REPLIES, "none", "StoreReply", 8),
    TopicSpec(Topic.RUNS_EVENTS, "session id", "RunEvent", 8),
    TopicSpec(Topic.HISTORY_TURNS, "session id", "TurnCompleted", 8),
    TopicSpec(Topic.HISTORY_RECORDED, "session id", "HistoryRecorded", 8),
    TopicSpec(Topic.MEMORY_CHANGES, "principal id", "FactChanged", 8),
)
"""The registry: every topic with its key, payload and partition count."""


def topic_names(prefix: str = "") -> list[str]:
    """Every topic and its `.dlq` sibling, optionally prefixed (tests isolate themselves this way)."""
    names: list[str] = []
    for spec in TOPICS:
        names += [prefix + spec.topic.value, dead_letter_topic(prefix + spec.topic.value)]
    return names
