"""The topic registry (docs/architecture.md, "Topics"): every topic's payload, key and partitions.

The registry is executable: each `TopicSpec` names the payload it carries (a model, or a
discriminated union of models) and the function that gives a payload its partition key. Which
topic a message goes to follows from its type alone (`spec_for`), and its key from the registry's
key function (`TopicSpec.key_for`), so no producer works either out for itself. The services
publish through `quipu.services.kit.publishing`, which adds the deployment's topic prefix.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Generic, Protocol, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter

from quipu.contracts.agents import AgentChanged
from quipu.contracts.commands import StoreCommand, StoreOperation, StoreReply
from quipu.contracts.errors import QuipuError
from quipu.contracts.events import RunEvent
from quipu.contracts.memory import FactChanged, HistoryRecorded
from quipu.contracts.runs import CancelRun, RunRequested, TurnCompleted
from quipu.contracts.tools import DEFAULT_TOOLSET, ToolCallCompleted, ToolCallRequested, ToolsetAnnounced


class Topic(StrEnum):
    """Every topic Quipu uses; each carries exactly one payload model."""

    RUNS_REQUESTED = "runs.requested"
    RUNS_CONTROL = "runs.control"
    TOOLS_CALLS = "tools.calls"
    TOOLS_RESULTS = "tools.results"
    TOOLS_REGISTRY = "tools.registry"
    AGENTS_REGISTRY = "agents.registry"
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


class UnroutablePayloadError(QuipuError, TypeError):
    """Raised when a message of a type no registry topic carries is given to be published."""


PayloadT = TypeVar("PayloadT", bound=BaseModel)


@dataclass(frozen=True)
class TopicSpec(Generic[PayloadT]):
    """One topic: what it carries, how a payload is keyed, how many partitions it has."""

    topic: Topic
    payload: Any
    """The payload's wire schema: a model class, or an annotated discriminated union of models."""
    key: str
    """The key in words, as docs/wire.md states it for producers in other languages."""
    key_of: Callable[[PayloadT], str | None]
    """The partition key of a payload: `None` for a topic whose producer picks the partition."""
    partitions: int

    @cached_property
    def adapter(self) -> TypeAdapter[PayloadT]:
        """Decodes and encodes the payload, leniently as topic consumers do (the owner decodes
        commands more strictly: `STRICT_COMMAND`)."""
        return TypeAdapter(self.payload)

    @property
    def models(self) -> tuple[type[BaseModel], ...]:
        """Every model class a message on this topic can be (the members of a union)."""
        return tuple(_models_of(self.payload))

    def key_for(self, payload: PayloadT) -> bytes | None:
        """The Kafka record key of `payload`: the UTF-8 bytes of what `key_of` says."""
        key = self.key_of(payload)
        return None if key is None else key.encode()


class _OfASession(Protocol):
    """A payload about one run of (perhaps) a session."""

    @property
    def session_id(self) -> str: ...

    @property
    def run_id(self) -> str: ...


def session_else_run(payload: _OfASession) -> str:
    """Everything about one session goes to one partition; a sessionless run's by its run id."""
    return payload.session_id or payload.run_id


def run_of(payload: ToolCallRequested) -> str:
    """A tool call goes with its run: a model's parallel tool uses stay together."""
    return payload.run_id


def toolset_of(announcement: ToolsetAnnounced) -> str:
    """A toolset's announcements share a key, so compaction keeps its latest one."""
    return announcement.toolset


def agent_of(entry: AgentChanged) -> str:
    """An agent's entries share a key, so compaction keeps its latest one."""
    return entry.agent_id


def toolset_calls_topic(toolset: str) -> str:
    """The calls topic of `toolset` (no prefix): `tools.calls` for the default one, else
    `tools.calls.<toolset>`, so each toolset's executors consume and scale on their own."""
    base = Topic.TOOLS_CALLS.value
    return base if toolset == DEFAULT_TOOLSET else f"{base}.{toolset}"


def session_of(payload: TurnCompleted | HistoryRecorded) -> str:
    """A session's turns stay in order."""
    return payload.session_id


def principal_of(change: FactChanged) -> str:
    """One person's memory changes stay in order."""
    return change.scope.principal_id


