"""The local token estimate of a tool definition: its schema encoded once per schema object."""

from __future__ import annotations

import pytest

from quipu.contracts.transcript import encode_json_value
from quipu.services.domain.models import estimate
from quipu.services.domain.models.port import ToolSpec


def _spec(schema: dict[str, object]) -> ToolSpec:
    return ToolSpec(name="lookup", description="Finds an order by its number.", input_schema=schema)


def test_a_schema_is_encoded_once_and_counted_as_when_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    schema: dict[str, object] = {"type": "object", "properties": {"order": {"type": "string"}}}
    expected = (
        estimate.TOOL_OVERHEAD_TOKENS
        + estimate.estimate_text_tokens("lookup")
        + estimate.estimate_text_tokens("Finds an order by its number.")
        + estimate.estimate_text_tokens(encode_json_value(schema).decode())
    )
    encoded: list[object] = []

    def counted(value: object) -> bytes:
        encoded.append(value)
        return encode_json_value(value)

    monkeypatch.setattr(estimate, "encode_json_value", counted)
    assert [estimate.estimate_tool_tokens(_spec(schema)) for _ in range(3)] == [expected] * 3
    assert encoded == [schema]
    # An equal schema that is another object is encoded on its own (nothing is taken by value).
    assert estimate.estimate_tool_tokens(_spec(dict(schema))) == expected
    assert len(encoded) == 2
