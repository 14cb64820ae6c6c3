"""The suite's guard: no test reaches a real model or a host off this machine."""

from __future__ import annotations

import _socket
import os
import socket

import pytest

from quipu.services.domain.models.factory import ModelSettings, make_model
from quipu.services.domain.models.scripted import ScriptedModel
from tests.conftest import MODEL_KEY_VARIABLES, OffMachineConnectionError, refuse_off_machine


def test_model_keys_are_not_in_the_environment_of_any_test() -> None:
    assert not [name for name in MODEL_KEY_VARIABLES if name in os.environ]
    # So the services a test builds from the environment use the offline model.
    assert isinstance(make_model(ModelSettings()), ScriptedModel)


@pytest.mark.parametrize("host", ["203.0.113.7", "2001:db8::1", "api.anthropic.com", "10.0.0.1"])
def test_an_address_off_this_machine_is_refused(host: str) -> None:
    with pytest.raises(OffMachineConnectionError):
        refuse_off_machine((host, 443))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_is_allowed(host: str) -> None:
    refuse_off_machine((host, 443))


def test_sockets_go_through_the_guard() -> None:
    # Checked without connecting anywhere: every socket's connect is the guarded one.
    assert socket.socket.connect is not _socket.socket.connect
    assert socket.socket.connect_ex is not _socket.socket.connect_ex