def command_key(command: StoreOperation) -> str:
    """A runtime command by session, else run; a memory command by session, else principal."""
    return command.partition_key()


def no_key(_: StoreReply) -> None:
    """A reply goes to the partition its command's route header names (the owner decides it)."""
    return None


_SESSION_ELSE_RUN = "session id (run id when sessionless)"

# The type argument of each entry is what its key function is checked against (mypy).
TOPICS: tuple[TopicSpec[Any], ...] = (
    TopicSpec[RunRequested](Topic.RUNS_REQUESTED, RunRequested, _SESSION_ELSE_RUN, session_else_run, 8),
    TopicSpec[CancelRun](Topic.RUNS_CONTROL, CancelRun, _SESSION_ELSE_RUN, session_else_run, 8),
    TopicSpec[ToolCallRequested](Topic.TOOLS_CALLS, ToolCallRequested, "run id", run_of, 8),
    TopicSpec[ToolCallCompleted](
        Topic.TOOLS_RESULTS, ToolCallCompleted, _SESSION_ELSE_RUN, session_else_run, 8
    ),
    TopicSpec[ToolsetAnnounced](Topic.TOOLS_REGISTRY, ToolsetAnnounced, "toolset name", toolset_of, 1),
    TopicSpec[AgentChanged](Topic.AGENTS_REGISTRY, AgentChanged, "agent id", agent_of, 1),
    TopicSpec[StoreOperation](
        Topic.STORAGE_COMMANDS, StoreCommand, "session id, else run or principal id", command_key, 8
    ),
    TopicSpec[StoreReply](Topic.STORAGE_REPLIES, StoreReply, "none", no_key, 8),
    TopicSpec[RunEvent](Topic.RUNS_EVENTS, RunEvent, _SESSION_ELSE_RUN, session_else_run, 8),
    TopicSpec[TurnCompleted](Topic.HISTORY_TURNS, TurnCompleted, "session id", session_of, 8),
    TopicSpec[HistoryRecorded](Topic.HISTORY_RECORDED, HistoryRecorded, "session id", session_of, 8),
    TopicSpec[FactChanged](Topic.MEMORY_CHANGES, FactChanged, "principal id", principal_of, 8),
)
"""The registry: every topic with its payload, key and partition count.

`tools.registry` and `agents.registry` are compacted (cleanup.policy=compact): readers replay them
from the beginning.
A toolset's calls topic (`toolset_calls_topic`) carries `tools.calls`' payload and key."""


def _models_of(payload: Any) -> Iterator[type[BaseModel]]:
    """The model classes of a payload schema: the model itself, or every member of a union."""
    origin = get_origin(payload)
    if origin is Annotated:
        yield from _models_of(get_args(payload)[0])
    elif origin in (Union, types.UnionType):
        for member in get_args(payload):
            yield from _models_of(member)
    elif isinstance(payload, type) and issubclass(payload, BaseModel):
        yield payload
    else:
        raise TypeError(f"a topic payload is a model or a union of models, not {payload!r}")


def _by_model() -> dict[type[BaseModel], TopicSpec[Any]]:
    found: dict[type[BaseModel], TopicSpec[Any]] = {}
    for spec in TOPICS:
        for model in spec.models:
            if model in found:
                raise TypeError(f"{model.__name__} is carried by {found[model].topic} and {spec.topic}")
            found[model] = spec
    return found


_BY_MODEL = _by_model()


def spec_for(payload: BaseModel) -> TopicSpec[Any]:
    """The topic that carries `payload`, from its type alone (UnroutablePayloadError when none)."""
    for kind in type(payload).__mro__:
        spec = _BY_MODEL.get(kind)
        if spec is not None:
            return spec
    raise UnroutablePayloadError(f"no topic carries {type(payload).__name__}")


def spec_of(topic: Topic) -> TopicSpec[Any]:
    """The registry entry of `topic`."""
    return next(spec for spec in TOPICS if spec.topic is topic)


def topic_names(prefix: str = "") -> list[str]:
    """Every topic and its `.dlq` sibling, optionally prefixed (tests isolate themselves this way)."""
    names: list[str] = []
    for spec in TOPICS:
        names += [prefix + spec.topic.value, dead_letter_topic(prefix + spec.topic.value)]
    return names
