"""The toolset registry's view (what the planner offers, and where each call goes), and the
planner's tool book over it: pure functions, no broker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from quipu.contracts.agents import AgentDefinition
from quipu.contracts.tools import DEFAULT_TOOLSET, ToolsetAnnounced
from quipu.contracts.topics import toolset_calls_topic
from quipu.services.domain.agents import AgentRegistry
from quipu.services.domain.shipped_tools import default_catalog
from quipu.services.domain.tool_catalog import ToolCatalog, agent_tool
from quipu.services.domain.toolset_registry import ToolsetRegistry, announce, offered_tools
from quipu.services.planner.adapters import MissingToolsError, tool_book
from quipu.tools import Toolset, tool
from tests.timing import scaled

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@tool(timeout_s=30.0)
def render(scene: str) -> str:
    """Renders a scene on the GPU.

    Args:
        scene: What to draw.
    """
    return scene


@tool
def lookup(word: str) -> str:
    """Looks a word up."""
    return word


GPU = Toolset("gpu", tools=[render], version="2.1.0")
WORDS = Toolset("words", tools=[lookup], version="1")


def announced(toolset: Toolset, at: datetime = AT) -> ToolsetAnnounced:
    return announce(toolset.name, toolset.version, ToolCatalog(toolset.definitions()), at=at)


def test_a_toolset_is_announced_with_its_tools_schemas_and_its_own_topic() -> None:
    announcement = announced(GPU)

    assert announcement.toolset == "gpu" and announcement.version == "2.1.0"
    assert announcement.calls_topic == "tools.calls.gpu"
    [render_tool] = announcement.tools
    assert render_tool.name == "render" and render_tool.timeout_s == 30.0
    assert render_tool.input_schema == render.definition.arguments.model_json_schema()
    assert render_tool.description.startswith("Renders a scene")


def test_the_default_toolset_keeps_tools_calls() -> None:
    assert toolset_calls_topic(DEFAULT_TOOLSET) == "tools.calls"
    assert announce(DEFAULT_TOOLSET, "0.1.0", default_catalog(), at=AT).calls_topic == "tools.calls"


def test_every_copy_announces_the_same_id_for_the_same_content_and_another_for_new_content() -> None:
    later = announced(GPU, AT + timedelta(minutes=5))
    assert announced(GPU).event_id == later.event_id
    changed = announce("gpu", "2.2.0", ToolCatalog(GPU.definitions()), at=AT)
    assert changed.event_id != later.event_id


def test_agent_tools_are_not_announced() -> None:
    catalog = ToolCatalog([lookup.definition, agent_tool("helper", "Helps.", "agent-helper")])
    assert [announced_tool.name for announced_tool in announce("words", "1", catalog, at=AT).tools] == [
        "lookup"
    ]


def test_the_view_offers_each_tool_on_its_toolsets_topic() -> None:
    registry = ToolsetRegistry()
    registry.apply(announced(GPU))
    registry.apply(announced(WORDS))

    assert registry.calls_topic("render") == "tools.calls.gpu"
    assert registry.calls_topic("lookup") == "tools.calls.words"
    assert registry.calls_topic("calculator") is None
    offered = registry.find("render")
    assert offered is not None and offered.timeout_s == 30.0 and offered.toolset == "gpu"
    assert registry.toolsets() == ["gpu", "words"]


def test_a_later_announcement_replaces_a_toolsets_tools_and_an_older_one_is_ignored() -> None:
    registry = ToolsetRegistry()
    registry.apply(announced(GPU))
    renamed = Toolset("gpu", tools=[lookup], version="3")
    registry.apply(announced(renamed, AT + timedelta(minutes=1)))
    registry.apply(announced(GPU, AT - timedelta(minutes=1)))  # a replay of an old one

    assert registry.find("render") is None
    assert registry.calls_topic("lookup") == "tools.calls.gpu"


def test_an_announcement_whose_topic_is_not_its_names_is_refused() -> None:
    forged = announced(GPU).model_copy(update={"calls_topic": "runs.requested"})
    assert offered_tools([forged]) == {}


def test_a_tool_two_toolsets_announce_goes_to_the_first_by_name_whatever_the_order() -> None:
    twin = Toolset("alpha", tools=[render], version="1")
    both = [announced(GPU), announced(twin)]
    assert offered_tools(both)["render"].toolset == "alpha"
    assert offered_tools(reversed(both))["render"].toolset == "alpha"


AGENT = AgentDefinition(id="artist", instructions="Draw.", tools=["render", "calculator", "nobody_has_it"])


def test_the_book_names_every_tool_an_agent_declares_that_nobody_serves() -> None:
    registry = ToolsetRegistry([announced(GPU)])

    with pytest.raises(MissingToolsError) as raised:
        tool_book(AGENT, AgentRegistry([AGENT]), registry)

    # `calculator` ships with Quipu, but here no executor announced it: it is not offered.
    assert raised.value.names == ["calculator", "nobody_has_it"]
    assert "nobody_has_it" in str(raised.value) and "render" not in str(raised.value)


def test_the_book_takes_announced_tools_with_their_deadline_and_agents_as_agent_tools() -> None:
    shipped = announce(DEFAULT_TOOLSET, "1", default_catalog(), at=AT)
    registry = ToolsetRegistry([announced(GPU), shipped])
    helper = AgentDefinition(id="helper", description="Helps.", instructions="Help.")
    agent = AGENT.model_copy(update={"tools": ("render", "calculator", "helper")})

    book = tool_book(agent, AgentRegistry([agent, helper]), registry)

    assert book["render"].timeout_s == 30.0
    assert book["render"].spec.input_schema == render.definition.arguments.model_json_schema()
    assert set(book) == {"render", "calculator", "helper"}
    assert book["helper"].agent_id == "helper" and book["helper"].timeout_s is None


async def test_a_wait_for_tools_ends_when_their_toolset_is_announced() -> None:
    registry = ToolsetRegistry()
    waiting = asyncio.ensure_future(registry.offered_within(["render"], seconds=scaled(30)))
    await asyncio.sleep(0)
    assert not waiting.done()

    registry.apply(announced(WORDS))  # another toolset: still waiting
    await asyncio.sleep(0)
    assert not waiting.done()
    registry.apply(announced(GPU))

    assert await waiting is True


async def test_a_wait_for_tools_nobody_announces_gives_up_after_its_bound() -> None:
    registry = ToolsetRegistry([announced(WORDS)])

    assert await registry.offered_within(["lookup"], seconds=0) is True
    assert await registry.offered_within(["lookup", "render"], seconds=0.01) is False
