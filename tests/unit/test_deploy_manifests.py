"""The production deployment files agree with the code: nothing here needs Docker or a cluster.

deploy/compose/compose.yaml and deploy/k8s/*.yaml are parsed with PyYAML and checked against
the topic registry (`quipu.contracts.topics`), the services that exist (`services/*/__main__.py`), the
consumer groups the services really subscribe with (read off each service's FastStream broker,
built but never started) and a few rules: only the storage owner reaches MongoDB, only the
model services hold the model key, no secret value is written into any file. The Dockerfile's
entry point is run with /bin/sh against a stand-in `python`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from faststream import FastStream
from faststream.kafka.subscriber.usecase import LogicSubscriber

from quipu.contracts.topics import TOPICS, dead_letter_topic
from quipu.services import catalog
from quipu.services.gateway.handlers import health_router
from quipu.services.kit.lifecycle import Connections
from quipu.services.kit.settings import KafkaSettings, MongoSettings
from tests.support.manifests import yaml_documents, yaml_mapping
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose" / "compose.yaml"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
SECRET_TEMPLATE = K8S / "secrets.template.yaml"

NAMESPACE = "quipu"
OWNER = "storage_owner"
HTTP_SERVICES = {"gateway"}
"""Services that consume no topic in a consumer group, so nothing to scale on lag."""

SECRET_NAME = re.compile(r"(API_KEY|SECRET|MASTER_KEY|PASSWORD|TOKEN|MONGO_URI)$")
"""Environment variables whose values are secrets (a MongoDB URI may carry credentials)."""

CREDENTIALS_IN_URI = re.compile(r"[a-z][a-z0-9+.-]*://(?!USER:PASSWORD@)[^\s/@<>\"']+:[^\s/@<>\"']+@", re.I)
"""`scheme://user:password@`, except the literal `USER:PASSWORD` of the documented examples."""

SECRET_LOOKING = (
    re.compile(r"sk-ant-[A-Za-z0-9_-]{8,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    CREDENTIALS_IN_URI,
)

NAMESPACED = {"ConfigMap", "Secret", "Deployment", "Job", "Service", "KafkaTopic", "ScaledObject"}


# -- what the code says --------------------------------------------------------------------------


def registry_topics() -> dict[str, int]:
    """Every registry topic and its `.dlq`, with the partitions the registry gives it."""
    wanted: dict[str, int] = {}
    for spec in TOPICS:
        wanted[spec.topic.value] = spec.partitions
        wanted[dead_letter_topic(spec.topic.value)] = spec.partitions
    return wanted


def service_modules() -> set[str]:
    """Every service that runs alone (`python -m quipu.services.<name>`): the catalog's."""
    return set(catalog.NAMES)


def service_packages() -> set[str]:
    """Every package with an `app.py` and a `__main__.py` (`services/cli` runs with `-m` too, but
    is the `quipu` command, not a service)."""
    return {
        path.parent.name
        for path in (ROOT / "services").glob("*/__main__.py")
        if (path.parent / "app.py").exists()
    }


def model_services() -> set[str]:
    """Services whose package builds a model client, so they need the model key."""
    return {
        name
        for name in service_modules()
        if any("make_model" in path.read_text() for path in (ROOT / "services" / name).glob("*.py"))
    }


def _build_apps() -> dict[str, FastStream]:
    connections = Connections(
        KafkaSettings(bootstrap="kafka.invalid:9092"), MongoSettings(uri="mongodb://mongo.invalid:27017")
    )
    return {service.name: service.definition().app(connections) for service in catalog.CONSUMING}


