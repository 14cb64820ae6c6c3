"""`quipu.App` and `load_app`: what an app is checked for when built, and what a spec may name.

Every mistake is an error naming what is wrong at construction (or when a command loads the
spec), not a run that fails later with `missing_tool`. Modules are written to a tmp directory that
is not importable from the repository, as a user's would be.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import quipu
from quipu.app import App, AppError, AppLoadError, as_app, load_app, shipped_tool_names
from quipu.services.domain.shipped_tools import calculator
from quipu.tools import Toolset, tool


def Agent(id: str, tools: Sequence[Any] = ()) -> quipu.Agent:  # noqa: N802 - reads as the class it makes
    """An agent with these tools (its instructions do not matter here)."""
    return quipu.Agent(id=id, instructions=f"You are {id}.", tools=tools)


weather = Toolset("weather", version="2")


@weather.tool
async def forecast(city: str) -> str:
    """Tomorrow's forecast for a city."""
    return f"sun in {city}"


@weather.tool
def rainfall(city: str, days: int = 1) -> float:
    """Millimetres of rain expected."""
    return 0.5 * days


@tool
async def stray(city: str) -> str:
    """A tool in no toolset."""
    return city


def test_an_app_holds_its_agents_and_toolsets() -> None:
    forecaster = Agent("forecaster", [forecast, "rainfall", "current_time", calculator])
    app = App(agents=[forecaster], toolsets=[weather])
    assert app.agents == (forecaster,) and app.toolsets == (weather,)
    assert app.toolset() is weather and app.toolset("weather") is weather
    assert quipu.App is App and quipu.load_app is load_app and "App" in quipu.__all__


def test_an_agent_named_by_object_joins_the_app_and_may_be_called() -> None:
    helper = Agent("helper", ["rainfall"])
    lead = Agent("lead", [helper, forecast])
    app = App(agents=[lead], toolsets=[weather])
    assert [agent.id for agent in app.agents] == ["lead", "helper"]
    assert App(agents=[lead, helper, lead], toolsets=[weather]).agents == (lead, helper)
    by_name = Agent("lead", ["helper"])  # by name only, the helper must be in the app itself
    with pytest.raises(AppError, match="uses tool 'helper', which nothing serves"):
        App(agents=[by_name], toolsets=[weather])
    assert App(agents=[by_name, helper], toolsets=[weather]).agents == (by_name, helper)


def test_two_toolsets_of_one_name_are_refused() -> None:
    other = Toolset("weather")
    with pytest.raises(AppError, match="two toolsets are named 'weather'"):
        App(toolsets=[weather, other])
    assert App(toolsets=[weather, weather]).toolsets == (weather,)  # the same one twice is one


def test_two_agents_of_one_id_are_refused() -> None:
    with pytest.raises(AppError, match="two different agents have the id 'a'"):
        App(agents=[Agent("a", ["current_time"]), Agent("a", ["calculator"])])


def test_a_tool_name_nothing_serves_is_refused_naming_what_is_known() -> None:
    with pytest.raises(AppError) as refused:
        App(agents=[Agent("forecaster", ["forcast"])], toolsets=[weather])
    message = str(refused.value)
    assert "agent 'forecaster' uses tool 'forcast', which nothing serves" in message
    assert "forecast" in message and "current_time" in message and "external_tools" in message


def test_a_tool_served_elsewhere_is_declared_external() -> None:
    app = App(agents=[Agent("renderer", ["render"])], external_tools=["render"])
    assert app.external_tools == {"render"}


def test_a_tool_object_in_no_toolset_of_the_app_is_refused() -> None:
    with pytest.raises(AppError, match="uses tool 'stray', which no toolset of the app holds"):
        App(agents=[Agent("a", [stray])], toolsets=[weather])
    impostor = tool(name="forecast", description="Not the weather one.")(stray.function)
    with pytest.raises(AppError, match="not the one of toolset 'weather'"):
        App(agents=[Agent("a", [impostor])], toolsets=[weather])


def test_names_two_parts_of_the_app_claim_are_refused() -> None:
    both = Toolset("climate", tools=[forecast])
    with pytest.raises(AppError, match="tool 'forecast' is in toolsets 'weather' and 'climate'"):
        App(toolsets=[weather, both])
    with pytest.raises(AppError, match="the name of a shipped tool"):
        App(toolsets=[Toolset("mine", tools=[calculator])])
    with pytest.raises(AppError, match="agent 'forecast' has the name of a tool"):
        App(agents=[Agent("forecast")], toolsets=[weather])
    with pytest.raises(AppError, match="is the shipped tools'"):
        App(toolsets=[Toolset("default")])


