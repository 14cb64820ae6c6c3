"""`@tool` and `Toolset`: a typed function becomes a definition the model reads and a call the runner makes.

The definitions are checked through what the model would see (the spec's JSON schema); the calls
through the real `ToolRunner`, which answers each with the `ToolCallCompleted` the model reads.
"""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

import quipu
from quipu.contracts.tools import AwaitInput, AwaitKind, ToolCallRequested
from quipu.services.domain.shipped_tools import NotesArguments, ask_user, calculator, default_catalog
from quipu.services.domain.tool_catalog import ToolCatalog
from quipu.services.tool_executor.adapters import RememberedResults
from quipu.services.tool_executor.logic import ToolRunner
from quipu.tools import Tool, ToolContext, ToolError, Toolset, tool
from tests.support.log_capture import log_lines
from tests.support.tool_calls import answer_of, tool_call

# --- tools under test (module level: their annotations resolve in this module) ----------------------


class Address(BaseModel):
    """Where to deliver."""

    street: str = Field(description="Street and number.")
    city: str


@tool
async def ship(
    item: str,
    quantity: Annotated[int, Field(ge=1, le=10)] = 1,
    speed: Literal["standard", "express"] = "standard",
    address: Address | None = None,
    *,
    context: ToolContext,
) -> dict[str, Any]:
    """Ships an item to the person.

    Say which item and how many; the address defaults to the one on file.

    Args:
        item: The catalog name of the item.
        quantity: How many to ship.
        speed: How fast it must arrive.
        address: Where to ship it, when not the address on file.
    """
    return {
        "item": item,
        "quantity": quantity,
        "speed": speed,
        "city": address.city if address else None,
        "key": context.idempotency_key,
        "for": [context.run_id, context.session_id, context.principal_id, context.tenant_id],
    }


@tool(name="weigh", timeout_s=3.5, max_concurrency=2)
def weigh_parcel(grams: float, unit: Literal["g", "kg"] = "g") -> float:
    """Weighs a parcel.

    Parameters
    ----------
    grams
        The parcel's weight in grams.
    unit
        The unit of the answer.
    """
    return grams / 1000 if unit == "kg" else grams


@tool
def where_am_i() -> str:
    """The name of the thread the tool runs in."""
    return threading.current_thread().name


@tool
async def refuse(city: str) -> str:
    """Always refuses, with a reason for the model."""
    raise ToolError(f"no store in {city}")


@tool
async def crash(card_number: str) -> str:
    """Always fails with an unexpected error that quotes its input."""
    raise RuntimeError(f"card {card_number} declined by upstream")


@tool(awaits_input=True)
async def approve(amount: Decimal) -> str:
    """Asks a person to approve a payment."""
    return f"Approve a payment of {amount}?"


@tool
async def order(item: str) -> Address:
    """Returns a model."""
    return Address(street="1 Main St", city=item)


@dataclass
class Receipt:
    """A dataclass result."""

    total: Decimal
    lines: list[str]


@tool
async def receipt() -> Receipt:
    """Returns a dataclass."""
    return Receipt(total=Decimal("9.50"), lines=["tea"])


@tool(timeout_s=0.3)
def count_until_abandoned(context: ToolContext) -> int:
    """Counts in its thread until the call is abandoned."""
    steps = 0
    while not context.cancellation.wait_in_thread(0.01):
        steps += 1
    return steps


@tool
async def deadline_probe(context: ToolContext) -> dict[str, Any]:
    """Says what it knows of its deadline."""
    return {"left": context.seconds_left(), "has_deadline": context.deadline is not None}


# --- helpers -----------------------------------------------------------------------------------------


def _schema(made: Tool[..., Any]) -> dict[str, Any]:
    return made.spec().input_schema


def _runner(*tools: Tool[..., Any]) -> ToolRunner:
    toolset = Toolset("test", tools=tools)
    return ToolRunner(
        toolset.catalog(), toolset.implementations(), RememberedResults(100), max_timeout_s=30.0
    )


def _call(name: str, arguments: dict[str, Any] | None = None, **fields: Any) -> ToolCallRequested:
    """A call by ana of tenant t1 (`tool_call`)."""
    return tool_call(name, arguments, **{"principal_id": "ana", "tenant_id": "t1", **fields})


