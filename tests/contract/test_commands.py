"""Every storage command calls the store method its name says, with that method's arguments, and
decodes the reply as what the method returns (the class name is the wire name and the method)."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from quipu.contracts.commands import StoreCommand
from quipu.contracts.store_operation import Backend, StoreOperation
from quipu.services.domain.memory.protocol import MemoryStore
from quipu.services.domain.store.protocol import Store

COMMANDS: list[type[StoreOperation]] = list(typing.get_args(typing.get_args(StoreCommand)[0]))
for member in list(COMMANDS):
    if typing.get_origin(member) is typing.Annotated:  # the memory commands, a union of their own
        COMMANDS.remove(member)
        COMMANDS.extend(typing.get_args(typing.get_args(member)[0]))

PORTS: dict[Backend, Any] = {Backend.RUNTIME: Store, Backend.MEMORY: MemoryStore}


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
        arguments = [name for name in command.model_fields if name not in StoreOperation.model_fields]
        assert arguments == parameters
    assert command.model_fields["op"].default == command.__name__
    assert typing.get_args(command.model_fields["op"].annotation) == (command.__name__,)
