"""The suite's guard: no test reaches a real model or a host off this machine."""

from __future__ import annotations

import _socket
import os
import socket

import pytest

from quipu.contracts.transcript import Message, TextPart
from quipu.services.domain.models.anthropic import AnthropicModel
from quipu.services.domain.models.factory import ModelSettings, make_model
from quipu.services.domain.models.port import ModelError, ModelRequest
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
    assert socket.getaddrinfo is not _socket.getaddrinfo


@pytest.mark.parametrize("host", ["api.anthropic.com", b"api.anthropic.com", "example.test"])
def test_a_host_name_is_not_looked_up(host: str | bytes) -> None:
    with pytest.raises(OffMachineConnectionError):
        socket.getaddrinfo(host, 443)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "203.0.113.7", None])
def test_loopback_names_and_ip_literals_resolve_without_a_lookup_off_the_machine(host: str | None) -> None:
    # An IP literal off the machine resolves to itself; connecting to it is what is refused.
    assert socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)


async def test_the_real_anthropic_client_cannot_reach_the_real_api() -> None:
    # What a test that sets a key by mistake builds: the real SDK client, the real API host.
    model = make_model(ModelSettings(api_key="sk-ant-not-a-key", max_retries=0))
    assert isinstance(model, AnthropicModel)
    request = ModelRequest(system="", messages=[Message(role="user", parts=(TextPart(text="hi"),))])
    try:
        with pytest.raises(ModelError) as raised:
            await model.complete(request)
    finally:
        await model.aclose()
    assert OffMachineConnectionError in [type(cause) for cause in _causes(raised.value)], (
        f"the call failed, but not because of the guard: {raised.value!r}"
    )


def _causes(error: BaseException) -> list[BaseException]:
    """The error and every error it was raised from or during."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
