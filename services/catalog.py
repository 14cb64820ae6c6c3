"""The services Quipu runs: the one list that `quipu up`, `quipu serve`, `quipu status`, the demo and
the deployment checks read.

A service is a package `services/<name>/` with an `app.py` and a `__main__.py`
(`python -m quipu.services.<name>`, `quipu serve <name>`). A consuming service's `app.py` declares its
`DEFINITION` (`quipu.services.kit.lifecycle.ServiceDefinition`), through which any launcher builds it;
the gateway serves HTTP and is started on its own terms. Adding a service is its own folder, an
entry here (with the consumer groups it subscribes with, as deployed) and its manifests
(deploy/compose, deploy/k8s, the Dockerfile's entry point), which the tests check against this list.

Nothing here imports a service: `quipu --help` and `quipu status` stay quick, and services still
never import each other.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quipu.contracts.topics import Topic

if TYPE_CHECKING:
    from quipu.services.kit.lifecycle import ServiceDefinition


@dataclass(frozen=True)
class Consumer:
    """One consumer group of a service, on the topic it consumes (the default group ids)."""

    service: str
    group: str
    topic: Topic | str
    """A registry topic, or a toolset's calls topic (`tools.calls.<toolset>`, a name of its own)."""

    @property
    def topic_name(self) -> str:
        """The topic's name, without the deployment's prefix."""
        return str(self.topic)


@dataclass(frozen=True)
class Service:
    """One service of the catalog."""

    name: str
    """Its package under `services/`: `python -m quipu.services.<name>`, `QUIPU_SERVICE=<name>`."""
    consumes: tuple[tuple[str, Topic], ...] = ()
    """(consumer group, topic) of each grouped subscriber, with the default settings."""
    http: bool = False
    """Whether it serves HTTP (the gateway) rather than consuming in consumer groups."""

    @property
    def module(self) -> str:
        """The module that runs it alone."""
        return f"quipu.services.{self.name}"

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """Its consumer groups."""
        return tuple(Consumer(self.name, group, topic) for group, topic in self.consumes)

    def definition(self) -> ServiceDefinition[Any]:
        """Its `ServiceDefinition` (imports the service; a consuming service only)."""
        if self.http:
            raise ValueError(f"{self.name} serves HTTP; it has no consumer definition")
        definition: ServiceDefinition[Any] = importlib.import_module(f"{self.module}.app").DEFINITION
        return definition


SERVICES: tuple[Service, ...] = (
    Service("storage_owner", consumes=(("storage-owner", Topic.STORAGE_COMMANDS),)),
    Service("tool_executor", consumes=(("tool-executor", Topic.TOOLS_CALLS),)),
    Service(
        "planner",
        consumes=(
            ("planner-requests", Topic.RUNS_REQUESTED),
            ("planner-control", Topic.RUNS_CONTROL),
            ("planner-results", Topic.TOOLS_RESULTS),
        ),
    ),
    Service("transcript_recorder", consumes=(("transcript-recorder", Topic.HISTORY_TURNS),)),
    Service("fact_extractor", consumes=(("fact-extractor", Topic.HISTORY_RECORDED),)),
    Service("enricher", consumes=(("enricher", Topic.MEMORY_CHANGES),)),
    Service("gateway", http=True),
)
"""Every service, in start order: the owner first (every other one calls the store), the default
tool executor before the planner (the planner offers only announced tools, and the executor
announces the shipped ones once started), the gateway last."""

CONSUMING: tuple[Service, ...] = tuple(service for service in SERVICES if not service.http)
"""The services that consume topics in consumer groups (FastStream applications)."""

NAMES: tuple[str, ...] = tuple(service.name for service in SERVICES)


def named(name: str) -> Service:
    """The service called `name` (`planner`; `storage-owner` works too); KeyError when none is."""
    wanted = name.replace("-", "_")
    for service in SERVICES:
        if service.name == wanted:
            return service
    raise KeyError(name)
