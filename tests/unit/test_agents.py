"""Agents as data: `quipu.Agent`, the registry entries, the planner's registry view, loading files."""

from __future__ import annotations

import inspect
import io
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import quipu
from quipu.agents import AgentFileError, load_agents
from quipu.assistant import app as assistant_app
from quipu.contracts.agents import AgentChanged, AgentDefinition
from quipu.contracts.topics import Topic
from quipu.services.domain.agents import (
    AgentRegistry,
    InvalidAgentEntryError,
    UnknownAgentError,
    defined,
    removed,
)
from quipu.services.domain.toolset_registry import ToolsetRegistry
from quipu.services.planner.handlers import registry_readers
from tests.support.log_capture import log_lines

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = "sk-do-not-print-me"


@quipu.tool
def forecast(city: str) -> str:
    """Tomorrow's forecast for a city."""
    return city


def test_tools_are_names_tools_and_agents_kept_as_names() -> None:
    helper = quipu.Agent(id="helper", instructions="Help.")
    agent = quipu.Agent(id="forecaster", instructions="Weather.", tools=[forecast, "current_time", helper])
    assert agent.tools == ["forecast", "current_time", "helper"]
    assert agent.declared_tools == (forecast, "current_time", helper)
    assert isinstance(agent, AgentDefinition)


@pytest.mark.parametrize("tools", [["forecaster"], ["calculator", "calculator"]])
def test_an_agent_naming_itself_or_a_tool_twice_is_refused(tools: list[str]) -> None:
    with pytest.raises(ValueError, match=r"itself|twice"):
        quipu.Agent(id="forecaster", instructions="Weather.", tools=tools)


def test_an_agent_tool_that_is_no_tool_is_refused() -> None:
    with pytest.raises(TypeError, match=r"a name, a quipu\.Tool or a quipu\.Agent"):
        quipu.Agent(id="a", instructions="b", tools=[42])  # type: ignore[list-item]


def test_the_constructor_defaults_are_the_contracts() -> None:
    parameters = inspect.signature(quipu.Agent.__init__).parameters
    for name, field in AgentDefinition.model_fields.items():
        if not field.is_required():
            expected = field.get_default(call_default_factory=True)
            given = parameters[name].default
            assert (list(given) if name == "tools" else given) == expected, name


def test_a_definition_gives_the_same_event_id_whenever_published() -> None:
    agent = quipu.Agent(id="forecaster", instructions="Weather.", tools=["forecast"])
    first, again = defined(agent, at=T0), defined(agent, at=T0 + timedelta(hours=1))
    assert first.event_id == again.event_id
    changed = quipu.Agent(id="forecaster", instructions="Weather.", tools=["forecast"], max_steps=3)
    assert defined(changed, at=T0).event_id != first.event_id
    assert removed("forecaster", at=T0).event_id not in (first.event_id, defined(changed, at=T0).event_id)


def test_a_definition_round_trips_on_the_wire() -> None:
    entry = defined(quipu.Agent(id="forecaster", instructions="Weather.", model="claude-x"), at=T0)
    decoded = AgentChanged.model_validate_json(entry.model_dump_json())
    assert decoded.model_dump() == entry.model_dump()
    assert decoded.agent is not None and decoded.agent.model == "claude-x"


def _spec(agents: AgentRegistry, agent_id: str) -> AgentDefinition:
    return agents.get_agent(agent_id)


def test_the_registry_serves_an_agent_as_the_definition_it_was_published_with() -> None:
    published = AgentDefinition(
        id="scribe",
        instructions="Write it down.",
        description="Keeps notes.",
        tools=["notes"],
        max_steps=3,
        max_output_tokens=900,
        thinking_budget=64,
        memory_opt_out=True,
        model="claude-scribe",
    )
    agents = AgentRegistry()
    agents.take(defined(published, at=T0).model_dump_json().encode())

    # No copy in another shape: every field as it went onto agents.registry.
    assert agents.get_agent("scribe") == published


def test_the_registry_serves_a_registered_agent_and_its_latest_definition() -> None:
    agents = AgentRegistry()
    agents.apply(defined(quipu.Agent(id="forecaster", instructions="v1", model="claude-x"), at=T0))
    assert _spec(agents, "forecaster").instructions == "v1"
    assert _spec(agents, "forecaster").model == "claude-x"
    agents.apply(defined(quipu.Agent(id="forecaster", instructions="v2"), at=T0 + timedelta(seconds=1)))
    agents.apply(defined(quipu.Agent(id="forecaster", instructions="v0"), at=T0 - timedelta(seconds=1)))
    assert _spec(agents, "forecaster").instructions == "v2"
    assert agents.registered() == ["forecaster"]


