"""A user's app deployed beside Quipu: examples/supportdesk/deploy agrees with supportdesk.app:app.

The compose file and the Kubernetes manifests are parsed and checked against the app itself,
as tests/unit/test_deploy_manifests.py checks Quipu's own: every toolset of the app has its
executors (the container's command, run through the real `quipu` command line, serves exactly
that toolset), at least two replicas of each, its calls topic and `.dlq` declared, a KEDA trigger
on the group and topic its executor really subscribes with (read off the built executor, never
started), and a job that publishes the app's agents. Nothing needs Docker or a cluster.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import quipu
from quipu.app import AnyToolset, App, load_app
from quipu.contracts.topics import TOPICS, Topic, dead_letter_topic, toolset_calls_topic
from quipu.services import cli
from quipu.services.cli import apps as cli_apps
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.settings import KafkaSettings, MongoSettings
from tests.support.manifests import yaml_documents, yaml_mapping
from tests.unit.test_deploy_manifests import SECRET_LOOKING, SECRET_NAME, container

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "supportdesk"
DEPLOY = PROJECT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
APP_SPEC = "supportdesk.app:app"
MIN_REPLICAS = 2


@cache
def app() -> App:
    loaded = load_app(APP_SPEC)
    assert isinstance(loaded, App)
    return loaded


def compose() -> dict[str, Any]:
    return yaml_mapping(COMPOSE_FILE)


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    return yaml_documents(K8S)


def k8s(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in k8s_documents() if document["kind"] == kind]


def served_by(command: list[str], monkeypatch: pytest.MonkeyPatch) -> AnyToolset:
    """The toolset `quipu ...` serves, run through the real command line up to where it would
    start the executor."""
    assert command[0] == "quipu", command
    served: list[AnyToolset] = []
    with monkeypatch.context() as patched:
        patched.setattr(cli_apps, "toolset_definition", served.append)
        patched.setattr(cli_apps, "serve_beside_running_stack", lambda _definition: None)
        result = CliRunner().invoke(cli.app, command[1:])
    assert result.exit_code == 0, result.output
    (toolset,) = served
    return toolset


def same_toolset(served: AnyToolset, declared: AnyToolset) -> bool:
    """The very toolset, or the same MCP server (the app starts it with its own interpreter)."""
    if isinstance(declared, quipu.McpToolset) and isinstance(served, quipu.McpToolset):
        return served.name == declared.name and served.command[1:] == declared.command[1:]
    return served is declared


def executors_in_compose(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each toolset's compose service (by toolset name), found by what its command serves."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, service in compose()["services"].items():
        command = service.get("command", [])
        if command[:2] in (["quipu", "serve"],):
            toolset = served_by(command, monkeypatch)
            assert toolset.name not in found, f"two compose services serve {toolset.name}"
            found[toolset.name] = (name, service)
    return found


def executors_in_k8s(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """Each toolset's Deployment (by toolset name), found by what its container's args serve."""
    found: dict[str, dict[str, Any]] = {}
    for deployment in k8s("Deployment"):
        toolset = served_by(container(deployment)["args"], monkeypatch)
        assert toolset.name not in found, f"two Deployments serve {toolset.name}"
        found[toolset.name] = deployment
    return found


def test_the_files_parse_and_the_kustomization_applies_them_in_quipus_namespace() -> None:
    assert compose()["include"] == [{"path": "../../../deploy/compose/compose.yaml"}]
    assert (DEPLOY / "../../../deploy/compose/compose.yaml").resolve() == ROOT / "deploy/compose/compose.yaml"
    (kustomization,) = k8s("Kustomization")
    assert kustomization["namespace"] == "quipu"
    assert set(kustomization["resources"]) == {path.name for path in K8S.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    for _, document in k8s_documents():
        if document["kind"] != "Kustomization":
            assert document["metadata"]["namespace"] == "quipu", document["metadata"]["name"]


def test_every_toolset_of_the_app_has_executors_in_compose_and_kubernetes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = {toolset.name: toolset for toolset in app().toolsets}
    in_compose = executors_in_compose(monkeypatch)
    in_k8s = executors_in_k8s(monkeypatch)

    assert set(in_compose) == set(declared) == set(in_k8s)
    for name, toolset in declared.items():
        assert same_toolset(
            served_by(compose()["services"][in_compose[name][0]]["command"], monkeypatch), toolset
        )
        assert same_toolset(served_by(container(in_k8s[name])["args"], monkeypatch), toolset)
        assert in_compose[name][1]["deploy"]["replicas"] >= MIN_REPLICAS, name
    # Both ways a user serves a toolset, and an MCP server by its own command.
    commands = [" ".join(service["command"][:3]) for _, service in in_compose.values()]
    assert {"quipu serve tools", "quipu serve mcp"} <= set(commands)


def test_keda_scales_each_toolset_on_the_group_and_topic_its_executor_subscribes_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in list(os.environ):
        if variable.startswith("QUIPU_"):
            monkeypatch.delenv(variable)  # the defaults are what the manifests deploy
    connections = Connections(
        KafkaSettings(bootstrap="kafka.invalid:9092"), MongoSettings(uri="mongodb://mongo.invalid:27017")
    )
    deployed = executors_in_k8s(monkeypatch)
    scaled = {document["spec"]["scaleTargetRef"]["name"]: document for document in k8s("ScaledObject")}

    assert set(scaled) == {deployment["metadata"]["name"] for deployment in deployed.values()}
    for toolset in app().toolsets:
        executor = cli_apps.toolset_definition(toolset).app(connections)
        assert executor.broker is not None
        grouped = {
            (getattr(subscriber, "group_id", None), topic)
            for subscriber in executor.broker.subscribers
            if getattr(subscriber, "group_id", None) is not None  # runs.control is read outside any
            for topic in getattr(subscriber, "topic_names", [])
        }
        scaling = scaled[deployed[toolset.name]["metadata"]["name"]]
        triggers = {
            (t["metadata"]["consumerGroup"], t["metadata"]["topic"]) for t in scaling["spec"]["triggers"]
        }
        assert triggers == grouped == {(f"tool-executor-{toolset.name}", toolset_calls_topic(toolset.name))}
        assert MIN_REPLICAS <= scaling["spec"]["minReplicaCount"] <= scaling["spec"]["maxReplicaCount"] <= 8
        assert "replicas" not in deployed[toolset.name]["spec"]  # KEDA owns it


def test_each_toolsets_calls_topic_and_dlq_are_declared_like_tools_calls() -> None:
    (calls,) = [spec.partitions for spec in TOPICS if spec.topic is Topic.TOOLS_CALLS]
    wanted = {
        name: calls
        for toolset in app().toolsets
        for name in (toolset_calls_topic(toolset.name), dead_letter_topic(toolset_calls_topic(toolset.name)))
    }
    script = "\n".join(compose()["services"]["desk-topics"]["command"])
    created = {
        match["topic"]: int(match["partitions"])
        for match in re.finditer(r"--topic (?P<topic>\S+) --partitions (?P<partitions>\d+)", script)
    }
    declared = {topic["spec"]["topicName"]: topic["spec"]["partitions"] for topic in k8s("KafkaTopic")}

    assert created == wanted == declared
    assert all(topic["spec"]["replicas"] == 3 for topic in k8s("KafkaTopic"))
    assert compose()["services"]["desk-topics"]["depends_on"] == {
        "topics": {"condition": "service_completed_successfully"}
    }


def test_a_job_publishes_the_apps_agents() -> None:
    command = ["quipu", "agents", "apply", APP_SPEC]
    (job,) = k8s("Job")
    assert container(job)["args"] == command
    assert compose()["services"]["desk-agents"]["command"] == command
    assert compose()["services"]["desk-agents"]["restart"] == "no"
    assert {agent.id for agent in quipu.load_agents(APP_SPEC)} == {agent.id for agent in app().agents}


def test_the_apps_pods_are_bounded_unprivileged_and_hold_no_database_or_model_secret() -> None:
    for workload in [*k8s("Deployment"), *k8s("Job")]:
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, name
        spec = container(workload)
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(spec["resources"][bound]), (name, bound)
        assert spec["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert {"configMapRef": {"name": "quipu-config"}} in spec["envFrom"], name
        environment = {entry["name"] for entry in spec.get("env", [])}
        assert environment == {"QUIPU_KEYS_TOKEN"}, name  # never MongoDB's URI or the model's key
    for name, service in compose()["services"].items():
        environment = service.get("environment", {})
        assert not {"QUIPU_MONGO_URI", "ANTHROPIC_API_KEY"} & set(environment), name
        for variable, value in environment.items():
            if SECRET_NAME.search(variable):
                assert str(value).startswith("${"), (name, variable)  # from the shell or .env only


def test_no_secret_value_is_written_into_any_file() -> None:
    for path in [COMPOSE_FILE, DEPLOY / "Dockerfile", *K8S.glob("*.yaml")]:
        text = path.read_text()
        for pattern in SECRET_LOOKING:
            assert not pattern.search(text), (path.name, pattern.pattern)


def test_the_image_is_quipus_with_the_project_installed_running_as_quipus_user() -> None:
    lines = [
        line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")
    ]
    assert lines[0].startswith("ARG QUIPU_IMAGE=") and lines[1] == "FROM ${QUIPU_IMAGE}"
    assert any(line.startswith("RUN /opt/quipu/bin/pip install") for line in lines)
    assert [line for line in lines if line.startswith("USER ")][-1] == "USER 10001:10001"
    copied = [line.split()[1:-1] for line in lines if line.startswith("COPY ")]
    assert all((PROJECT / source).exists() for sources in copied for source in sources)
    assert compose()["x-desk-service"]["build"] == {
        "context": "..",
        "dockerfile": "deploy/Dockerfile",
        "args": {"QUIPU_IMAGE": "quipu:local"},
    }