# --- the definition --------------------------------------------------------------------------------


def test_the_name_description_and_schema_come_from_the_signature_and_docstring() -> None:
    definition = ship.definition
    assert definition.name == "ship"
    assert definition.description == (
        "Ships an item to the person.\n\n"
        "Say which item and how many; the address defaults to the one on file."
    )
    schema = _schema(ship)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["item"]
    properties = schema["properties"]
    assert list(properties) == ["item", "quantity", "speed", "address"]  # the context is no argument
    assert properties["item"] == {
        "type": "string",
        "title": "Item",
        "description": "The catalog name of the item.",
    }
    assert (properties["quantity"]["minimum"], properties["quantity"]["maximum"]) == (1, 10)
    assert properties["quantity"]["default"] == 1
    assert properties["speed"]["enum"] == ["standard", "express"]
    assert properties["address"]["description"] == "Where to ship it, when not the address on file."
    assert schema["$defs"]["Address"]["required"] == ["street", "city"]


def test_a_sync_function_with_a_numpy_docstring_and_options() -> None:
    definition = weigh_parcel.definition
    assert (definition.name, definition.timeout_s, definition.max_concurrency) == ("weigh", 3.5, 2)
    assert not definition.awaits_input and not definition.is_agent_tool
    assert definition.description == "Weighs a parcel."
    properties = _schema(weigh_parcel)["properties"]
    assert properties["grams"]["description"] == "The parcel's weight in grams."
    assert properties["unit"]["description"] == "The unit of the answer."
    assert _schema(weigh_parcel)["required"] == ["grams"]


def test_calling_the_tool_calls_the_function_unchanged() -> None:
    assert weigh_parcel(1500, unit="kg") == 1.5
    assert isinstance(weigh_parcel, Tool) and weigh_parcel.__name__ == "weigh_parcel"


def test_the_shipped_calculator_and_ask_user_are_tools_with_their_limits() -> None:
    assert (calculator.definition.timeout_s, calculator.definition.max_concurrency) == (2.0, 8)
    assert ask_user.definition.awaits_input
    assert (ask_user.definition.timeout_s, ask_user.definition.max_concurrency) == (2.0, 32)
    catalog = default_catalog()
    assert catalog.get("calculator") is calculator.definition
    assert catalog.get("ask_user") is ask_user.definition
    assert "Supports + - * / // % **" in calculator.definition.description
    assert _schema(calculator)["properties"]["expression"]["maxLength"] == 500


def test_a_field_default_keeps_its_own_description_and_takes_the_docstring_otherwise() -> None:
    def book(
        seats: int = Field(default=2, ge=1, description="Seats to hold."),
        note: str = Field(default="", max_length=40),
    ) -> str:
        """Books a table.

        Args:
            seats: Overridden by the Field's own description.
            note: A note for the restaurant.
        """
        return f"{seats} {note}"

    properties = _schema(tool(book))["properties"]
    assert properties["seats"]["description"] == "Seats to hold." and properties["seats"]["minimum"] == 1
    assert properties["note"]["description"] == "A note for the restaurant."
    assert properties["note"]["maxLength"] == 40


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (lambda *items: None, "must be passable by name"),
        (lambda **options: None, "must be passable by name"),
    ],
)
def test_parameters_that_cannot_be_arguments_are_refused(function: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        tool(name="bad", description="Bad.")(function)


def test_unannotated_private_and_undescribed_tools_are_refused() -> None:
    def unannotated(city):  # type: ignore[no-untyped-def]
        """Has no annotation."""

    def private(_city: str) -> None:
        """Has a private parameter."""

    def undescribed(city: str) -> None:
        pass

    with pytest.raises(TypeError, match="needs a type annotation"):
        tool(unannotated)
    with pytest.raises(TypeError, match="must not start with '_'"):
        tool(private)
    with pytest.raises(ValueError, match="needs a description"):
        tool(undescribed)
    with pytest.raises(ValueError, match="must match"):
        tool(name="has space", description="A tool.")(undescribed)
    with pytest.raises(ValueError, match="timeout_s"):
        tool(timeout_s=0, description="A tool.")(undescribed)


# --- the call ------------------------------------------------------------------------------------------


async def test_arguments_are_validated_and_passed_with_the_context() -> None:
    arguments = {"item": "tea", "quantity": 3, "address": {"street": "Jr. Puno 1", "city": "Lima"}}
    result = await answer_of(_runner(ship), _call("ship", arguments))
    assert not result.is_error
    assert result.content == {
        "item": "tea",
        "quantity": 3,
        "speed": "standard",
        "city": "Lima",
        "key": "toolu_ship",
        "for": ["run-1", "session-1", "ana", "t1"],
    }


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        ({}, ["invalid arguments for ship", "item: Field required"]),
        ({"item": "tea", "quantity": 11}, ["quantity: Input should be less than or equal to 10"]),
        ({"item": "tea", "speed": "warp"}, ["speed: Input should be 'standard' or 'express'"]),
        ({"item": "tea", "address": {"street": "x"}}, ["address.city: Field required"]),
        ({"item": "tea", "colour": "red"}, ["colour: Extra inputs are not permitted"]),
    ],
)
async def test_a_schema_error_goes_back_to_the_model_and_the_function_is_not_called(
    arguments: dict[str, Any], fragments: list[str]
) -> None:
    result = await answer_of(_runner(ship), _call("ship", arguments))
    assert result.is_error
    for fragment in fragments:
        assert fragment in result.content