@pytest.fixture
def consumer_groups(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[tuple[str, str]]]:
    """(consumer group, topic) of every grouped subscriber, per service, with default settings.

    The apps are built, not started: nothing connects. The environment's QUIPU_* variables are
    removed first so the defaults (what the manifests deploy) are what is read.
    """
    for name in list(os.environ):
        if name.startswith("QUIPU_"):
            monkeypatch.delenv(name)
    groups: dict[str, set[tuple[str, str]]] = {}
    for service, app in _build_apps().items():
        groups[service] = {
            (subscriber.group_id, topic)
            for subscriber in _kafka_subscribers(app)
            if subscriber.group_id is not None
            for topic in subscriber.topic_names
        }
    return groups


def _kafka_subscribers(app: FastStream) -> list[LogicSubscriber[object]]:
    """The app's subscribers as what they are, Kafka subscribers (with a group and topics):
    FastStream types `broker.subscribers` as its broker-neutral base."""
    assert app.broker is not None
    subscribers: list[LogicSubscriber[object]] = []
    for subscriber in app.broker.subscribers:
        assert isinstance(subscriber, LogicSubscriber), subscriber
        subscribers.append(subscriber)
    return subscribers


# -- what the files say --------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted([COMPOSE_FILE, *K8S.glob("*.yaml")])


def compose() -> dict[str, Any]:
    return yaml_mapping(COMPOSE_FILE)


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    return yaml_documents(K8S)


def k8s(kind: str, *, include_template: bool = False) -> list[dict[str, Any]]:
    return [
        document
        for file, document in k8s_documents()
        if document["kind"] == kind and (include_template or file != SECRET_TEMPLATE.name)
    ]


