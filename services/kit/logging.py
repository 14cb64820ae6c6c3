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
3. Input values never reach the output: exceptions are rendered by `safe_exception` (frames, the
   exception's type and `describe_error`, never a pydantic error's `input_value=` or a quoted
   value), `input_value=` fragments in any text are cut, and a library's warning or error line
   shows its message template with placeholders for the values (aiokafka's
   "'%s' is not a valid topic name" would otherwise echo a topic taken from a message).
4. Repeated warnings are rate-limited: the same line (logger, level, event) at WARNING or above is
   written at most `ServiceSettings.log_repeat_burst` times per `log_repeat_window_s`; the next one
   that gets through says how many were left out (`suppressed`). A wedged consumer once wrote 34
   lines a second.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sized
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from quipu.services.kit.delivery import describe_error
from quipu.services.kit.settings import ServiceSettings

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


_INPUT_VALUE = re.compile(r"input_value=.*?(?=, input_type=|\]$|$)", re.MULTILINE)
"""pydantic's rendering of the value it refused, inside a validation error's text."""

_TRACEBACK_FRAMES = 40
"""Innermost frames kept of a traceback (a RecursionError's would be a thousand)."""


def _redact_value(value: Any) -> Any:
    """Scrub secret-looking text and input values in a value of any shape (str, mapping, list, tuple)."""
    if isinstance(value, str):
        return SECRET_VALUE_PATTERN.sub(REDACTED, _INPUT_VALUE.sub("input_value=<omitted>", value))
    if isinstance(value, BaseException):
        return describe_error(value)
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


def safe_exception(error: BaseException) -> str:
    """A traceback that shows where and what failed, never what the failing input held.

    Frames (file, line, code) as usual; each exception of the chain as its type and
    `describe_error`, instead of `str(error)` (a pydantic error lists every refused value).
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts = []
    for exception in reversed(chain):
        frames = traceback.extract_tb(exception.__traceback__)[-_TRACEBACK_FRAMES:]
        kind = type(exception)
        parts.append(
            "Traceback (most recent call last):\n"
            + "".join(traceback.format_list(frames))
            + f"{kind.__module__}.{kind.__qualname__}: {describe_error(exception).partition(': ')[2]}"
        )
    return "\n\nWhile handling the above, another exception occurred:\n\n".join(parts)


def render_exceptions_safely(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: `exc_info` becomes an `exception` string made by `safe_exception`."""
    exc_info = event_dict.pop("exc_info", None)
    if exc_info is None or exc_info is False:
        return event_dict
    if isinstance(exc_info, BaseException):
        error: BaseException | None = exc_info
    elif isinstance(exc_info, tuple):
        error = exc_info[1]
    else:
        error = sys.exc_info()[1]
    if error is not None:
        event_dict["exception"] = safe_exception(error)
    return event_dict


def _placeholder(value: object) -> object:
    """A library line's argument, as a warning may show it: numbers, else only its kind."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, BaseException):
        return type(value).__name__
    return "<value>"


def library_values_hidden(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Foreign-chain processor: a library's warning or error shows its template, not its arguments."""
    args = event_dict.pop("positional_args", ())
    # Another handler may have formatted the record first: its rendered text came along as an extra.
    event_dict.pop("message", None)
    record = event_dict.get("_record")
    if not isinstance(record, logging.LogRecord) or record.levelno < logging.WARNING or not args:
        return event_dict
    values = args if isinstance(args, tuple) else (args,)
    try:
        event_dict["event"] = str(record.msg) % tuple(_placeholder(value) for value in values)
    except (TypeError, ValueError):
        event_dict["event"] = str(record.msg)
    return event_dict


class RepeatLimit(logging.Filter):
    """Lets the same warning through `burst` times per `window_s`; counts what it holds back."""

    def __init__(
        self,
        burst: int,
        window_s: float,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._burst = burst
        self._window_s = window_s
        self._max_keys = max_keys
        self._windows: dict[tuple[str, int, str], list[float]] = {}
        """Per line: [window start, lines written in it, lines held back since the last written]."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to write `record`; a written one carries `suppressed` when others were held back."""
        if record.levelno < logging.WARNING:
            return True
        event = record.msg.get("event", "") if isinstance(record.msg, dict) else record.msg
        key = (record.name, record.levelno, str(event)[:200])
        now = self._clock()
        if len(self._windows) >= self._max_keys and key not in self._windows:
            self._windows.clear()
        window = self._windows.setdefault(key, [now, 0, 0])
        if now - window[0] >= self._window_s:
            window[0], window[1] = now, 0
        window[1] += 1
        if window[1] > self._burst:
            window[2] += 1
            return False
        if window[2]:
            suppressed = int(window[2])
            window[2] = 0
            if isinstance(record.msg, dict):
                record.msg["suppressed"] = suppressed
            else:
                record.suppressed = suppressed
        return True


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
    renderer: Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    )
    return [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        # Tracebacks become a string first (no renderer's own, with its locals), so that redaction
        # sees them too.
        render_exceptions_safely,
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
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), library_values_hidden],
        processors=_final_processors(_use_json(settings, output)),
        pass_foreign_args=True,  # for library_values_hidden
    )
    handler = logging.StreamHandler(output)
    handler.setFormatter(formatter)
    handler.addFilter(RepeatLimit(settings.log_repeat_burst, settings.log_repeat_window_s))
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
