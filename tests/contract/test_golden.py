"""Old messages still decode: golden files from earlier producers against today's models."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

import quipu.contracts.commands
import quipu.contracts.envelope
import quipu.contracts.errors
import quipu.contracts.events
import quipu.contracts.runs
import quipu.contracts.store
import quipu.contracts.tools
import quipu.contracts.transcript
from quipu.contracts.commands import STORE_COMMAND, StoreReply
from quipu.contracts.events import RunEvent

GOLDEN = Path(__file__).parent / "golden"
READERS: dict[str, Callable[[str], BaseModel]] = {
    "create_session": STORE_COMMAND.validate_json,
    "start_child_run": STORE_COMMAND.validate_json,
    "append_run_record": STORE_COMMAND.validate_json,
    "record_run_suspension": STORE_COMMAND.validate_json,
    "append_history_turn": STORE_COMMAND.validate_json,
    "apply_fact_operations": STORE_COMMAND.validate_json,
    "store_reply_error": StoreReply.model_validate_json,
    "run_event_workflow": RunEvent.model_validate_json,
}


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda path: path.name)
def test_golden_message_still_decodes_and_reencodes_the_same(path: Path) -> None:
    reader = READERS[path.name.split(".")[0]]
    text = path.read_text().strip()
    decoded = reader(text)
    assert json.loads(decoded.model_dump_json()) == json.loads(text)


def test_every_golden_file_has_a_reader() -> None:
    assert {path.name.split(".")[0] for path in GOLDEN.glob("*.json")} == set(READERS)


def test_topic_payloads_ignore_unknown_fields_from_newer_producers() -> None:
    text = (GOLDEN / "run_event_workflow.v1.json").read_text()
    newer = json.loads(text) | {"added_in_v2": {"anything": True}}
    assert RunEvent.model_validate(newer).event_key == "completed"


def _contract_models() -> list[type[BaseModel]]:
    modules = [
        quipu.contracts.commands,
        quipu.contracts.envelope,
        quipu.contracts.errors,
        quipu.contracts.events,
        quipu.contracts.runs,
        quipu.contracts.store,
        quipu.contracts.tools,
        quipu.contracts.transcript,
    ]
    return [
        member
        for module in modules
        for _, member in inspect.getmembers(module, inspect.isclass)
        if issubclass(member, BaseModel) and member.__module__ == module.__name__
    ]


@pytest.mark.parametrize("model", _contract_models(), ids=lambda model: model.__name__)
def test_every_contract_model_documents_itself_and_every_field(model: type[BaseModel]) -> None:
    assert inspect.getdoc(model), f"{model.__name__} has no docstring"
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert not undocumented, f"{model.__name__}: fields without description: {undocumented}"