def quipu_compose_services() -> dict[str, dict[str, Any]]:
    """Compose services that run a Quipu service (they set QUIPU_SERVICE)."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if "QUIPU_SERVICE" in service.get("environment", {})
    }


def compose_env(service: dict[str, Any]) -> dict[str, Any]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "environment as a mapping"
    return environment


def deployments() -> dict[str, dict[str, Any]]:
    """Deployments by the QUIPU_SERVICE they run."""
    found: dict[str, dict[str, Any]] = {}
    for deployment in k8s("Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        (service,) = [
            entry["value"] for entry in container.get("env", []) if entry["name"] == "QUIPU_SERVICE"
        ]
        assert service not in found, f"two Deployments run {service}"
        found[service] = deployment
    return found


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def config_map() -> dict[str, str]:
    (only,) = k8s("ConfigMap")
    data = only["data"]
    assert isinstance(data, dict)
    return data


def env_names(deployment: dict[str, Any]) -> set[str]:
    return {entry["name"] for entry in container(deployment).get("env", [])}


def secret_refs(deployment: dict[str, Any]) -> set[str]:
    """Names of the Secrets a Deployment reads, by env entry or envFrom."""
    spec = container(deployment)
    names = {
        entry["valueFrom"]["secretKeyRef"]["name"]
        for entry in spec.get("env", [])
        if "secretKeyRef" in entry.get("valueFrom", {})
    }
    names |= {source["secretRef"]["name"] for source in spec.get("envFrom", []) if "secretRef" in source}
    names |= {
        volume["secret"]["secretName"]
        for volume in deployment["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in volume
    }
    return names


def compose_topic_script() -> str:
    command = compose()["services"]["topics"]["command"]
    return "\n".join(command) if isinstance(command, list) else str(command)


def entrypoint() -> list[str]:
    (line,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    value = json.loads(line.removeprefix("ENTRYPOINT "))
    assert isinstance(value, list)
    return value


# -- every file parses ---------------------------------------------------------------------------


def test_every_yaml_file_parses_and_every_k8s_object_is_named_in_the_namespace() -> None:
    assert COMPOSE_FILE in yaml_files()
    assert len(yaml_files()) >= 7
    for path in yaml_files():
        assert list(yaml.safe_load_all(path.read_text())), f"{path} is empty"
    kinds = Counter(document["kind"] for _, document in k8s_documents())
    assert kinds["Namespace"] == 1
    objects = [(file, d) for file, d in k8s_documents() if d["kind"] != "Kustomization"]
    for file, document in objects:
        assert document.get("apiVersion"), file
        assert document["metadata"]["name"], file
        if document["kind"] in NAMESPACED:
            assert document["metadata"].get("namespace") == NAMESPACE, (file, document["metadata"]["name"])
    names = Counter((document["kind"], document["metadata"]["name"]) for _, document in objects)
    assert [key for key, count in names.items() if count > 1] == []


def test_kustomization_applies_everything_but_the_secret_template() -> None:
    (kustomization,) = k8s("Kustomization")
    expected = {path.name for path in K8S.glob("*.yaml")} - {"kustomization.yaml", SECRET_TEMPLATE.name}
    assert set(kustomization["resources"]) == expected
    assert kustomization["namespace"] == NAMESPACE


# -- topics --------------------------------------------------------------------------------------


def test_compose_topic_job_creates_every_registry_topic_and_dlq_with_its_partitions() -> None:
    created: dict[str, int] = {}
    for line in compose_topic_script().splitlines():
        if "kafka-topics.sh" not in line:
            continue
        topic = re.search(r"--topic (\S+)", line)
        partitions = re.search(r"--partitions (\d+)", line)
        assert topic and partitions, line
        assert "--create" in line and "--if-not-exists" in line, line
        assert "--replication-factor 1" in line, line  # one broker
        assert topic[1] not in created, f"{topic[1]} created twice"
        created[topic[1]] = int(partitions[1])
    assert created == registry_topics()


def test_strimzi_topics_are_every_registry_topic_and_dlq_with_three_replicas() -> None:
    declared: dict[str, int] = {}
    for resource in k8s("KafkaTopic"):
        spec = resource["spec"]
        name = spec.get("topicName", resource["metadata"]["name"])
        assert name not in declared, f"{name} declared twice"
        declared[name] = spec["partitions"]
        assert spec["replicas"] == 3, name
        assert int(spec["config"]["min.insync.replicas"]) == 2, name
        assert resource["metadata"]["labels"]["strimzi.io/cluster"], name
    assert declared == registry_topics()


def test_memory_changes_is_kept_forever_in_both() -> None:
    """A full reindex finds principals by reading memory.changes from the start (NOTES.md)."""
    (line,) = [line for line in compose_topic_script().splitlines() if "--topic memory.changes " in line]
    assert "--config retention.ms=-1" in line
    (resource,) = [r for r in k8s("KafkaTopic") if r["spec"]["topicName"] == "memory.changes"]
    assert int(resource["spec"]["config"]["retention.ms"]) == -1


@pytest.mark.parametrize("registry", ["tools.registry", "agents.registry"])
def test_the_registries_are_compacted_in_both(registry: str) -> None:
    """The planner replays each registry from the start: compaction keeps each key's latest entry."""
    (line,) = [line for line in compose_topic_script().splitlines() if f"--topic {registry} " in line]
    assert "--config cleanup.policy=compact" in line
    (resource,) = [r for r in k8s("KafkaTopic") if r["spec"]["topicName"] == registry]
    assert resource["spec"]["config"]["cleanup.policy"] == "compact"


