"""`quipu agents apply|list|delete` against the real embedded broker: YAML and TOML files, what the
registry then holds, and a bad file's error (which agent and field, never a value)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner, Result

from quipu.services.cli import app
from quipu.services.domain.agent_publisher import registered_agents
from quipu.services.kit.settings import KafkaSettings

SECRET = "sk-live-never-shown"

YAML = """\
agents:
  - id: forecaster
    instructions: You answer questions about the weather.
    description: Answers questions about the weather.
    tools: [current_time, helper]
    max_steps: 4
    model: claude-forecaster
  - id: helper
    instructions: You help.
"""

TOML = """\
id = "accountant"
instructions = "You add numbers."
tools = ["calculator"]
memory_opt_out = true
"""


async def quipu(kafka: KafkaSettings, *arguments: str) -> Result:
    environment = {
        "QUIPU_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "QUIPU_KAFKA_FLAVOUR": "tansu",
        "QUIPU_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
    }
    return await asyncio.to_thread(CliRunner().invoke, app, list(arguments), env=environment)


async def test_apply_a_yaml_and_a_toml_file_then_list_and_delete(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    (tmp_path / "agents.yaml").write_text(YAML, encoding="utf-8")
    (tmp_path / "accountant.toml").write_text(TOML, encoding="utf-8")

    applied = await quipu(kafka_settings, "agents", "apply", str(tmp_path / "agents.yaml"))
    assert applied.exit_code == 0, applied.output
    assert "applied 2 agent(s): forecaster, helper" in applied.output
    applied = await quipu(kafka_settings, "agents", "apply", str(tmp_path / "accountant.toml"))
    assert applied.exit_code == 0, applied.output

    registry, skipped = await registered_agents(kafka_settings)
    assert (registry.registered(), skipped) == (["accountant", "forecaster", "helper"], 0)
    forecaster = registry.get_agent("forecaster")
    assert (forecaster.tools, forecaster.max_steps, forecaster.model) == (
        ["current_time", "helper"],
        4,
        "claude-forecaster",
    )
    assert registry.get_agent("accountant").memory_opt_out

    listed = await quipu(kafka_settings, "agents", "list")
    assert listed.exit_code == 0, listed.output
    for shown in ("forecaster", "claude-forecaster", "accountant", "calculator", "(default)"):
        assert shown in listed.output

    deleted = await quipu(kafka_settings, "agents", "delete", "helper")
    assert deleted.exit_code == 0, deleted.output
    registry, _ = await registered_agents(kafka_settings)
    assert registry.registered() == ["accountant", "forecaster"]


async def test_a_bad_file_is_refused_naming_the_agent_and_field_and_nothing_is_published(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"- id: fine\n  instructions: {SECRET}\n- id: broken\n  instructions: {SECRET}\n  max_steps: -1\n",
        encoding="utf-8",
    )
    result = await quipu(kafka_settings, "agents", "apply", str(bad))
    assert result.exit_code == 1
    assert "agent 'broken': max_steps: Input should be greater than or equal to 1" in result.output
    assert SECRET not in result.output
    registry, _ = await registered_agents(kafka_settings)
    assert registry.registered() == []