def test_the_order_entries_are_read_in_does_not_matter() -> None:
    entries = [
        defined(quipu.Agent(id="a", instructions="first"), at=T0),
        removed("a", at=T0 + timedelta(seconds=1)),
        defined(quipu.Agent(id="a", instructions="last"), at=T0 + timedelta(seconds=2)),
    ]
    for order in (entries, entries[::-1], [entries[1], entries[2], entries[0]]):
        agents = AgentRegistry()
        for entry in order:
            agents.apply(entry)
        assert _spec(agents, "a").instructions == "last"


def test_a_registry_knows_no_agent_until_one_is_registered() -> None:
    assert len(AgentRegistry()) == 0  # a service's: even the built-in assistant comes from the registry
    with pytest.raises(UnknownAgentError):
        AgentRegistry().get_agent("assistant")


def test_a_registered_agent_replaces_a_given_one_and_its_removal_brings_it_back() -> None:
    agents = AgentRegistry(assistant_app.agents)
    built_in = _spec(agents, "assistant")
    agents.apply(defined(quipu.Agent(id="assistant", instructions="Mine."), at=T0))
    assert _spec(agents, "assistant").instructions == "Mine."
    agents.apply(removed("assistant", at=T0 + timedelta(seconds=1)))
    assert _spec(agents, "assistant") == built_in


def test_a_removed_agent_is_unknown_and_no_agent_tool() -> None:
    agents = AgentRegistry()
    agents.apply(defined(quipu.Agent(id="helper", instructions="Help."), at=T0))
    assert agents.is_agent_tool("helper")
    agents.apply(removed("helper", at=T0 + timedelta(seconds=1)))
    assert not agents.is_agent_tool("helper")
    with pytest.raises(UnknownAgentError, match="helper"):
        agents.get_agent("helper")
    assert agents.registered() == []


def test_an_entry_about_another_agent_or_calling_itself_is_refused_and_changes_nothing() -> None:
    agents = AgentRegistry()
    forged = AgentChanged(
        agent_id="assistant", agent=AgentDefinition(id="other", instructions="x"), changed_at=T0
    )
    with pytest.raises(InvalidAgentEntryError, match="another agent"):
        agents.apply(forged)
    # The wire does not refuse it (a reader does): a producer in another language may send it.
    loop = AgentChanged(
        agent_id="loop", agent=AgentDefinition(id="loop", instructions="x", tools=["loop"]), changed_at=T0
    )
    with pytest.raises(InvalidAgentEntryError, match="itself"):
        agents.apply(loop)
    assert list(agents) == []


# --- files and modules ------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_yaml_file_with_one_agent_a_list_or_a_list_under_agents(tmp_path: Path) -> None:
    one = _write(tmp_path, "one.yaml", "id: forecaster\ninstructions: Weather.\ntools: [forecast]\n")
    assert [agent.tools for agent in load_agents(one)] == [["forecast"]]
    listed = _write(tmp_path, "list.yml", "- {id: a, instructions: A.}\n- {id: b, instructions: B.}\n")
    assert [agent.id for agent in load_agents(listed)] == ["a", "b"]
    nested = _write(tmp_path, "nested.yaml", "agents:\n  - id: a\n    instructions: A.\n    max_steps: 3\n")
    [agent] = load_agents(nested)
    assert agent.max_steps == 3 and isinstance(agent, quipu.Agent)


