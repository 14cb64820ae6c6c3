"""The toolset registry: which executor deployment serves which tools, and where their calls go.

Each tool executor announces its toolset at start-up on `tools.registry` (compacted, keyed by
toolset name); the planner replays that topic from the beginning and follows it, and offers
the model only what the latest announcements hold, routing each call to its toolset's topic
(`tools.calls` for the default toolset, `tools.calls.<toolset>` for any other).

    announcement = announce("gpu", "2.1.0", catalog, at=utc_now_ms())      # the executor
    registry = ToolsetRegistry()                                            # the planner
    registry.apply(announcement)
    registry.calls_topic("render")   # "tools.calls.gpu"
    await registry.offered_within(["render"], seconds=10.0)                 # True once announced

The planner offers nothing else: a tool no toolset announced is not offered, whatever the
deployment's executors could run. A run whose tools are not announced yet (an executor started
beside the planner, still joining) waits for them a bounded time (`offered_within`).

`offered_tools` is the rule itself, a pure function of the announcements: a toolset whose
announced topic is not the one its name gives is refused (a route never comes from a message
alone), and a tool name two toolsets announce goes to the toolset whose name sorts first, so
every planner copy decides the same whatever order it read them in.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from quipu.contracts.envelope import derive_id
from quipu.contracts.tools import AnnouncedTool, ToolsetAnnounced
from quipu.contracts.topics import toolset_calls_topic
from quipu.services.domain.models.port import ToolSpec
from quipu.services.domain.tool_catalog import ToolCatalog


@dataclass(frozen=True)
class OfferedTool:
    """A tool some executor announced: how the model sees it, its deadline and where calls go."""

    spec: ToolSpec
    timeout_s: float
    toolset: str
    calls_topic: str
    """Without the deployment's prefix."""


def announce(toolset: str, version: str, catalog: ToolCatalog, *, at: datetime) -> ToolsetAnnounced:
    """The announcement of `catalog`'s tools as `toolset` (agent-tools are the planner's, not announced).

    Its `event_id` comes from the content, so every copy of one deployment announces the same id.
    """
    tools = [
        AnnouncedTool(
            name=definition.name,
            description=definition.description,
            input_schema=definition.arguments.model_json_schema(),
            timeout_s=definition.timeout_s,
            awaits_input=definition.awaits_input,
        )
        for definition in catalog
        if not definition.is_agent_tool
    ]
    content = json.dumps([version, [tool.model_dump(mode="json") for tool in tools]], sort_keys=True)
    return ToolsetAnnounced(
        event_id=derive_id(f"toolset/{toolset}", hashlib.sha256(content.encode()).hexdigest()),
        toolset=toolset,
        version=version,
        calls_topic=toolset_calls_topic(toolset),
        tools=tools,
        announced_at=at,
    )


def offered_tools(announcements: Iterable[ToolsetAnnounced]) -> dict[str, OfferedTool]:
    """Every tool the announcements offer, by name (see the module docstring for the rules)."""
    offered: dict[str, OfferedTool] = {}
    for announcement in sorted(announcements, key=lambda announced: announced.toolset):
        if announcement.calls_topic != toolset_calls_topic(announcement.toolset):
            continue
        for tool in announcement.tools:
            offered.setdefault(
                tool.name,
                OfferedTool(
                    spec=ToolSpec(
                        name=tool.name, description=tool.description, input_schema=tool.input_schema
                    ),
                    timeout_s=tool.timeout_s,
                    toolset=announcement.toolset,
                    calls_topic=announcement.calls_topic,
                ),
            )
    return offered


class ToolsetRegistry:
    """The planner's view of `tools.registry`: each toolset's latest announcement, and what they offer."""

    def __init__(self, announcements: Iterable[ToolsetAnnounced] = ()) -> None:
        self._latest: dict[str, ToolsetAnnounced] = {}
        self._offered: Mapping[str, OfferedTool] = {}
        self._changed = asyncio.Event()
        for announcement in announcements:
            self.apply(announcement)

    def apply(self, announcement: ToolsetAnnounced) -> None:
        """Take an announcement; one older than the toolset's latest is ignored (a replay)."""
        latest = self._latest.get(announcement.toolset)
        if latest is not None and latest.announced_at > announcement.announced_at:
            return
        self._latest[announcement.toolset] = announcement
        self._offered = offered_tools(self._latest.values())
        # Wake whoever waits on this view, and give later waiters a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    async def offered_within(self, names: Iterable[str], seconds: float) -> bool:
        """Wait until every tool of `names` is offered or `seconds` passed; whether they all are."""
        wanted = list(names)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while any(name not in self._offered for name in wanted):
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True

    def find(self, name: str) -> OfferedTool | None:
        """The announced tool called `name`, or None when no toolset offers it."""
        return self._offered.get(name)

    def calls_topic(self, name: str) -> str | None:
        """Where calls of tool `name` go (no prefix), or None when no toolset offers it."""
        offered = self._offered.get(name)
        return offered.calls_topic if offered is not None else None

    def toolsets(self) -> list[str]:
        """The names of every toolset announced so far."""
        return sorted(self._latest)