def test_something_that_is_not_a_tool_agent_or_toolset_is_refused() -> None:
    with pytest.raises(AppError, match="is not a toolset"):
        App(toolsets=["weather"])  # type: ignore[list-item]
    with pytest.raises(AppError, match="is not an agent"):
        App(agents=[forecast])  # type: ignore[list-item]


@dataclass(frozen=True)
class Served:
    """A toolset whose tools the running server knows (an MCP server's)."""

    name: str
    version: str = "1"

    def tool_names(self) -> frozenset[str] | None:
        return None


def test_with_a_toolset_known_only_once_served_an_unknown_name_is_checked_when_served() -> None:
    app = App(
        agents=[Agent("a", ["read_file", "forecast", "b"]), Agent("b", ["write_file", "notes"])],
        toolsets=[Served("files"), weather],
    )
    assert app.unserved_tools(["read_file", "write_file"]) == {}
    assert app.unserved_tools(["read_file"]) == {"b": ["write_file"]}
    assert app.unserved_tools([]) == {"a": ["read_file"], "b": ["write_file"]}


def test_choosing_a_toolset() -> None:
    app = App(toolsets=[weather, Served("files")])
    with pytest.raises(AppError, match=r"2 toolsets \(weather, files\); name one"):
        app.toolset()
    with pytest.raises(AppError, match="no toolset 'maps'; it has: weather, files"):
        app.toolset("maps")
    with pytest.raises(AppError, match="has no toolset"):
        App().toolset()


def test_shipped_tools_are_the_default_executors() -> None:
    assert shipped_tool_names() == {"current_time", "calculator", "notes", "ask_user"}


# --- load_app -------------------------------------------------------------------------------------


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory of the user's modules, the current directory, forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    path = list(sys.path)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]
    sys.path[:] = path


def write(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


MODULE = """
    import quipu

    shop = quipu.Toolset("shop")

    @shop.tool
    async def price(item: str) -> float:
        '''The price of an item.'''
        return 1.0

    other = quipu.Toolset("other", tools=[])
    app = quipu.App(toolsets=[shop, other])
    toolsets = [shop, other]
    number = 7
"""


def test_load_app_finds_an_app_or_a_toolset_in_the_current_directory(user_dir: Path) -> None:
    write(user_dir, "shopapp", MODULE)
    app = load_app("shopapp:app")
    assert [each.name for each in app.toolsets] == ["shop", "other"]
    alone = load_app("shopapp:shop")
    assert [each.name for each in alone.toolsets] == ["shop"] and alone.toolset().name == "shop"
    assert [each.name for each in load_app("shopapp:toolsets").toolsets] == ["shop", "other"]


def test_load_app_says_what_is_wrong(user_dir: Path) -> None:
    write(user_dir, "shopapp", MODULE)
    write(user_dir, "broken", "import quipu\nraise RuntimeError('half written')\n")
    write(user_dir, "needy", "import not_installed_anywhere\n")
    twice = "from quipu import App, Toolset\napp = App(toolsets=[Toolset('a'), Toolset('a')])\n"
    write(user_dir, "bad", twice)
    cases = {
        "shopapp": "is not MODULE:ATTRIBUTE",
        "shopapp:": "is not MODULE:ATTRIBUTE",
        "nowhere:app": f"no module 'nowhere' (looked in {user_dir}",
        "shopapp:ap": "module 'shopapp' has no attribute 'ap'; it has: app, other, shop",
        "shopapp:number": "is int: expected a quipu.App, a toolset",
        "broken:app": "importing 'broken' failed: RuntimeError: half written",
        "needy:app": "module 'needy' imports 'not_installed_anywhere', which is not installed",
    }
    for spec, message in cases.items():
        with pytest.raises(AppLoadError, match=message.replace("(", r"\(").replace(".", r"\.")):
            load_app(spec)
    with pytest.raises(AppError, match="two toolsets are named 'a'"):
        load_app("bad:app")


def test_as_app_refuses_an_empty_list() -> None:
    with pytest.raises(AppLoadError, match="an empty list"):
        as_app([])