async def test_a_sync_tool_runs_in_a_worker_thread_not_the_event_loop() -> None:
    result = await answer_of(_runner(where_am_i), _call("where_am_i"))
    assert not result.is_error
    assert result.content != threading.current_thread().name
    result = await answer_of(_runner(weigh_parcel), _call("weigh", {"grams": 2500, "unit": "kg"}))
    assert result.content == 2.5


async def test_a_tool_error_is_a_message_for_the_model_and_is_not_logged(log_output: io.StringIO) -> None:
    result = await answer_of(_runner(refuse), _call("refuse", {"city": "Cusco"}))
    assert result.is_error and result.content == "no store in Cusco"
    assert "tool raised" not in log_output.getvalue()


async def test_another_exception_is_an_error_result_logged_without_the_input(log_output: io.StringIO) -> None:
    card = "4111111111111111"
    result = await answer_of(_runner(crash), _call("crash", {"card_number": card}))
    assert result.is_error and result.content.startswith("crash failed: RuntimeError")
    [line] = [line for line in log_lines(log_output) if line["event"] == "tool raised"]
    assert (line["tool_name"], line["error_type"]) == ("crash", "RuntimeError")
    assert line["at"][-1].endswith(" in crash")  # where it failed
    assert card not in log_output.getvalue()


async def test_an_awaits_input_tool_suspends_the_run_with_its_question() -> None:
    result = await answer_of(_runner(approve), _call("approve", {"amount": "12.50"}))
    assert result.content is None and not result.is_error
    assert result.awaiting == AwaitInput(kind=AwaitKind.CLARIFICATION, prompt="Approve a payment of 12.50?")


async def test_models_and_dataclasses_come_back_as_json() -> None:
    runner = _runner(order, receipt)
    assert (await answer_of(runner, _call("order", {"item": "Lima"}))).content == {
        "street": "1 Main St",
        "city": "Lima",
    }
    assert (await answer_of(runner, _call("receipt"))).content == {"total": "9.50", "lines": ["tea"]}


async def test_the_context_carries_the_deadline() -> None:
    result = await answer_of(_runner(deadline_probe), _call("deadline_probe", timeout_s=5.0))
    assert result.content["has_deadline"] and 0 < result.content["left"] <= 5.0


async def test_a_thread_tool_sees_its_call_abandoned_at_the_deadline() -> None:
    result = await answer_of(_runner(count_until_abandoned), _call("count_until_abandoned"))
    assert result.is_error and "timed out after 0.3 s" in result.content


async def test_a_thread_tool_sees_its_run_canceled() -> None:
    seen = asyncio.Event()
    loop = asyncio.get_running_loop()

    @tool(timeout_s=30.0)
    def wait_for_cancel(context: ToolContext) -> str:
        """Waits in its thread until the call is abandoned."""
        loop.call_soon_threadsafe(seen.set)
        return "abandoned" if context.cancellation.wait_in_thread(30.0) else "not abandoned"

    runner = _runner(wait_for_cancel)
    call = asyncio.create_task(runner.run(_call("wait_for_cancel")))
    await asyncio.wait_for(seen.wait(), 10.0)
    assert runner.cancel_run("run-1") == 1
    assert await call is None  # a canceled call answers nothing


