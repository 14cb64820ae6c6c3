"""The one list of services (`quipu.services.catalog`) and the one service application type of the kit.

The catalog is what `quipu up`, `quipu serve`, `quipu status`, the demo and the deployment checks
read, so what is not in it does not run: every service package must be in it, and every place
that cannot read it (the import contracts in pyproject.toml) must name the same services.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from quipu.services import catalog
from quipu.services.cli.status import CONSUMERS
from quipu.services.kit.lifecycle import Opened, Running, ServiceDefinition

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalog_is_every_service_package_and_each_runs_alone() -> None:
    packages = {
        path.parent.name
        for path in (ROOT / "services").glob("*/__main__.py")
        if (path.parent / "app.py").exists()
    }
    assert set(catalog.NAMES) == packages
    assert len(catalog.NAMES) == len(set(catalog.NAMES))
    assert catalog.SERVICES[0].name == "storage_owner"  # every other service calls the store
    for service in catalog.SERVICES:
        assert importlib.util.find_spec(f"{service.module}.__main__") is not None, service.name


def test_every_consuming_service_declares_its_definition_and_the_gateway_none() -> None:
    for service in catalog.CONSUMING:
        definition = service.definition()
        assert isinstance(definition, ServiceDefinition), service.name
        assert definition.reaches_mongo == (service.name == "storage_owner"), service.name
        assert service.consumes, f"{service.name} consumes nothing"
    (http,) = [service for service in catalog.SERVICES if service.http]
    assert http.name == "gateway" and not http.consumes
    with pytest.raises(ValueError, match="HTTP"):
        http.definition()


def test_a_service_is_found_by_either_spelling_of_its_name() -> None:
    assert catalog.named("storage-owner") is catalog.named("storage_owner")
    with pytest.raises(KeyError):
        catalog.named("cli")


def test_quipu_status_measures_exactly_the_catalog_consumer_groups() -> None:
    declared = [
        (service.name, group, topic) for service in catalog.SERVICES for group, topic in service.consumes
    ]
    assert [(c.service, c.group, c.topic) for c in CONSUMERS] == declared


def test_the_import_contracts_name_every_service_of_the_catalog() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    every = {service.module for service in catalog.SERVICES}
    (independent,) = [contract for contract in contracts if contract["type"] == "independence"]
    assert set(independent["modules"]) == every
    forbidding = {
        (tuple(contract.get("source_modules", ())), tuple(contract.get("forbidden_modules", ()))): contract
        for contract in contracts
        if contract["type"] == "forbidden"
    }
    [(_, plumbing)] = [(key, found) for key, found in forbidding.items() if key[0] == ("quipu.services.kit",)]
    assert every <= set(plumbing["forbidden_modules"])
    [(_, no_pymongo)] = [(key, found) for key, found in forbidding.items() if key[1] == ("pymongo",)]
    assert every - {catalog.named("storage_owner").module} <= set(no_pymongo["source_modules"])
    [(_, listing)] = [
        (key, found) for key, found in forbidding.items() if key[0] == ("quipu.services.catalog",)
    ]
    assert every <= set(listing["forbidden_modules"])


async def test_what_a_service_opened_is_closed_last_opened_first() -> None:
    closed: list[str] = []

    class Client:
        def __init__(self, name: str) -> None:
            self.name = name
            self.started = False

        async def start(self) -> None:
            self.started = True

        async def stop(self) -> None:
            closed.append(self.name)

    async def close_store() -> None:
        closed.append("store")

    opened = Opened()
    first = await opened.start(Client("first"))
    opened.on_close(close_store)
    await opened.start(Client("last"))
    assert first.started and closed == []
    await opened.close()
    assert closed == ["last", "store", "first"]
    await opened.close()  # closing twice closes nothing twice
    assert closed == ["last", "store", "first"]


def test_handlers_reach_the_running_thing_only_between_open_and_close() -> None:
    running: Running[str] = Running("transcript recorder")
    with pytest.raises(RuntimeError, match="the transcript recorder is not started"):
        running.get()
    running.set("recorder")
    assert running.get() == "recorder"
    running.set(None)
    with pytest.raises(RuntimeError):
        running.get()
