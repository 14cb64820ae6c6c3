"""Values that fit a JSON schema: the arguments the offline model gives any tool it calls.

    fitting_value(spec.input_schema, seed=tool_use_id)   # e.g. {"city": "k3f", "days": 4}

The value is chosen by a pseudo-random generator seeded with `seed`, so the same tool use always
gets the same arguments (a retried model step asks for the very same call), and different tool
uses get different ones. It covers what pydantic emits for a model's JSON schema:

- objects: every `required` property, and each optional one or not (by the seed); `dict[str, X]`
  (`additionalProperties`) with `minProperties`/`maxProperties`;
- strings: `enum`/`const`, the usual `format`s (`date-time`, `date`, `time`, `duration`, `email`,
  `uri`, `uuid`, `ipv4`, `ipv6`, ...), `minLength`/`maxLength`, and `pattern` (a string drawn
  from the regular expression itself, then checked; what cannot be drawn falls back to text);
- integers and numbers within `minimum`/`maximum` (exclusive too) and `multipleOf`; booleans;
  `null`;
- arrays with `items`, `prefixItems` (tuples), `minItems`/`maxItems` and `uniqueItems`;
- `$ref` into `$defs` (or any JSON pointer of the root, recursion bounded), `anyOf`/`oneOf`
  (`X | None`, discriminated unions), `allOf`, type lists, `Literal` (`enum`/`const`).

What a schema cannot say (a model validator tying two fields together) it cannot honour either:
such arguments may be refused, and the model gets the refusal as the tool's error result.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import math
import random
import re
import string
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

from quipu.contracts.errors import QuipuError

# The regular-expression parser `re` compiles with: drawing a string from a pattern walks its tree.
_REGEX_PARSER: Any = importlib.import_module("re._parser")

MAX_DEPTH = 6
"""Below this depth only what must be there is made (required properties, minimum items)."""

PATTERN_ATTEMPTS = 24
"""How many strings are drawn from a pattern before falling back to plain text."""

_WORD = string.ascii_lowercase + string.digits
_EPOCH = datetime(2020, 1, 1, tzinfo=UTC)


def fitting_value(schema: Mapping[str, Any] | bool, *, seed: str) -> Any:
    """A JSON value valid for `schema` (as far as a schema can say), the same for the same seed."""
    root = schema if isinstance(schema, Mapping) else {}
    return _Fitter(root, random.Random(seed)).value(schema, depth=0)


class _Fitter:
    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    # -- dispatch --

    def value(self, schema: Mapping[str, Any] | bool, depth: int) -> Any:
        if schema is True or schema == {}:
            return self._word(1, 8)
        if not isinstance(schema, Mapping):
            return None
        if "$ref" in schema:
            return self.value(self._resolve(str(schema["$ref"])), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self.rng.choice(list(schema["enum"]))
        for keyword in ("anyOf", "oneOf"):
            if schema.get(keyword):
                return self.value(self._option(schema[keyword], depth), depth + 1)
        if schema.get("allOf"):
            return self.value(self._merged(schema), depth + 1)
        kind = self._kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema, depth)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return None

    def _kind(self, schema: Mapping[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [item for item in kind if item != "null"]
            if not concrete:
                return "null"
            # Mostly a value, sometimes the null the list allows.
            return "null" if "null" in kind and self.rng.random() < 0.2 else str(self.rng.choice(concrete))
        if isinstance(kind, str):
            return kind
        if "properties" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        if {"minLength", "maxLength", "pattern", "format"} & set(schema):
            return "string"
        if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} & set(schema):
            return "number"
        return "string"

    def _option(self, options: Sequence[Any], depth: int) -> Any:
        """One branch of a union: deep down the null one if there is one (recursion ends there).

        A bare string beside other branches is left out: it is how pydantic writes "or its text"
        (`Decimal` is a number or a string holding one), which no schema keyword describes.
        """
        nulls = [option for option in options if isinstance(option, Mapping) and option.get("type") == "null"]
        others = [option for option in options if option not in nulls]
        if len(others) > 1:
            others = [option for option in others if option != {"type": "string"}] or others
        if nulls and (not others or depth >= MAX_DEPTH or self.rng.random() < 0.2):
            return nulls[0]
        return self.rng.choice(others or list(options))

    def _merged(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """`allOf` as one schema: properties and requirements together, the tightest bounds."""
        merged: dict[str, Any] = {key: value for key, value in schema.items() if key != "allOf"}
        for part in schema["allOf"]:
            resolved = self._resolve(part["$ref"]) if isinstance(part, Mapping) and "$ref" in part else part
            if not isinstance(resolved, Mapping):
                continue
            for key, value in resolved.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = sorted({*merged.get("required", []), *value})
                elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems") and key in merged:
                    merged[key] = max(merged[key], value)
                elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems") and key in merged:
                    merged[key] = min(merged[key], value)
                else:
                    merged.setdefault(key, value)
        return merged

    def _resolve(self, reference: str) -> Mapping[str, Any]:
        """A JSON pointer into the root schema (`#/$defs/Name`, `#`)."""
        if not reference.startswith("#"):
            return {}
        node: Any = self.root
        for token in filter(None, reference[1:].split("/")):
            key = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping):
                node = node.get(key, {})
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return {}
        return node if isinstance(node, Mapping) else {}

    # -- containers --

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        value: dict[str, Any] = {}
        for name, subschema in properties.items():
            if name in required or (depth < MAX_DEPTH and self.rng.random() < 0.5):
                value[name] = self.value(subschema, depth + 1)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping) and not properties:
            low = int(schema.get("minProperties", 0))
            high = int(schema.get("maxProperties", low + 2))
            count = low if depth >= MAX_DEPTH else self.rng.randint(low, max(low, min(high, low + 2)))
            names = schema.get("propertyNames", {"type": "string", "minLength": 1})
            attempts = 0
            while len(value) < count and attempts < count * 10:
                attempts += 1
                value[str(self.value(names, depth + 1))] = self.value(extra, depth + 1)
        return value

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = list(schema.get("prefixItems", []))
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, len(prefix)) + 3))
        items = schema.get("items")
        if items is False or (items is None and prefix):
            high = min(high, len(prefix))
        extra_room = 0 if depth >= MAX_DEPTH else 2
        count = self.rng.randint(max(low, 0), max(low, min(high, low + extra_room)))
        unique = bool(schema.get("uniqueItems"))
        value: list[Any] = [self.value(subschema, depth + 1) for subschema in prefix[:count]]
        seen = {_fingerprint(item) for item in value}
        attempts = 0
        item_schema = items if isinstance(items, Mapping) else {}
        while len(value) < count and attempts < count * 20:
            attempts += 1
            item = self.value(item_schema, depth + 1)
            if unique and _fingerprint(item) in seen:
                continue
            seen.add(_fingerprint(item))
            value.append(item)
        return value

    # -- scalars --

    def _string(self, schema: Mapping[str, Any], depth: int) -> str:
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        if "contentSchema" in schema or schema.get("contentMediaType") == "application/json":
            return json.dumps(self.value(schema.get("contentSchema", {}), depth + 1))
        formatted = self._formatted(str(schema.get("format", "")))
        if formatted is not None:
            return formatted
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            drawn = self._from_pattern(pattern, low, high)
            if drawn is not None:
                return drawn
        return _fit_length(self._word(max(1, min(low, 12)), max(8, min(low, 12))), low, high, self.rng)

    def _formatted(self, kind: str) -> str | None:
        moment = _EPOCH + timedelta(seconds=self.rng.randint(0, 10 * 365 * 86_400))
        match kind:
            case "date-time":
                return moment.isoformat().replace("+00:00", "Z")
            case "date":
                return moment.date().isoformat()
            case "time":
                return moment.time().isoformat() + "Z"
            case "duration":
                return f"PT{self.rng.randint(1, 3600)}S"
            case "email":
                return f"{self._word(3, 8)}@example.com"
            case "uri" | "url" | "uri-reference" | "iri":
                return f"https://example.com/{self._word(1, 8)}"
            case "hostname":
                return f"{self._word(3, 8)}.example.com"
            case "uuid":
                return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            case "ipv4":
                return str(ipaddress.IPv4Address(self.rng.getrandbits(32)))
            case "ipv6":
                return str(ipaddress.IPv6Address(self.rng.getrandbits(128)))
            case "regex":
                return re.escape(self._word(1, 6))
        return None

    def _from_pattern(self, pattern: str, low: int, high: int | None) -> str | None:
        try:
            tree = _REGEX_PARSER.parse(pattern)
            compiled = re.compile(pattern)
        except (re.error, RecursionError, OverflowError):
            return None
        for attempt in range(PATTERN_ATTEMPTS):
            try:
                drawn = _Drawing(self.rng, stretch=2 + attempt).draw(tree)
            except _CannotDraw:
                return None
            # Padding keeps a match when the pattern is not anchored at that end.
            for candidate in (drawn, drawn + "a" * (low - len(drawn)), "a" * (low - len(drawn)) + drawn):
                if _fits(candidate, low, high) and compiled.search(candidate):
                    return candidate
        return None

    def _integer(self, schema: Mapping[str, Any]) -> int:
        low, high = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and step > 0 and float(step).is_integer():
            step = int(step)
            first, last = math.ceil(low / step), math.floor(high / step)
            if first <= last:
                return self.rng.randint(first, last) * step
        first, last = math.ceil(low), math.floor(high)
        return self.rng.randint(first, last) if first <= last else first

    def _number(self, schema: Mapping[str, Any]) -> float | int:
        low, high = _bounds(schema, integer=False)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and step > 0:
            exact = Decimal(str(step))
            first, last = math.ceil(Decimal(str(low)) / exact), math.floor(Decimal(str(high)) / exact)
            if first <= last:
                return float(self.rng.randint(first, last) * exact)
        value = round(self.rng.uniform(low, high), 2)
        if not low <= value <= high or _excluded(value, schema):
            value = (low + high) / 2
        return value

    def _word(self, shortest: int, longest: int) -> str:
        length = self.rng.randint(shortest, max(shortest, longest))
        return "".join(self.rng.choice(_WORD) for _ in range(length))


def _bounds(schema: Mapping[str, Any], *, integer: bool) -> tuple[float, float]:
    """The closed interval a number may be drawn from (exclusive bounds moved inside)."""
    nudge = 1 if integer else 1e-6
    low: float | None = schema.get("minimum")
    high: float | None = schema.get("maximum")
    if "exclusiveMinimum" in schema:
        bound = float(schema["exclusiveMinimum"])
        candidate = math.floor(bound) + 1 if integer else bound + max(nudge, abs(bound) * 1e-9)
        low = candidate if low is None else max(low, candidate)
    if "exclusiveMaximum" in schema:
        bound = float(schema["exclusiveMaximum"])
        candidate = math.ceil(bound) - 1 if integer else bound - max(nudge, abs(bound) * 1e-9)
        high = candidate if high is None else min(high, candidate)
    if low is None and high is None:
        return (0, 100)
    if low is None:
        assert high is not None
        return (high - 100, high)
    if high is None:
        return (low, low + 100)
    return (low, high)


def _excluded(value: float, schema: Mapping[str, Any]) -> bool:
    low: float = schema.get("exclusiveMinimum", -math.inf)
    high: float = schema.get("exclusiveMaximum", math.inf)
    return value <= low or value >= high


def _fits(text: str, low: int, high: int | None) -> bool:
    return len(text) >= low and (high is None or len(text) <= high)


def _fit_length(text: str, low: int, high: int | None, rng: random.Random) -> str:
    while len(text) < low:
        text += rng.choice(_WORD)
    return text if high is None else text[:high]


def _fingerprint(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class _CannotDraw(QuipuError):  # noqa: N818 - a private signal, not an error anyone sees
    """Raised while drawing from a pattern whose construct this drawing does not know."""


class _Drawing:
    """One string drawn from a parsed regular expression (assertions are checked afterwards)."""

    _CATEGORIES: ClassVar[dict[str, str]] = {
        "CATEGORY_DIGIT": string.digits,
        "CATEGORY_NOT_DIGIT": string.ascii_letters,
        "CATEGORY_WORD": string.ascii_letters + string.digits + "_",
        "CATEGORY_NOT_WORD": " -.,",
        "CATEGORY_SPACE": " ",
        "CATEGORY_NOT_SPACE": string.ascii_letters + string.digits,
    }
    _ANY = string.ascii_letters + string.digits
    _CANDIDATES = string.ascii_letters + string.digits + " -_.,:/@"

    def __init__(self, rng: random.Random, stretch: int) -> None:
        self.rng = rng
        self.stretch = stretch
        self.groups: dict[int, str] = {}

    def draw(self, items: Any) -> str:
        return "".join(self._item(str(op), argument) for op, argument in items)

    def _item(self, op: str, argument: Any) -> str:
        if op == "LITERAL":
            return chr(argument)
        if op == "NOT_LITERAL":
            return self.rng.choice([char for char in self._ANY if ord(char) != argument])
        if op == "ANY":
            return self.rng.choice(self._ANY)
        if op == "IN":
            return self._member(argument)
        if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = argument
            count = self.rng.randint(low, max(low, min(high, low + self.stretch)))
            return "".join(self.draw(sub) for _ in range(count))
        if op == "SUBPATTERN":
            group, _add, _remove, sub = argument
            text = self.draw(sub)
            if group is not None:
                self.groups[group] = text
            return text
        if op == "ATOMIC_GROUP":
            return self.draw(argument)
        if op == "BRANCH":
            return self.draw(self.rng.choice(argument[1]))
        if op == "GROUPREF":
            return self.groups.get(argument, "")
        if op in ("AT", "ASSERT", "ASSERT_NOT"):
            return ""
        raise _CannotDraw(op)

    def _member(self, members: Any) -> str:
        negated = bool(members) and str(members[0][0]) == "NEGATE"
        allowed = set()
        for op, argument in members[1:] if negated else members:
            kind = str(op)
            if kind == "LITERAL":
                allowed.add(chr(argument))
            elif kind == "RANGE":
                low, high = argument
                allowed.update(chr(code) for code in range(low, min(high, low + 200) + 1))
            elif kind == "CATEGORY":
                allowed.update(self._CATEGORIES.get(str(argument), ""))
            else:
                raise _CannotDraw(kind)
        pool = sorted(set(self._CANDIDATES) - allowed) if negated else sorted(allowed)
        if not pool:
            raise _CannotDraw("empty class")
        return self.rng.choice(pool)