# --- toolsets --------------------------------------------------------------------------------------------


def test_a_toolset_announces_its_definitions_and_runs_its_tools() -> None:
    shop = Toolset("shop", tools=[ship, weigh_parcel], version="1.2.0")

    @shop.tool(timeout_s=4.0)
    async def track(order_id: str) -> str:
        """Where an order is."""
        return "on its way"

    assert (shop.name, shop.version, len(shop)) == ("shop", "1.2.0", 3)
    assert [definition.name for definition in shop.definitions()] == ["ship", "weigh", "track"]
    assert [spec.name for spec in shop.specs()] == ["ship", "weigh", "track"]
    assert shop.get("track").definition.timeout_s == 4.0 and "track" in shop
    assert set(shop.implementations()) == {"ship", "weigh", "track"}
    assert isinstance(shop.catalog(), ToolCatalog) and shop.catalog().names() == ["ship", "weigh", "track"]


def test_a_toolset_refuses_two_tools_of_one_name_and_bad_names() -> None:
    def grams(grams: float) -> float:
        return grams

    other_weigh = tool(name="weigh", description="Another.")(grams)
    with pytest.raises(ValueError, match="already has a tool named 'weigh'"):
        Toolset("shop", tools=[weigh_parcel, other_weigh])
    with pytest.raises(ValueError, match="must match"):
        Toolset("my shop")
    with pytest.raises(ValueError, match="needs a version"):
        Toolset("shop", version=" ")
    with pytest.raises(TypeError, match="made with @tool"):
        Toolset("shop", tools=[lambda: None])  # type: ignore[list-item]


def test_the_public_surface_is_importable_from_quipu() -> None:
    for name in ("tool", "Tool", "Toolset", "ToolContext", "ToolError", "Cancellation", "AwaitInput"):
        assert name in quipu.__all__
        assert getattr(quipu, name) is not None
    assert quipu.tool is tool and quipu.ToolError is ToolError


# --- every shipped tool is expressible with @tool ------------------------------------------------------


@tool(name="current_time", timeout_s=2.0, max_concurrency=32)
async def current_time_as_a_function(
    timezone: Annotated[str | None, Field(min_length=1, max_length=64)] = None,
) -> dict[str, str]:
    """The current date and time, in UTC or in the given IANA time zone. Use it whenever the
    answer depends on today's date or the time of day.

    Args:
        timezone: IANA time zone name such as 'Europe/Madrid' or 'America/New_York'; UTC if omitted.
    """
    return {"timezone": timezone or "UTC"}


@tool(name="notes", timeout_s=5.0, max_concurrency=8)
async def notes_as_a_function(arguments: NotesArguments, context: ToolContext) -> dict[str, Any]:
    """A small notebook for the person you work for: 'set' saves a text under a key, 'get'
    reads it back, 'list' lists the keys. Notes outlive the conversation turn."""
    return {"action": arguments.action, "key": arguments.key, "for": context.principal_id}


def test_the_shipped_current_time_and_notes_are_expressible_as_functions() -> None:
    for made in (current_time_as_a_function, notes_as_a_function):
        shipped = default_catalog().get(made.name)
        assert made.spec() == shipped.spec()
        assert (made.definition.timeout_s, made.definition.max_concurrency) == (
            shipped.timeout_s,
            shipped.max_concurrency,
        )


async def test_a_single_tool_arguments_parameter_is_the_whole_schema_and_keeps_its_validator() -> None:
    assert notes_as_a_function.definition.arguments is NotesArguments
    runner = _runner(notes_as_a_function)
    result = await answer_of(runner, _call("notes", {"action": "get", "key": "city"}))
    assert result.content == {"action": "get", "key": "city", "for": "ana"}
    refused = await answer_of(runner, _call("notes", {"action": "set", "key": "city"}, tool_use_id="toolu_2"))
    assert refused.is_error and "action 'set' needs a value" in refused.content
    # A parameter of another model type stays one nested argument.
    assert list(_schema(ship)["properties"]) == ["item", "quantity", "speed", "address"]
