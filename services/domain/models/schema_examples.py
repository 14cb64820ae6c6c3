"""A deterministic example value for a JSON schema, and the transcript digest that fills its
free strings: what `ScriptedModel` answers a structured-output request with when nothing more
specific applies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from quipu.contracts.transcript import Message, TextPart

DIGEST_CHARS = 200
"""Longest transcript digest used for unconstrained strings in structured output."""


def transcript_digest(messages: Sequence[Message], limit: int = DIGEST_CHARS) -> str:
    """The visible text of a transcript (user and assistant text parts), cut to `limit` chars."""
    texts = [
        part.text
        for message in messages
        if message.role != "system"
        for part in message.parts
        if isinstance(part, TextPart) and part.text
    ]
    digest = " / ".join(texts)
    return digest if len(digest) <= limit else digest[: limit - 1] + "…"


_FORMAT_EXAMPLES = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def example_for_schema(schema: Mapping[str, Any], *, digest: str = "") -> Any:
    """A deterministic JSON value valid for common JSON schemas (short or empty values).

    `const`, then `default`, then the first `enum` value win. Objects get every listed
    property (required or not); arrays get `minItems` examples (0 by default); strings get
    `digest` fitted to `minLength`/`maxLength` (or a fixed example for a known `format`);
    numbers their `minimum` (else 0); booleans false. `anyOf`/`oneOf` take the first option,
    `allOf` merges object options, a type list takes its first non-null type, and `$ref`s into
    the root's `$defs`/`definitions` are followed. Patterns are not honoured.
    """
    return _Example(schema, digest).of(schema, depth=0)


class _Example:
    MAX_DEPTH = 16

    def __init__(self, root: Mapping[str, Any], digest: str) -> None:
        self.root = root
        self.digest = digest

    def of(self, schema: Mapping[str, Any] | bool, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > self.MAX_DEPTH:
            return None
        for keyword in ("const", "default"):
            if keyword in schema:
                return schema[keyword]
        if schema.get("enum"):
            return schema["enum"][0]
        if "$ref" in schema:
            return self.of(self._resolve(str(schema["$ref"])), depth + 1)
        for keyword in ("anyOf", "oneOf"):
            if schema.get(keyword):
                return self.of(schema[keyword][0], depth + 1)
        if schema.get("allOf"):
            return self._all_of(schema["allOf"], depth)
        return self._typed(schema, _schema_type(schema), depth)

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int) -> Any:
        if kind == "object":
            properties = schema.get("properties", {})
            return {name: self.of(sub, depth + 1) for name, sub in properties.items()}
        if kind == "array":
            return [self.of(schema.get("items", {}), depth + 1) for _ in range(schema.get("minItems", 0))]
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number"):
            minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
            if minimum is None:
                return 0
            if kind == "number":
                return minimum if "minimum" in schema else minimum + 1
            return math.ceil(minimum) if "minimum" in schema else math.floor(minimum) + 1
        if kind == "boolean":
            return False
        return None

    def _string(self, schema: Mapping[str, Any]) -> str:
        text = _FORMAT_EXAMPLES.get(str(schema.get("format", "")), self.digest)
        minimum, maximum = schema.get("minLength", 0), schema.get("maxLength")
        if len(text) < minimum:
            text = text + "x" * (minimum - len(text))
        return text[:maximum] if maximum is not None else text

    def _all_of(self, options: list[Any], depth: int) -> Any:
        merged: dict[str, Any] = {}
        for option in options:
            value = self.of(option, depth + 1)
            if not isinstance(value, dict):
                return value
            merged.update(value)
        return merged

    def _resolve(self, reference: str) -> Mapping[str, Any]:
        for prefix in ("#/$defs/", "#/definitions/"):
            if reference.startswith(prefix):
                found = self.root.get(prefix[2:-1], {}).get(reference[len(prefix) :])
                if isinstance(found, Mapping):
                    return found
        if reference == "#":
            return self.root
        return {}


def _schema_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((item for item in kind if item != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "null"
