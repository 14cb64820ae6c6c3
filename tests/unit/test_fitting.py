"""Values fitting a JSON schema: for many generated pydantic models, the value drawn for the model's
schema validates against the model itself (what the tool executor checks before a call)."""

from __future__ import annotations

import enum
import json
import re
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from ipaddress import IPv4Address, IPv6Address
from typing import Annotated, Any, Literal, Union
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AnyUrl, BaseModel, Field, create_model

from quipu.services.domain.models.fitting import fitting_value
from quipu.services.domain.shipped_tools import calculator, default_catalog

PATTERNS = [
    r"^[a-z]{3,8}$",
    r"^\d{4}-\d{2}-\d{2}$",
    r"^[A-Z]{2}\d{6}$",
    r"^(red|green|blue)$",
    r"^\+?[0-9]{7,12}$",
    r"^[a-z0-9_-]{1,16}\.(txt|md)$",
    r"ab+c",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,4}$",
]
"""Patterns of the kind pydantic's regex engine (Rust's, no look-around or back-references) takes."""

PYTHON_ONLY_PATTERNS = [r"^(?!admin)[a-z]{4,10}$", r"^(\w)\w*\1$"]
"""What a model configured with `regex_engine="python-re"` may also use."""


class Colour(enum.Enum):
    """An enum field."""

    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    """An integer enum field."""

    LOW = 1
    HIGH = 5


SCALARS: list[Any] = [
    str,
    int,
    float,
    bool,
    datetime,
    date,
    time,
    timedelta,
    UUID,
    Decimal,
    IPv4Address,
    IPv6Address,
    AnyUrl,
    bytes,
    Colour,
    Level,
    Any,
]


@st.composite
def constrained_scalars(draw: st.DrawFn) -> Any:
    """A scalar type with the constraints pydantic turns into JSON schema keywords."""
    kind = draw(st.sampled_from(["int", "float", "str", "pattern", "literal", "decimal", "plain"]))
    if kind == "int":
        low = draw(st.integers(-1000, 1000))
        high = low + draw(st.integers(0, 500))
        step = draw(st.sampled_from([None, 1, 3, 7]))
        exclusive = draw(st.booleans()) and high - low > 2
        bounds: dict[str, Any] = {"gt": low, "lt": high} if exclusive else {"ge": low, "le": high}
        if step is not None and exclusive is False and high - low >= step:
            bounds["multiple_of"] = step
        return Annotated[int, Field(**bounds)]
    if kind == "float":
        start = draw(st.floats(-1e6, 1e6, allow_nan=False))
        width = draw(st.floats(1e-3, 1e4))
        exclusive = draw(st.booleans())
        limits: dict[str, Any] = (
            {"gt": start, "lt": start + width} if exclusive else {"ge": start, "le": start + width}
        )
        return Annotated[float, Field(**limits)]
    if kind == "str":
        low = draw(st.integers(0, 30))
        high = low + draw(st.integers(0, 30))
        return Annotated[str, Field(min_length=low, max_length=high)]
    if kind == "pattern":
        return Annotated[str, Field(pattern=draw(st.sampled_from(PATTERNS)))]
    if kind == "literal":
        values = draw(st.lists(st.one_of(st.text(max_size=5), st.integers(-5, 5)), min_size=1, max_size=4))
        return Literal[tuple(values)]
    if kind == "decimal":
        # max_digits and decimal_places are not in the schema, so nothing drawn from it honours them.
        return Annotated[Decimal, Field(ge=draw(st.integers(-50, 50)))]
    return draw(st.sampled_from(SCALARS))


def _model(name: str, fields: dict[str, Any]) -> type[BaseModel]:
    model: type[BaseModel] = create_model(name, **fields)
    return model


# Types built at run time from drawn parts, through Any: the type checker must not read them as annotations.
LIST: Any = list
TUPLE: Any = tuple
DICT: Any = dict
UNION: Any = Union
ANNOTATED: Any = Annotated