def test_a_toml_file_with_one_agent_or_an_array_of_agents(tmp_path: Path) -> None:
    one = _write(tmp_path, "one.toml", 'id = "a"\ninstructions = "A."\nmodel = "claude-x"\n')
    assert [agent.model for agent in load_agents(one)] == ["claude-x"]
    many = _write(
        tmp_path,
        "many.toml",
        '[[agents]]\nid = "a"\ninstructions = "A."\n\n[[agents]]\nid = "b"\ninstructions = "B."\n',
    )
    assert [agent.id for agent in load_agents(many)] == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        (
            "bad.yaml",
            f"id: a\ninstructions: {SECRET}\nmax_steps: 0\n",
            "agent 'a': max_steps: Input should be greater",
        ),
        (
            "typo.yaml",
            f"id: a\ninstructions: {SECRET}\nmax_step: 3\n",
            "agent 'a': unknown field(s) max_step",
        ),
        ("missing.toml", f'id = "a"\ndescription = "{SECRET}"\n', "agent 'a': instructions: Field required"),
        (
            "id.yaml",
            f"id: 'no spaces {SECRET}'\ninstructions: x\n",
            "agent 0: id: String should match pattern",
        ),
        (
            "self.yaml",
            f"id: a\ninstructions: {SECRET}\ntools: [a]\n",
            "agent 'a': agent 'a' cannot call itself",
        ),
        (
            "twice.yaml",
            "- {id: a, instructions: A.}\n- {id: a, instructions: B.}\n",
            "agent id(s) given twice: a",
        ),
        ("broken.yaml", f"id: a\ninstructions: [{SECRET}\n", "not valid YAML (line"),
        ("broken.toml", f'id = "a"\ninstructions = {SECRET}\n', "not valid TOML (at line 2"),
        ("scalar.yaml", f"{SECRET}\n", "expected an agent, a list of agents"),
        ("mixed.yaml", "agents: []\nid: a\n", "`agents` must be the only top-level key"),
    ],
)
def test_a_bad_file_says_which_agent_and_field_never_a_value(
    tmp_path: Path, name: str, text: str, says: str
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(AgentFileError) as raised:
        load_agents(path)
    message = str(raised.value)
    assert says in message and message.startswith(path)
    assert SECRET not in message
    assert "no spaces" not in message


def test_a_source_that_is_no_file_nor_module_attribute() -> None:
    with pytest.raises(AgentFileError, match=r"not a \.yaml, \.yml or \.toml file nor module:attr"):
        load_agents("agents.json")
    with pytest.raises(AgentFileError, match="cannot be read"):
        load_agents("/nonexistent/agents.yaml")


@pytest.fixture
def agents_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("my_agents_for_test")
    helper = quipu.Agent(id="helper", instructions="Help.")
    module.helper = helper  # type: ignore[attr-defined]
    module.team = [helper, quipu.Agent(id="lead", instructions="Lead.", tools=[helper])]  # type: ignore[attr-defined]
    module.app = types.SimpleNamespace(agents=module.team)  # type: ignore[attr-defined]
    module.wrong = [helper, "lead"]  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_module_attribute_an_agent_a_list_or_an_object_with_agents(agents_module: types.ModuleType) -> None:
    assert [agent.id for agent in load_agents("my_agents_for_test:helper")] == ["helper"]
    assert [agent.id for agent in load_agents("my_agents_for_test:team")] == ["helper", "lead"]
    assert [agent.id for agent in load_agents("my_agents_for_test:app")] == ["helper", "lead"]
    with pytest.raises(AgentFileError, match=r"my_agents_for_test:wrong\[1\]: a str, not a quipu.Agent"):
        load_agents("my_agents_for_test:wrong")
    with pytest.raises(AgentFileError, match="has no attribute 'nobody'"):
        load_agents("my_agents_for_test:nobody")
    with pytest.raises(AgentFileError, match="cannot be imported"):
        load_agents("no_such_module_anywhere:agents")


# --- the planner's reader of agents.registry ---------------------------------------------------------


def test_the_planner_skips_an_unusable_registry_record_with_a_warning_that_quotes_nothing(
    log_output: io.StringIO,
) -> None:
    agents = AgentRegistry()
    readers = dict(registry_readers(ToolsetRegistry(), agents))
    take = readers[Topic.AGENTS_REGISTRY]
    forged = AgentChanged(
        agent_id="victim", agent=AgentDefinition(id="other", instructions=SECRET), changed_at=T0
    )
    for body in (b"{not json " + SECRET.encode(), forged.model_dump_json().encode()):
        take(body)
    take(defined(quipu.Agent(id="fine", instructions="Fine."), at=T0).model_dump_json().encode())

    assert agents.registered() == ["fine"]
    skipped = [line for line in log_lines(log_output) if line["event"] == "agent registry entry skipped"]
    assert len(skipped) == 2 and all(line["level"] == "warning" for line in skipped)
    assert SECRET not in log_output.getvalue()
