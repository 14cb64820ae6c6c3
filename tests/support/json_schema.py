"""A small JSON Schema checker for the keywords docs/asyncapi.json uses (no `jsonschema` package here).

It knows `$ref` (into the document), `type`, `properties`, `required`, `additionalProperties`,
`items`, `enum`, `const`, `pattern`, length, size and numeric bounds, `anyOf` and `oneOf`;
`format`, `title`, `default`, `description` and `discriminator` annotate only. Any other keyword
fails loudly, so a schema this cannot check is never passed silently.
"""

from __future__ import annotations

import re
from typing import Any

_BOUNDS: dict[str, Any] = {
    "minLength": lambda value, bound: not isinstance(value, str) or len(value) >= bound,
    "maxLength": lambda value, bound: not isinstance(value, str) or len(value) <= bound,
    "minItems": lambda value, bound: not isinstance(value, list) or len(value) >= bound,
    "maxItems": lambda value, bound: not isinstance(value, list) or len(value) <= bound,
    "minimum": lambda value, bound: not _is_number(value) or value >= bound,
    "maximum": lambda value, bound: not _is_number(value) or value <= bound,
    "exclusiveMinimum": lambda value, bound: not _is_number(value) or value > bound,
    "exclusiveMaximum": lambda value, bound: not _is_number(value) or value < bound,
}
_ANNOTATIONS = {"title", "description", "default", "format", "discriminator", "examples"}
_CHECKED = {"$ref", "type", "properties", "required", "additionalProperties", "items", "enum", "const"}
_CHECKED |= {"anyOf", "oneOf", "pattern", *_BOUNDS}

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def resolve(document: dict[str, Any], ref: str) -> Any:
    """The value a local `#/a/b` reference names (JSON Pointer escapes included)."""
    assert ref.startswith("#/"), ref
    found: Any = document
    for part in ref[2:].split("/"):
        found = found[part.replace("~1", "/").replace("~0", "~")]
    return found


def problems(document: dict[str, Any], schema: Any, value: Any, where: str = "$") -> list[str]:
    """Every way `value` breaks `schema` (empty when it conforms)."""
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{where}: nothing is allowed here"]
    unknown = set(schema) - _ANNOTATIONS - _CHECKED
    assert not unknown, f"{where}: the checker does not know {sorted(unknown)}"
    found: list[str] = []
    if "$ref" in schema:
        found += problems(document, resolve(document, schema["$ref"]), value, where)
    if "type" in schema:
        kinds = _TYPES[schema["type"]]
        is_bool = isinstance(value, bool)
        if not isinstance(value, kinds) or (is_bool and schema["type"] in ("integer", "number")):
            return [*found, f"{where}: not of type {schema['type']}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: not one of {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        found.append(f"{where}: does not match {schema['pattern']}")
    found += [
        f"{where}: breaks {name} {schema[name]}"
        for name, holds in _BOUNDS.items()
        if name in schema and not holds(value, schema[name])
    ]
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: not {schema['const']!r}")
    for keyword, exactly_one in (("anyOf", False), ("oneOf", True)):
        if keyword in schema:
            fits = sum(not problems(document, member, value, where) for member in schema[keyword])
            if fits == 0 or (exactly_one and fits > 1):
                found.append(f"{where}: fits {fits} of its {keyword} members")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        found += [f"{where}: lacks {name}" for name in schema.get("required", ()) if name not in value]
        for name, item in value.items():
            if name in properties:
                found += problems(document, properties[name], item, f"{where}.{name}")
            elif "additionalProperties" in schema:
                found += problems(document, schema["additionalProperties"], item, f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += problems(document, schema["items"], item, f"{where}[{index}]")
    return found


def key_by_rule(message: dict[str, Any], payload: dict[str, Any]) -> bytes:
    """A record's key by its message's documented rule (`x-key-from` in the Kafka binding): the
    UTF-8 bytes of the first non-empty of those payload fields; an absent field is empty."""
    key = ""
    for pointer in message["bindings"]["kafka"]["x-key-from"]:
        found: Any = payload
        for part in pointer.split("#/", 1)[1].split("/"):
            found = found.get(part, "") if isinstance(found, dict) else ""
        if found:
            key = str(found)
            break
    return key.encode()