@st.composite
def field_types(draw: st.DrawFn, depth: int = 0) -> Any:
    """A field type: a scalar, or a container, union, optional or nested model of smaller ones."""
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        return draw(constrained_scalars())
    inner = draw(field_types(depth + 1))
    kind = draw(st.sampled_from(["list", "tuple", "dict", "set", "optional", "union", "model", "tagged"]))
    if kind == "list":
        low = draw(st.integers(0, 3))
        return ANNOTATED[LIST[inner], Field(min_length=low, max_length=low + draw(st.integers(0, 3)))]
    if kind == "tuple":
        return TUPLE[inner, draw(constrained_scalars())]
    if kind == "dict":
        return DICT[str, inner]
    if kind == "set":
        return set[Annotated[str, Field(min_length=1, max_length=12)]]
    if kind == "optional":
        return inner | None
    if kind == "union":
        return UNION[inner, draw(constrained_scalars())]
    suffix = draw(st.integers(0, 10**6))
    if kind == "model":
        return _model(f"Nested{suffix}", draw(model_fields(depth + 1)))
    cat = _model(
        f"Cat{suffix}", {"kind": (Literal["cat"], ...), "lives": (Annotated[int, Field(ge=1, le=9)], ...)}
    )
    dog = _model(f"Dog{suffix}", {"kind": (Literal["dog"], ...), "inner": (inner, ...)})
    return ANNOTATED[UNION[cat, dog], Field(discriminator="kind")]


@st.composite
def model_fields(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    names = draw(
        st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), min_size=1, max_size=5, unique=True)
    )
    fields: dict[str, Any] = {}
    for name in names:
        kind = draw(field_types(depth))
        optional = draw(st.booleans())
        fields[name] = (kind | None, None) if optional else (kind, ...)
    return fields


@st.composite
def models(draw: st.DrawFn) -> type[BaseModel]:
    return _model("Arguments", draw(model_fields()))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), seed=st.text(min_size=1, max_size=24))
def test_the_value_drawn_for_a_models_schema_validates_against_the_model(
    model: type[BaseModel], seed: str
) -> None:
    schema = model.model_json_schema()
    value = fitting_value(schema, seed=seed)
    model.model_validate(value)  # as the executor validates a tool call's input
    model.model_validate_json(json.dumps(value))  # and as it arrives on the wire


@given(seed=st.text(min_size=1, max_size=24))
def test_the_same_seed_draws_the_same_value(seed: str) -> None:
    schema = default_catalog().get("notes").spec().input_schema
    assert fitting_value(schema, seed=seed) == fitting_value(schema, seed=seed)


def test_different_seeds_draw_different_values() -> None:
    schema = calculator.spec().input_schema
    drawn = {json.dumps(fitting_value(schema, seed=f"toolu_{number}")) for number in range(20)}
    assert len(drawn) > 10


@pytest.mark.parametrize("pattern", PATTERNS + PYTHON_ONLY_PATTERNS)
def test_strings_are_drawn_from_the_pattern(pattern: str) -> None:
    for number in range(30):
        value = fitting_value({"type": "string", "pattern": pattern}, seed=str(number))
        assert re.search(pattern, value), (pattern, value)


def test_every_shipped_tool_without_a_cross_field_rule_gets_valid_arguments() -> None:
    for definition in default_catalog():
        if definition.name == "notes":
            continue  # its model validator ties key and value to the action: no schema says that
        for number in range(50):
            definition.parse_arguments(fitting_value(definition.spec().input_schema, seed=f"{number}"))


def test_recursion_ends() -> None:
    class Node(BaseModel):
        """A tree."""

        name: str
        children: list[Node] = []
        parent: Node | None = None

    Node.model_rebuild()
    for number in range(30):
        Node.model_validate(fitting_value(Node.model_json_schema(), seed=str(number)))