def test_compose_broker_creates_no_topic_by_itself() -> None:
    kafka = compose()["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    environment = kafka["environment"]
    assert (
        "broker" in environment["KAFKA_PROCESS_ROLES"] and "controller" in environment["KAFKA_PROCESS_ROLES"]
    )
    assert str(environment["KAFKA_AUTO_CREATE_TOPICS_ENABLE"]) == "false"
    assert "healthcheck" in kafka


# -- services ------------------------------------------------------------------------------------


def test_the_catalog_is_every_service_package_with_the_groups_it_subscribes_with(
    consumer_groups: dict[str, set[tuple[str, str]]],
) -> None:
    assert service_packages() == service_modules()
    declared = {
        service.name: {(group, topic.value) for group, topic in service.consumes}
        for service in catalog.CONSUMING
    }
    assert declared == consumer_groups


def test_every_service_has_a_compose_service_and_a_deployment() -> None:
    services = service_modules()
    assert OWNER in services and len(services) == 7
    in_compose = Counter(
        compose_env(service)["QUIPU_SERVICE"] for service in quipu_compose_services().values()
    )
    assert set(in_compose) == services
    assert max(in_compose.values()) == 1
    assert set(deployments()) == services


def test_the_image_entrypoint_runs_exactly_the_services(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"pip install \.$", text, re.M)
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    command = entrypoint()
    script = command[command.index("-c") + 1]
    (listed,) = re.findall(r"case [^\n]*? in ([a-z_|]+)\)", script)
    assert set(listed.split("|")) == service_modules()

    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\necho "$@"\n')
    fake_python.chmod(0o755)

    def run(*args: str, service: str | None) -> subprocess.CompletedProcess[str]:
        environment = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
        if service is not None:
            environment["QUIPU_SERVICE"] = service
        return subprocess.run(
            ["/bin/sh", "-c", script, "quipu-entrypoint", *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=scaled(10),
            check=False,
        )

    started = run(service="storage_owner")
    assert (started.returncode, started.stdout.strip()) == (0, "-m quipu.services.storage_owner")
    assert run(service="os").returncode == 64
    assert run(service=None).returncode == 64
    assert run(service="planner;true").returncode == 64
    replaced = run("echo", "hello", service="planner")
    assert (replaced.returncode, replaced.stdout.strip()) == (0, "hello")


def test_every_compose_service_talks_to_real_kafka_after_the_topics_exist() -> None:
    for name, service in quipu_compose_services().items():
        environment = compose_env(service)
        assert environment["QUIPU_KAFKA_BOOTSTRAP"] == "kafka:9092", name
        assert environment["QUIPU_KAFKA_FLAVOUR"] == "kafka", name
        assert service["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
    assert config_map()["QUIPU_KAFKA_FLAVOUR"] == "kafka"


def test_compose_mongo_is_an_initiated_replica_set_with_a_short_transaction_lifetime() -> None:
    services = compose()["services"]
    command = services["mongo"]["command"]
    command_text = " ".join(command) if isinstance(command, list) else command
    assert "--replSet rs0" in command_text
    assert "--setParameter transactionLifetimeLimitSeconds=10" in command_text
    assert "healthcheck" in services["mongo"]
    init = services["mongo-init"]
    assert "rs.initiate" in "\n".join(init["command"])
    assert init["depends_on"]["mongo"]["condition"] == "service_healthy"
    owner = next(s for s in quipu_compose_services().values() if compose_env(s)["QUIPU_SERVICE"] == OWNER)
    assert owner["depends_on"]["mongo-init"]["condition"] == "service_completed_successfully"
    uri = str(compose_env(owner)["QUIPU_MONGO_URI"])
    assert "replicaSet=rs0" in uri


def test_only_the_storage_owner_reaches_mongodb() -> None:
    for name, service in quipu_compose_services().items():
        mongo = {key for key in compose_env(service) if key.startswith("QUIPU_MONGO_")}
        if compose_env(service)["QUIPU_SERVICE"] == OWNER:
            assert "QUIPU_MONGO_URI" in mongo
        else:
            assert mongo == set(), name
            assert not service.get("env_file"), f"{name}: an env_file could carry QUIPU_MONGO_URI"
    assert not [key for key in config_map() if key.startswith("QUIPU_MONGO_")]
    (owner_secret,) = [
        s["metadata"]["name"]
        for s in k8s("Secret", include_template=True)
        if "QUIPU_MONGO_URI" in s.get("stringData", s.get("data", {}))
    ]
    for deployed, deployment in deployments().items():
        mongo = {name for name in env_names(deployment) if name.startswith("QUIPU_MONGO_")}
        if deployed == OWNER:
            assert "QUIPU_MONGO_URI" in mongo
            assert owner_secret in secret_refs(deployment)
        else:
            assert mongo == set(), deployed
            assert owner_secret not in secret_refs(deployment), deployed


def test_only_the_model_services_hold_the_model_key() -> None:
    wanted = model_services()
    assert wanted == {"planner", "transcript_recorder", "fact_extractor"}
    in_compose = {
        compose_env(service)["QUIPU_SERVICE"]
        for service in quipu_compose_services().values()
        if "ANTHROPIC_API_KEY" in compose_env(service)
    }
    assert in_compose == wanted
    assert {service for service, d in deployments().items() if "ANTHROPIC_API_KEY" in env_names(d)} == wanted


def test_no_secret_value_is_written_into_any_file() -> None:
    # compose: a secret comes from the environment or .env (`${NAME}` / `${NAME:-}`); a default
    # is allowed for the MongoDB URI only, and never with credentials.
    for name, service in compose()["services"].items():
        for key, value in compose_env(service).items():
            if not SECRET_NAME.search(key):
                continue
            match = re.fullmatch(r"\$\{(\w+)(?::?-([^}]*))?\}", str(value))
            assert match and match[1] == key, f"{name}: {key} must be ${{{key}}} from the environment"
            default = match[2] or ""
            assert default == "" or key == "QUIPU_MONGO_URI", f"{name}: {key} has a default"
            assert not CREDENTIALS_IN_URI.search(default), f"{name}: credentials in {key}"
    # Kubernetes: secrets only through secretKeyRef, never in a ConfigMap or a literal value.
    assert not [key for key in config_map() if SECRET_NAME.search(key)]
    for service, deployment in deployments().items():
        for entry in container(deployment).get("env", []):
            if SECRET_NAME.search(entry["name"]):
                assert "value" not in entry, f"{service}: {entry['name']} inline"
                assert "secretKeyRef" in entry["valueFrom"], f"{service}: {entry['name']}"
    # The template holds placeholders only; no other file holds a Secret.
    for file, document in k8s_documents():
        if document["kind"] == "Secret":
            assert file == SECRET_TEMPLATE.name
            values = {**document.get("stringData", {}), **document.get("data", {})}
            assert values
            for key, value in values.items():
                assert re.fullmatch(r"<[a-z0-9-]+>", str(value)), f"{key} is not a placeholder"
    # Nothing anywhere looks like a key, a private key or a URI with credentials.
    for path in [*yaml_files(), DOCKERFILE, DEPLOY / "README.md"]:
        text = path.read_text()
        for pattern in SECRET_LOOKING:
            assert not pattern.search(text), f"{path.name}: {pattern.pattern}"


# -- scaling -------------------------------------------------------------------------------------


def test_keda_scales_every_consumer_on_the_groups_and_topics_it_subscribes_with(
    consumer_groups: dict[str, set[tuple[str, str]]],
) -> None:
    assert consumer_groups["planner"] == {
        ("planner-requests", "runs.requested"),
        ("planner-control", "runs.control"),
        ("planner-results", "tools.results"),
    }
    assert set(consumer_groups) == service_modules() - HTTP_SERVICES
    by_deployment = {d["metadata"]["name"]: service for service, d in deployments().items()}
    partitions = registry_topics()
    bootstrap = config_map()["QUIPU_KAFKA_BOOTSTRAP"]
    scaled: dict[str, set[tuple[str, str]]] = {}
    for scaled_object in k8s("ScaledObject"):
        spec = scaled_object["spec"]
        target = spec["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment"
        service = by_deployment[target["name"]]
        assert service not in scaled, f"two ScaledObjects for {service}"
        triggers = spec["triggers"]
        scaled[service] = set()
        for trigger in triggers:
            assert trigger["type"] == "kafka"
            metadata = trigger["metadata"]
            assert metadata["bootstrapServers"] == bootstrap
            assert metadata["offsetResetPolicy"] == KafkaSettings.model_fields["auto_offset_reset"].default
            assert isinstance(metadata["lagThreshold"], str) and int(metadata["lagThreshold"]) > 0
            scaled[service].add((metadata["consumerGroup"], metadata["topic"]))
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["maxReplicaCount"] <= min(partitions[t["metadata"]["topic"]] for t in triggers)
    assert scaled == consumer_groups


def test_lag_scaled_deployments_leave_their_replicas_to_keda() -> None:
    targets = {o["spec"]["scaleTargetRef"]["name"] for o in k8s("ScaledObject")}
    for service, deployment in deployments().items():
        if deployment["metadata"]["name"] in targets:
            assert "replicas" not in deployment["spec"], service
        else:
            assert deployment["spec"]["replicas"] >= 1, service


# -- Deployments ---------------------------------------------------------------------------------


def test_every_deployment_is_bounded_and_unprivileged() -> None:
    for service, deployment in deployments().items():
        pod = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, service
        spec = container(deployment)
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(spec["resources"][bound]), (service, bound)
        assert spec["securityContext"]["allowPrivilegeEscalation"] is False, service
        assert {"configMapRef": {"name": "quipu-config"}} in spec["envFrom"], service


def test_the_gateway_listens_on_every_interface_and_is_ready_on_healthz() -> None:
    assert "/healthz" in {getattr(route, "path", None) for route in health_router.routes}
    gateway = deployments()["gateway"]
    spec = container(gateway)
    environment = {entry["name"]: entry.get("value") for entry in spec["env"]}
    assert environment["QUIPU_GATEWAY_HOST"] == "0.0.0.0"
    (port,) = spec["ports"]
    assert str(port["containerPort"]) == environment["QUIPU_GATEWAY_PORT"]
    probe = spec["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] in {port["name"], port["containerPort"]}
    service = next(s for s in k8s("Service") if s["metadata"]["name"] == "gateway")
    assert service["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["type"] == "ClusterIP"  # no authentication yet
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {port["name"], port["containerPort"]}

    in_compose = next(
        s for s in quipu_compose_services().values() if compose_env(s)["QUIPU_SERVICE"] == "gateway"
    )
    assert compose_env(in_compose)["QUIPU_GATEWAY_HOST"] == "0.0.0.0"
    assert "/healthz" in " ".join(in_compose["healthcheck"]["test"])
    assert all(str(mapping).startswith("127.0.0.1:") for mapping in in_compose["ports"])


def test_every_service_can_reach_the_owners_key_endpoint_with_the_shared_token() -> None:
    owner = deployments()["storage_owner"]
    spec = container(owner)
    environment = {entry["name"]: entry.get("value") for entry in spec["env"]}
    (keys_port,) = (port for port in spec["ports"] if port["name"] == "keys")
    assert str(keys_port["containerPort"]) == environment["QUIPU_OWNER_KEYS_PORT"]
    assert environment["QUIPU_OWNER_KEYS_HOST"] == "0.0.0.0"
    service = next(s for s in k8s("Service") if s["metadata"]["name"] == "storage-owner-keys")
    assert service["spec"]["selector"].items() <= owner["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "keys"
    assert config_map()["QUIPU_KEYS_URL"] == f"http://storage-owner-keys.quipu.svc:{port['port']}"
    for name, deployment in deployments().items():
        (token,) = (entry for entry in container(deployment)["env"] if entry["name"] == "QUIPU_KEYS_TOKEN")
        assert token["valueFrom"]["secretKeyRef"]["name"] == "quipu-keys", name
    for service_in_compose in quipu_compose_services().values():
        compose_environment = compose_env(service_in_compose)
        assert compose_environment["QUIPU_KEYS_URL"] == "http://storage-owner:8711"
        assert compose_environment["QUIPU_KEYS_TOKEN"] == "${QUIPU_KEYS_TOKEN:-}"


def test_no_tabs_in_the_manifests() -> None:
    for path in yaml_files():
        assert "\t" not in path.read_text(), path.name
