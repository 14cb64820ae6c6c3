"""Hypothesis strategies for any contract model, built from its fields' annotations.

Hypothesis cannot build pydantic models from their types on its own (their timestamps must carry
an offset, ids are defaults from factories), so each field's annotation is turned into a
strategy here, and the model is validated from the generated JSON-shaped values: a sample is
always a value a producer could send.
"""

from __future__ import annotations

import enum
import functools
import types
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

ModelT = TypeVar("ModelT", bound=BaseModel)

_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)

IDS_ALPHABET = st.characters(codec="utf-8", exclude_categories=["Cs"])
IDS = st.text(IDS_ALPHABET, max_size=12)
"""Identifiers: any UTF-8 text, empty included (`""` means absent on the wire)."""

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | IDS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(IDS, children, max_size=3),
    max_leaves=6,
)
"""Any JSON value (no floats: a float's decimal form is not what these tests are about)."""


def timestamps() -> st.SearchStrategy[datetime]:
    """UTC instants at millisecond precision, the store clock's."""
    return st.integers(0, 10 * 365 * 24 * 3600 * 1000).map(lambda ms: _EPOCH + timedelta(milliseconds=ms))


def for_annotation(annotation: Any) -> st.SearchStrategy[Any]:
    """A strategy of Python values that validate as `annotation`."""
    origin = get_origin(annotation)
    arguments = get_args(annotation)
    if origin is Annotated:
        base = arguments[0]
        if base is datetime:
            return timestamps()
        if get_origin(base) in (Union, types.UnionType):
            return st.one_of([for_annotation(member) for member in get_args(base)])
        return for_annotation(base)
    if origin is Literal:
        return st.sampled_from(arguments)
    if origin in (Union, types.UnionType):
        return st.one_of([for_annotation(member) for member in arguments])
    if origin is list:
        return st.lists(for_annotation(arguments[0]), max_size=2)
    if origin is dict:
        return st.dictionaries(IDS, for_annotation(arguments[1]), max_size=2)
    if annotation is Any:
        return JSON_VALUES
    if annotation is datetime:
        return timestamps()
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return models(annotation)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: IDS,
        int: st.integers(0, 2**31),
        float: st.integers(0, 10**6).map(float),
        bool: st.booleans(),
        bytes: st.binary(max_size=16),
        type(None): st.none(),
    }
    if annotation in simple:
        return simple[annotation]
    raise TypeError(f"no sample strategy for {annotation!r}")


def _keeps(value: Any, bound: object) -> bool:
    """Whether `value` keeps one length or numeric bound (other metadata says nothing here); an
    optional field's bounds hold only when it is set."""
    if value is None:
        return True
    if isinstance(bound, MinLen):
        return len(value) >= bound.min_length
    if isinstance(bound, MaxLen):
        return len(value) <= bound.max_length
    if isinstance(bound, Ge):
        return bool(value >= bound.ge)
    if isinstance(bound, Gt):
        return bool(value > bound.gt)
    if isinstance(bound, Le):
        return bool(value <= bound.le)
    if isinstance(bound, Lt):
        return bool(value < bound.lt)
    return True


def _field(info: FieldInfo) -> st.SearchStrategy[Any]:
    """A field's values, within the bounds its constraints set."""
    pattern = next((bound.pattern for bound in info.metadata if getattr(bound, "pattern", None)), None)
    if info.annotation is str and pattern:
        return st.from_regex(pattern, fullmatch=True)
    if info.annotation == str | None and pattern:
        return st.none() | st.from_regex(pattern, fullmatch=True)
    shortest = max((bound.min_length for bound in info.metadata if isinstance(bound, MinLen)), default=0)
    if info.annotation is str and shortest:
        return st.text(IDS_ALPHABET, min_size=shortest, max_size=shortest + 12)
    return for_annotation(info.annotation).filter(
        lambda value: all(_keeps(value, bound) for bound in info.metadata)
    )


@functools.cache
def models(model: type[ModelT]) -> st.SearchStrategy[ModelT]:
    """Instances of `model`, every field generated (defaults are one value among many)."""
    fields = {name: _field(info) for name, info in model.model_fields.items()}
    return st.fixed_dictionaries(fields).map(model.model_validate)
