"""The tool catalog: what the model sees of each tool, and how its arguments are checked."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from quipu.services.domain.models.port import ToolSpec
from quipu.services.domain.shipped_tools import ASK_USER, CALCULATOR, CURRENT_TIME, NOTES, default_catalog
from quipu.services.domain.tool_catalog import (
    ArgumentError,
    ToolCatalog,
    ToolDefinition,
    UnknownToolError,
    agent_tool,
)


def _spec(name: str) -> ToolSpec:
    return default_catalog().get(name).spec()


def test_the_default_catalog_holds_the_shipped_tools_in_order() -> None:
    catalog = default_catalog()
    assert catalog.names() == [CURRENT_TIME, CALCULATOR, NOTES, ASK_USER]
    assert [definition.name for definition in catalog] == catalog.names()
    assert len(catalog) == 4
    assert NOTES in catalog and "shell" not in catalog


def test_every_schema_is_a_closed_object_with_described_properties() -> None:
    for spec in default_catalog().specs():
        schema = spec.input_schema
        assert schema["type"] == "object", spec.name
        assert schema["additionalProperties"] is False, spec.name
        assert spec.description.strip(), spec.name
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{spec.name}.{name} has no description"


def test_calculator_schema_requires_the_expression() -> None:
    schema = _spec(CALCULATOR).input_schema
    assert schema["required"] == ["expression"]
    assert schema["properties"]["expression"]["type"] == "string"
    assert schema["properties"]["expression"]["maxLength"] == 500


def test_current_time_schema_has_an_optional_timezone() -> None:
    schema = _spec(CURRENT_TIME).input_schema
    assert "required" not in schema
    assert {"type": "string", "minLength": 1, "maxLength": 64} in schema["properties"]["timezone"]["anyOf"]


def test_notes_schema_enumerates_the_actions() -> None:
    schema = _spec(NOTES).input_schema
    assert schema["required"] == ["action"]
    assert schema["properties"]["action"]["enum"] == ["get", "set", "list"]


def test_ask_user_awaits_input_and_offers_optional_choices() -> None:
    definition = default_catalog().get(ASK_USER)
    assert definition.awaits_input and not definition.is_agent_tool
    schema = definition.spec().input_schema
    assert schema["required"] == ["question"]
    choices = next(option for option in schema["properties"]["choices"]["anyOf"] if option["type"] == "array")
    # Each choice's bounds are in the schema the model reads, not only in a validator.
    assert choices["items"] == {"type": "string", "minLength": 1, "maxLength": 200}
    assert (choices["minItems"], choices["maxItems"]) == (1, 20)


def test_specs_follow_the_order_asked_and_refuse_unknown_names() -> None:
    catalog = default_catalog()
    assert [spec.name for spec in catalog.specs([NOTES, CALCULATOR])] == [NOTES, CALCULATOR]
    with pytest.raises(UnknownToolError, match="unknown tool 'shell'"):
        catalog.specs([CALCULATOR, "shell"])
    with pytest.raises(UnknownToolError):
        catalog.get("shell")
    assert catalog.find("shell") is None


def test_an_agent_tool_takes_a_task_and_names_its_agent() -> None:
    catalog = default_catalog()
    researcher = catalog.register(agent_tool("researcher", "Looks things up and reports back.", "agent-r"))
    assert researcher.is_agent_tool and researcher.agent_id == "agent-r"
    assert not researcher.awaits_input
    schema = catalog.get("researcher").spec().input_schema
    assert schema["required"] == ["task"] and schema["additionalProperties"] is False
    assert researcher.parse_arguments({"task": "find the capital of Peru"}).model_dump() == {
        "task": "find the capital of Peru"
    }
    with pytest.raises(ValueError, match="agent_id"):
        agent_tool("nobody", "No agent behind it.", "")


def test_a_catalog_built_from_definitions_holds_exactly_them() -> None:
    researcher = agent_tool("researcher", "Looks things up.", "agent-r")
    catalog = ToolCatalog([default_catalog().get(CALCULATOR), researcher])
    assert catalog.names() == [CALCULATOR, "researcher"]
    assert catalog.get("researcher") is researcher


def test_default_catalogs_are_independent() -> None:
    first = default_catalog()
    first.register(agent_tool("researcher", "Looks things up.", "agent-r"))
    assert "researcher" not in default_catalog()


def test_registering_the_same_definition_again_is_a_no_op_and_another_one_an_error() -> None:
    catalog = default_catalog()
    catalog.register(default_catalog().get(CALCULATOR))
    assert len(catalog) == 4
    with pytest.raises(ValueError, match="already registered"):
        catalog.register(agent_tool(CALCULATOR, "An agent that computes.", "agent-c"))


class _Nothing(BaseModel):
    pass


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "has space"}, "must match"),
        ({"name": "x" * 65}, "must match"),
        ({"name": ""}, "must match"),
        ({"description": "  "}, "needs a description"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"awaits_input": True, "agent_id": "a"}, "cannot await input"),
    ],
)
def test_definitions_refuse_what_no_provider_or_executor_could_use(
    overrides: dict[str, Any], message: str
) -> None:
    fields: dict[str, Any] = {"name": "ok", "description": "A tool.", "arguments": _Nothing, **overrides}
    with pytest.raises(ValueError, match=message):
        ToolDefinition(**fields)


@pytest.mark.parametrize(
    ("name", "arguments", "fragments"),
    [
        (CALCULATOR, {}, ["invalid arguments for calculator", "expression: Field required"]),
        (CALCULATOR, {"expression": 12}, ["expression: Input should be a valid string"]),
        (CALCULATOR, {"expression": "1", "mode": "fast"}, ["mode: Extra inputs are not permitted"]),
        (NOTES, {"action": "delete", "key": "a"}, ["action: Input should be 'get', 'set' or 'list'"]),
        (NOTES, {"action": "set", "key": "a"}, ["action 'set' needs a value"]),
        (NOTES, {"action": "get"}, ["action 'get' needs a key"]),
        (NOTES, {"action": "list", "value": "v"}, ["action 'list' takes no value"]),
        (ASK_USER, {"question": "Which?", "choices": []}, ["choices: List should have at least 1 item"]),
        (CURRENT_TIME, {"timezone": ""}, ["timezone: String should have at least 1 character"]),
    ],
)
def test_argument_errors_tell_the_model_what_to_fix(
    name: str, arguments: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(ArgumentError) as raised:
        default_catalog().get(name).parse_arguments(arguments)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_argument_errors_never_echo_the_values_given() -> None:
    secret = "sk-live-0123456789abcdef"
    with pytest.raises(ArgumentError) as raised:
        default_catalog().get(CALCULATOR).parse_arguments({"expression": 1, "api_key": secret})
    assert secret not in str(raised.value)
    assert "api_key: Extra inputs are not permitted" in str(raised.value)


def test_valid_arguments_come_back_as_the_tool_model() -> None:
    parsed = default_catalog().get(NOTES).parse_arguments({"action": "set", "key": "k", "value": "v"})
    assert parsed.model_dump() == {"action": "set", "key": "k", "value": "v"}
