"""structlog setup shared by every service.

- JSON lines when stderr is not a terminal, a pretty console when it is
  (`ServiceSettings.json_logs` overrides the guess).
- Library logs (FastStream, aiokafka, pymongo) go through the same chain, so
  they are rendered and redacted the same way.
- Every line carries `service`; `bind_ids` / `bound_ids` add `run_id`,
  `session_id`, `tenant_id`, `event_id` (and topic/partition/offset) for the
  current task through context variables.

Two rules hold for every line, enforced by processors that run just before
rendering, whoever logged it:

1. Secrets never reach the output: values under keys that name a secret
   (password, secret, token, api_key, authorization, cookie, credential...)
   are masked, and so is anything inside any string that looks like an API key
   (`sk-...`) or a bearer token.
2. Message bodies are not logged at INFO or above: values under body-like keys
   (`body`, `payload`, `content`, `prompt`, `messages`, `completion`, `text`,
   `raw`) are replaced by their size. Log identifiers (`event_id`, topic,
   offset) instead; put a body under one of those keys at DEBUG when you need
   to see it.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
from collections.abc import Iterator, Mapping, Sized
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from services.kit.settings import ServiceSettings

REDACTED = "[REDACTED]"

SECRET_KEY_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "cookie",
        "credential",
        "credentials",
        "dsn",
    }
)
"""A key containing one of these words (`db_password`, `X-Api-Key`, `accessToken`) is masked.

Words, not substrings: `input_tokens` or `max_tokens` are counts, not secrets."""

SECRET_KEY_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
"""Two adjacent words that name a secret together (`api_key`, `aws_access_key_id`)."""

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SEPARATORS = re.compile(r"[^a-z0-9]+")


def is_secret_key(key: str) -> bool:
    """Whether a log key names a secret, so its value must never be written."""
    words = _WORD_SEPARATORS.split(_CAMEL_BOUNDARY.sub("_", key).lower())
    if SECRET_KEY_WORDS.intersection(words):
        return True
    return any(pair in SECRET_KEY_PAIRS for pair in itertools.pairwise(words))


SECRET_VALUE_PATTERN = re.compile(
    r"\bsk-[A-Za-z0-9_\-]{8,}"  # Anthropic / OpenAI style API keys
    r"|(?<=Bearer )[A-Za-z0-9_\-.=~+/]{8,}"  # bearer tokens inside header dumps
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",  # user:password inside a connection URI
    re.IGNORECASE,
)
"""Text that looks like a credential wherever it appears in a string."""

BODY_KEYS = frozenset({"body", "payload", "content", "prompt", "messages", "completion", "text", "raw"})
"""Keys that hold message bodies: logged only at DEBUG (rule 2 of the module docstring)."""

_BODY_LEVELS = frozenset({"debug", "notset"})
_HANDLER_MARK = "_quipu_handler"


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask secret-named keys and secret-looking text, recursively."""
    return {key: _redact_item(key, value) for key, value in event_dict.items()}


def _redact_item(key: object, value: Any) -> Any:
    """Mask `value` entirely when its key names a secret, else scrub what it contains."""
    if isinstance(key, str) and is_secret_key(key):
        return REDACTED
    return _redact_value(value)


def _redact_value(value: Any) -> Any:
    """Scrub secret-looking text in a value of any shape (str, mapping, list, tuple)."""
    if isinstance(value, str):
        return SECRET_VALUE_PATTERN.sub(REDACTED, value)
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact_value(item) for item in value]
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    return value


def omit_bodies(_logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: replace message bodies by their size unless the line is DEBUG."""
    level = str(event_dict.get("level", method)).lower()
    if level in _BODY_LEVELS:
        return event_dict
    for key in BODY_KEYS.intersection(event_dict):
        event_dict[key] = _size_of(event_dict[key])
    return event_dict


def _size_of(value: Any) -> str:
    """A short stand-in for an omitted body that still helps debugging."""
    if isinstance(value, str | bytes | bytearray):
        return f"<omitted: {len(value)} chars>"
    if isinstance(value, Sized):
        return f"<omitted: {len(value)} items>"
    return "<omitted>"


def _default_service(service: str) -> Processor:
    """Processor adding `service` unless the logger bound another one (several per process)."""

    def add_service(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return add_service


def _use_json(settings: ServiceSettings, stream: TextIO) -> bool:
    """JSON unless told otherwise or writing to a terminal."""
    if settings.json_logs is not None:
        return settings.json_logs
    return not (hasattr(stream, "isatty") and stream.isatty())


def _shared_processors(service: str) -> list[Processor]:
    """Processors applied to structlog and library lines alike, before the formatter."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _default_service(service),
    ]


def _final_processors(json_lines: bool) -> list[Processor]:
    """Redaction, body omission and rendering: the last steps before a line is written."""
    renderer: Processor
    if json_lines:
        # Tracebacks become a string first so that redaction sees them too.
        steps: list[Processor] = [structlog.processors.format_exc_info]
        renderer = structlog.processors.JSONRenderer()
    else:
        steps = []
        renderer = structlog.dev.ConsoleRenderer()
    return [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        *steps,
        omit_bodies,
        redact_secrets,
        renderer,
    ]


def configure_logging(settings: ServiceSettings, *, stream: TextIO | None = None) -> None:
    """Route structlog and standard-library logging to `stream` (stderr) with Quipu's rules.

    Idempotent: calling it again replaces the handler it installed before and
    leaves other handlers (pytest's capture, for instance) alone.
    """
    output = stream if stream is not None else sys.stderr
    shared = _shared_processors(settings.service_name)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached, so that a later configure_logging (tests) reaches module-level loggers.
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=_final_processors(_use_json(settings, output)),
    )
    handler = logging.StreamHandler(output)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)


def get_logger(name: str | None = None, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger, optionally with values bound (`service="planner"` in `quipu up`)."""
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger.bind(**bound) if bound else logger


def _present(
    run_id: str | None,
    session_id: str | None,
    tenant_id: str | None,
    event_id: str | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The identifiers that have a value (None means 'not known here', not 'null')."""
    ids = {"run_id": run_id, "session_id": session_id, "tenant_id": tenant_id, "event_id": event_id}
    return {key: value for key, value in {**ids, **extra}.items() if value is not None}


def bind_ids(
    *,
    run_id: str | None = None,
    session_id: str | None = None,
    tenant_id: str | None = None,
    event_id: str | None = None,
    **extra: Any,
) -> None:
    """Bind identifiers to every line logged from the current task from now on."""
    structlog.contextvars.bind_contextvars(**_present(run_id, session_id, tenant_id, event_id, extra))


@contextmanager
def bound_ids(
    *,
    run_id: str | None = None,
    session_id: str | None = None,
    tenant_id: str | None = None,
    event_id: str | None = None,
    **extra: Any,
) -> Iterator[None]:
    """Bind identifiers for the duration of a `with` block (a handler's message), then restore."""
    values = _present(run_id, session_id, tenant_id, event_id, extra)
    with structlog.contextvars.bound_contextvars(**values):
        yield


def clear_ids() -> None:
    """Forget every identifier bound to the current task."""
    structlog.contextvars.clear_contextvars()
