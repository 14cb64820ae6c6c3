"""Every storage command calls the store method its name says, with that method's arguments, and
decodes the reply as what the method returns (the class name is the wire name and the method)."""

from __future__ import annotations

import inspect
import typing
from datetime import UTC, datetime
from typing import Any

import pytest

from quipu.contracts.commands import AppendRunRecords, DispatchedCall, StoreCommand
from quipu.contracts.store import Record
from quipu.contracts.store_operation import Backend, StoreOperation
from quipu.contracts.tools import ToolCallRequested
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.session_claims import SessionClaims
from quipu.services.domain.store.protocol import Store

COMMANDS: list[type[StoreOperation]] = list(typing.get_args(typing.get_args(StoreCommand)[0]))
for member in list(COMMANDS):
    if typing.get_origin(member) is typing.Annotated:  # the memory commands, a union of their own
        COMMANDS.remove(member)
        COMMANDS.extend(typing.get_args(typing.get_args(member)[0]))

PORTS: dict[Backend, Any] = {Backend.RUNTIME: Store, Backend.MEMORY: MemoryStore, Backend.BOTH: SessionClaims}


def test_the_union_holds_every_command_once() -> None:
    names = [command.__name__ for command in COMMANDS]
    assert len(names) == len(set(names)) >= 30


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.__name__)
def test_a_command_names_its_store_method_and_result(command: type[StoreOperation]) -> None:
    method = getattr(PORTS[command.backend], command.method)
    hints = typing.get_type_hints(method)
    expected = None if hints["return"] is type(None) else hints["return"]
    assert command.result_type == expected
    if "arguments" not in vars(command):  # one that maps its fields itself says so in its docstring
        parameters = [name for name in inspect.signature(method).parameters if name != "self"]
        # What the owner publishes after the commit (an outbox) rides along but is no argument.
        skipped = StoreOperation.model_fields.keys() | command.published_fields
        arguments = [name for name in command.model_fields if name not in skipped]
        assert arguments == parameters
    assert command.model_fields["op"].default == command.__name__
    assert typing.get_args(command.model_fields["op"].annotation) == (command.__name__,)


def test_the_calls_a_step_carries_are_published_by_the_owner_never_passed_to_the_store() -> None:
    record = Record(
        event_key="step/1/assistant",
        run_id="run-1",
        agent_id="agent-a",
        type="run_phase_changed",
        payload=b'{"phase":"executing_tools"}',
        timestamp=datetime(2025, 1, 1, tzinfo=UTC),
    )
    call = ToolCallRequested(run_id="run-1", agent_id="agent-a", tool_use_id="use-1", tool_name="calculator")
    command = AppendRunRecords(records=[record], calls=[DispatchedCall(toolset="default", call=call)])
    assert command.arguments() == {"records": [record], "follows": None}
    assert "calls" not in AppendRunRecords(records=[record]).model_dump(mode="json")
