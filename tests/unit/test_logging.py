"""The logging rules: secrets never reach the output, bodies only at DEBUG."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from quipu.services.kit.logging import (
    REDACTED,
    RepeatLimit,
    bind_ids,
    bound_ids,
    get_logger,
    is_secret_key,
    omit_bodies,
    redact_secrets,
)
from tests.support.log_capture import log_lines as _lines

API_KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def _redact(**event: Any) -> dict[str, Any]:
    return dict(redact_secrets(None, "info", event))


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db_password",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "api_key",
        "X-Api-Key",
        "apiKey",
        "Authorization",
        "cookie",
        "credentials",
        "aws_access_key_id",
        "private_key",
        "refreshToken",
    ],
)
def test_secret_keys_are_masked(key: str) -> None:
    assert _redact(**{key: "hunter2"})[key] == REDACTED


@pytest.mark.parametrize(
    "key", ["input_tokens", "max_tokens", "event_id", "session_key", "idempotency_key", "keys"]
)
def test_ordinary_keys_are_kept(key: str) -> None:
    assert not is_secret_key(key)
    assert _redact(**{key: 12})[key] == 12


def test_secret_keys_are_masked_at_any_depth() -> None:
    event = _redact(
        request={"headers": {"Authorization": "Bearer abc", "accept": "json"}},
        attempts=[{"api_key": "x"}, ("password", "y")],
    )
    assert event["request"] == {"headers": {"Authorization": REDACTED, "accept": "json"}}
    assert event["attempts"] == [{"api_key": REDACTED}, ["password", "y"]]


def test_api_keys_inside_any_text_are_masked() -> None:
    event = _redact(event=f"calling with {API_KEY} now", detail=[f"key={API_KEY}"])
    assert event["event"] == f"calling with {REDACTED} now"
    assert event["detail"] == [f"key={REDACTED}"]
    assert API_KEY not in json.dumps(event)


def test_bearer_tokens_and_uri_passwords_are_masked() -> None:
    event = _redact(
        header="Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def",
        uri="mongodb://quipu:s3cr3t-pw@db:27017/?retryWrites=false",
    )
    assert event["header"] == f"Authorization: Bearer {REDACTED}"
    assert event["uri"] == f"mongodb://{REDACTED}@db:27017/?retryWrites=false"


def test_ordinary_text_is_untouched() -> None:
    event = _redact(event="run started", note="task-123 sk-short skeleton")
    assert event == {"event": "run started", "note": "task-123 sk-short skeleton"}


def test_bodies_are_omitted_above_debug_and_kept_at_debug() -> None:
    info = omit_bodies(None, "info", {"level": "info", "body": "hello there", "event_id": "e1"})
    debug = omit_bodies(None, "debug", {"level": "debug", "body": "hello there"})
    assert info == {"level": "info", "body": "<omitted: 11 chars>", "event_id": "e1"}
    assert debug["body"] == "hello there"


def test_configured_logging_writes_redacted_json_with_ids(log_output: io.StringIO) -> None:
    log = get_logger("quipu.test")
    bind_ids(tenant_id="t1")
    with bound_ids(run_id="r1", session_id="s1", event_id=None):
        log.info("model.call", api_key=API_KEY, prompt="tell me a secret", input_tokens=7)
    log.debug("model.reply", content="the answer")

    first, second = _lines(log_output)
    assert first["event"] == "model.call"
    assert first["service"] == "tests"
    assert (first["tenant_id"], first["run_id"], first["session_id"]) == ("t1", "r1", "s1")
    assert "event_id" not in first
    assert first["api_key"] == REDACTED
    assert first["prompt"].startswith("<omitted")
    assert first["input_tokens"] == 7
    assert "run_id" not in second  # the `with` block ended
    assert second["content"] == "the answer"  # DEBUG may show bodies
    assert API_KEY not in log_output.getvalue()


def test_library_logs_and_tracebacks_are_redacted_too(log_output: io.StringIO) -> None:
    logging.getLogger("aiokafka").warning("auth failed for %s", API_KEY, extra={"token": "t"})
    try:
        raise ValueError(f"bad key {API_KEY}")
    except ValueError:
        get_logger("quipu.test").exception("call.failed")

    library, failure = _lines(log_output)
    assert library["event"] == "auth failed for <value>", "a library warning shows no values"
    assert library["token"] == REDACTED
    assert library["service"] == "tests"
    assert "ValueError: bad key " + REDACTED in failure["exception"]
    assert API_KEY not in log_output.getvalue()


def test_a_bound_service_wins_over_the_default(log_output: io.StringIO) -> None:
    get_logger("quipu.planner", service="planner").info("ready")
    assert _lines(log_output)[0]["service"] == "planner"


SECRET_INPUT = "tell-no-one-7f3a"


class _Count(BaseModel):
    count: int


def test_tracebacks_and_texts_never_show_a_refused_input_value(log_output: io.StringIO) -> None:
    try:
        _Count.model_validate({"count": SECRET_INPUT})
    except ValidationError as error:
        get_logger("quipu.test").exception("decode.failed", detail=str(error), error=error)
        logging.getLogger("aiokafka.consumer").error("handler failed", exc_info=True)
    own, library = _lines(log_output)
    assert "count: Input should be a valid integer" in own["exception"]
    assert "input_value=<omitted>" in own["detail"]
    assert own["error"].startswith("ValidationError: count")
    assert "ValidationError" in library["exception"]
    assert SECRET_INPUT not in log_output.getvalue()


def test_a_library_error_line_shows_its_template_and_numbers_only(log_output: io.StringIO) -> None:
    logging.getLogger("aiokafka.cluster").error("'%s' is not a valid topic name", SECRET_INPUT)
    logging.getLogger("aiokafka").warning("partition %s lagging by %s", 3, 12.5)
    logging.getLogger("aiokafka").info("joined group %s", "quipu-planner")
    invalid, lagging, joined = _lines(log_output)
    assert invalid["event"] == "'<value>' is not a valid topic name"
    assert lagging["event"] == "partition 3 lagging by 12.5"
    assert joined["event"] == "joined group quipu-planner", "info lines of libraries keep their values"
    assert SECRET_INPUT not in log_output.getvalue()


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("aiokafka", level, __file__, 1, message, (), None)


def test_a_repeated_warning_is_written_a_burst_per_window_and_says_what_it_held_back() -> None:
    now = [0.0]
    limit = RepeatLimit(burst=3, window_s=10.0, clock=lambda: now[0])
    written = [limit.filter(_record("metadata refresh failed")) for _ in range(34)]
    assert written.count(True) == 3
    assert limit.filter(_record("another failure")), "other lines are not held back"
    assert all(limit.filter(_record("fine", logging.INFO)) for _ in range(50)), "INFO is not limited"
    now[0] = 10.5
    record = _record("metadata refresh failed")
    assert limit.filter(record)
    assert record.suppressed == 31  # type: ignore[attr-defined]
