"""The arguments a user's text gives a tool it names: what the offline model fills in before fitting.

    said_arguments(spec.input_schema, "customer=ana@example.com: my parcel never arrived")
    # -> {"customer": "ana@example.com", "summary": "my parcel never arrived"}

`text` is what follows the tool's name in its clause. Two things are read from it:

- **`name=value` pairs** for the tool's own top-level parameters (`value` is one word, or quoted
  with `"`), converted by the parameter's schema type: a string as is, an integer or a number
  parsed, a boolean from `true`/`false`/`yes`/`no`, an `enum` member only when it is one of them. A
  value that does not convert is left out (the fitted one stays), as is a name the tool lacks.
- **The rest of the text** (the pairs taken out, a leading connective such as `about` or `:` and
  trailing punctuation dropped) goes to one free-text parameter: a plain string (no `enum`,
  `format` or `pattern`) not given by a pair, the first whose name says free text (`query`,
  `text`, `summary`, ...), else the first required one, else the first. Cut to its `maxLength`.

Only the top level of an object schema is read; whatever is not said is left to
`fitting.fitting_value`. Pure and deterministic, like the rest of the offline model.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

FREE_TEXT_NAMES = (
    "query",
    "text",
    "summary",
    "question",
    "message",
    "task",
    "description",
    "topic",
    "content",
    "prompt",
    "input",
)
"""Parameter names that take a sentence, in the order they are preferred for the rest of the text."""

_PAIR = re.compile(r'(?<![\w-])([A-Za-z_][\w-]*)=(?:"([^"]*)"|(\S+))')
_LEADING = re.compile(r"^(?:[\s:,-]+|(?:about|for|on|that|to|with)\b)+", re.IGNORECASE)
_VALUE_END = ":,;.!?"
_TEXT_END = "?.! \t\n"
_TRUE, _FALSE = {"true", "yes"}, {"false", "no"}


def said_arguments(schema: Mapping[str, Any], text: str) -> dict[str, Any]:
    """The top-level arguments `text` gives a tool with input `schema` (see the module docstring)."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    said: dict[str, Any] = {}
    for match in _PAIR.finditer(text):
        name, quoted, word = match.group(1), match.group(2), match.group(3)
        prop = properties.get(name)
        if isinstance(prop, Mapping):
            value = _converted(prop, quoted if quoted is not None else word.rstrip(_VALUE_END))
            if value is not None:
                said[name] = value
    rest = _LEADING.sub("", _PAIR.sub(" ", text).strip()).strip().rstrip(_TEXT_END)
    required = schema.get("required")
    target = _free_text_parameter(
        properties, required if isinstance(required, list) else [], exclude=said.keys()
    )
    if rest and target is not None:
        limit = properties[target].get("maxLength")
        said[target] = rest[:limit] if isinstance(limit, int) else rest
    return said


def _converted(prop: Mapping[str, Any], value: str) -> Any:
    """`value` as the parameter's type, or None when it is not one."""
    enum = prop.get("enum")
    if isinstance(enum, list):
        return value if value in enum else None
    kind = _plain_type(prop)
    if kind == "string":
        return value
    if kind == "boolean":
        lowered = value.lower()
        return True if lowered in _TRUE else False if lowered in _FALSE else None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
    except ValueError:
        return None
    return None


def _plain_type(prop: Mapping[str, Any]) -> str | None:
    """The JSON type of a parameter, seeing through `X | None` (pydantic's `anyOf` with null)."""
    kind = prop.get("type")
    if isinstance(kind, str):
        return kind
    options = [option for option in prop.get("anyOf", ()) if option.get("type") != "null"]
    if len(options) == 1 and isinstance(options[0].get("type"), str):
        kind = options[0]["type"]
        return str(kind)
    return None


def _free_text_parameter(
    properties: Mapping[str, Any], required: Collection[str], *, exclude: Collection[str]
) -> str | None:
    """The parameter the rest of the text goes to, if one takes free text."""
    free = [
        name
        for name, prop in properties.items()
        if isinstance(prop, Mapping)
        and name not in exclude
        and _plain_type(prop) == "string"
        and not {"enum", "const", "format", "pattern"} & prop.keys()
    ]
    if not free:
        return None
    for preferred in FREE_TEXT_NAMES:
        if preferred in free:
            return preferred
    needed = [name for name in free if name in required]
    return (needed or free)[0]
