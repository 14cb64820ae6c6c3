"""One settings vocabulary: renamed variables still read (deprecated), shared fields alike, the model
settings passed in with the rest."""

from __future__ import annotations

import pytest

from quipu.services.cli.settings import CliSettings
from quipu.services.domain.models.factory import ModelSettings
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.enricher.settings import EnricherSettings
from quipu.services.fact_extractor.adapters import open_model
from quipu.services.fact_extractor.settings import FactExtractorSettings
from quipu.services.gateway.settings import GatewaySettings
from quipu.services.kit.settings import KafkaSettings
from quipu.services.planner.settings import PlannerSettings
from quipu.services.storage_owner.settings import OwnerSettings
from quipu.services.tool_executor.settings import ToolExecutorSettings
from quipu.services.transcript_recorder.adapters import summarizer
from quipu.services.transcript_recorder.settings import TranscriptRecorderSettings

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9")
SERVICES = (
    CliSettings,
    EnricherSettings,
    FactExtractorSettings,
    GatewaySettings,
    OwnerSettings,
    PlannerSettings,
    ToolExecutorSettings,
    TranscriptRecorderSettings,
)


def test_the_enricher_reads_its_old_variables_and_says_which_replace_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUIPU_ENRICHER_ATTEMPTS", "4")
    monkeypatch.setenv("QUIPU_ENRICHER_STORE_TIMEOUT_S", "2.5")
    with pytest.warns(FutureWarning) as warned:
        settings = EnricherSettings()
    assert (settings.retry_attempts, settings.store_reply_timeout_s) == (4, 2.5)
    said = " ".join(str(warning.message) for warning in warned)
    assert "set QUIPU_ENRICHER_RETRY_ATTEMPTS instead" in said
    assert "set QUIPU_ENRICHER_STORE_REPLY_TIMEOUT_S instead" in said


def test_a_new_variable_wins_over_the_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIPU_ENRICHER_ATTEMPTS", "4")
    monkeypatch.setenv("QUIPU_ENRICHER_RETRY_ATTEMPTS", "6")
    with pytest.warns(FutureWarning):
        assert EnricherSettings().retry_attempts == 6


def test_an_old_name_is_read_only_under_the_service_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTEMPTS", "9")
    monkeypatch.setenv("STORE_TIMEOUT_S", "9")
    settings = EnricherSettings()
    assert (settings.retry_attempts, settings.store_reply_timeout_s) == (3, 5.0)


def test_the_old_keywords_still_build_the_settings() -> None:
    with pytest.warns(FutureWarning, match="QUIPU_ENRICHER_ATTEMPTS"):
        assert EnricherSettings(attempts=2).retry_attempts == 2


@pytest.mark.parametrize("name", ["group", "retry_attempts", "store_reply_timeout_s", "store_attempts"])
def test_a_shared_field_has_one_type_and_one_bound_in_every_service(name: str) -> None:
    fields = [service.model_fields[name] for service in SERVICES if name in service.model_fields]
    assert len(fields) >= 2
    assert len({(field.annotation, repr(field.metadata)) for field in fields}) == 1


@pytest.mark.parametrize("old", ["attempts", "store_timeout_s"])
def test_no_service_declares_a_field_under_an_old_name(old: str) -> None:
    assert [service.__name__ for service in SERVICES if old in service.model_fields] == []


def test_each_consumer_has_its_own_group() -> None:
    groups = [service().model_dump().get("group") for service in SERVICES]
    named = [group for group in groups if group]
    assert len(named) == 6
    assert len(set(named)) == len(named)


def test_the_recorder_and_extractor_call_the_model_their_settings_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted = ModelSettings(provider="scripted")
    recorder = TranscriptRecorderSettings(model=scripted)
    extractor = FactExtractorSettings(model=scripted)
    # Read again from here on, the environment would ask for Anthropic without a key.
    monkeypatch.setenv("QUIPU_MODEL_PROVIDER", "anthropic")
    assert isinstance(summarizer(KAFKA, recorder).model, ScriptedModel)
    assert isinstance(open_model(KAFKA, extractor), ScriptedModel)


def test_model_settings_are_read_when_the_service_settings_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIPU_MODEL_NAME", "claude-test")
    for service in (PlannerSettings, TranscriptRecorderSettings, FactExtractorSettings):
        assert service().model.name == "claude-test"


def test_an_unrelated_api_key_variable_is_not_taken_for_the_anthropic_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # API_KEY is a common name for some other service's secret: sending it to Anthropic would leak
    # it, and would switch the offline scripted model off.
    monkeypatch.setenv("API_KEY", "sk-someone-elses")
    settings = ModelSettings()
    assert settings.api_key is None
    assert not settings.uses_anthropic


@pytest.mark.parametrize("variable", ["ANTHROPIC_API_KEY", "QUIPU_MODEL_API_KEY"])
def test_the_anthropic_key_comes_from_its_two_variables_or_the_keyword(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "sk-test")
    given = ModelSettings().api_key
    assert given is not None and given.get_secret_value() == "sk-test"
    keyword = ModelSettings(api_key="sk-keyword").api_key
    assert keyword is not None and keyword.get_secret_value() == "sk-keyword"


def test_key_settings_are_read_when_a_service_s_settings_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIPU_KEYS_URL", "http://owner:8711")
    for service in SERVICES:
        assert service().keys.url == "http://owner:8711"
