"""docs/wire.md, generated from the contracts: every topic's key, headers and payload, the storage
command framing, reply routing and the dead-letter format, for people writing clients in other
languages.

    python -m quipu.contracts.wire_doc            # rewrite docs/wire.md
    python -m quipu.contracts.wire_doc --check    # exit 1 when docs/wire.md is not what the contracts say

The tables come from the models (field names, types, defaults, descriptions); the prose around
them is here. A test asserts that the committed file equals `render()`, and that the dead-letter
headers listed here are the ones the delivery wrapper writes.
"""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from quipu.contracts.commands import REPLY_PARTITION_HEADER, REPLY_TO_HEADER, StoreCommand
from quipu.contracts.envelope import Envelope
from quipu.contracts.errors import ErrorCode
from quipu.contracts.lifecycle import lifecycle_payload_keys
from quipu.contracts.store_operation import Backend, StoreOperation
from quipu.contracts.topics import TOPICS, Topic, dead_letter_topic

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "wire.md"
"""Where the generated document lives in the repository."""

PAYLOADS: dict[Topic, Any] = {spec.topic: spec.payload for spec in TOPICS}
"""The payload schema of every topic, as the registry names it."""

DEAD_LETTER_HEADERS: tuple[tuple[str, str], ...] = (
    (
        "x-dlq-reason",
        "`invalid_payload` (did not decode), `permanent_error` (refused, e.g. a bad reply "
        "route) or `unexpected_error` (a bug; replayable once fixed).",
    ),
    (
        "x-dlq-error",
        "What was wrong: field paths and rule names, never input values (at most 4,000 characters).",
    ),
    ("x-dlq-attempts", "How many times the effect was tried (`0`: it never decoded)."),
    ("x-dlq-topic", "Topic the message was consumed from."),
    ("x-dlq-partition", "Its partition."),
    ("x-dlq-offset", "Its offset."),
    (
        "x-dlq-body",
        "`omitted` when the original body did not fit the producer's request limit: the "
        "letter's body is then a JSON summary `{body_omitted, size, sha256, reason}`.",
    ),
    ("x-dlq-body-size", "With `x-dlq-body: omitted`: the original body's size in bytes."),
    ("x-dlq-body-sha256", "With `x-dlq-body: omitted`: hex SHA-256 of the original body."),
    (
        "x-dlq-headers",
        "`omitted` when the original headers were left off (too large, or the smallest "
        "letter after the broker refused the whole one).",
    ),
)
"""Headers the delivery wrapper adds to a dead letter (services/kit/delivery.py)."""

ROUTE_HEADERS: tuple[tuple[str, str, str], ...] = (
    (
        REPLY_PARTITION_HEADER,
        "ASCII decimal, `0` up to the topic's partition count minus one, no sign or leading zero",
        "the reply is published to that partition",
    ),
    (
        REPLY_TO_HEADER,
        "the replies topic's full name",
        "sent by older clients; accepted only when it names that very topic",
    ),
)
"""The reply-route headers of a storage command: header, value, meaning."""

_KEYS = {
    Backend.RUNTIME: "session id, else run id",
    Backend.MEMORY: "session id, else principal id",
    Backend.BOTH: "session id",
}


# --- types ------------------------------------------------------------------------------------------


def _anchor(name: str) -> str:
    return f"[`{name}`](#{name.lower()})"


def _type(annotation: Any) -> str:
    """A readable JSON type for a Python annotation; models and enums link to their tables."""
    origin = get_origin(annotation)
    arguments = get_args(annotation)
    if origin is Annotated:
        return _type(arguments[0])
    if origin is Literal:
        return " or ".join(f'`"{value}"`' for value in arguments)
    if origin in (Union, types.UnionType):
        members = [_type(member) for member in arguments if member is not type(None)]
        nullable = " or null" if type(None) in arguments else ""
        return " or ".join(members) + nullable
    if origin is list:
        return f"array of {_type(arguments[0])}"
    if origin is dict:
        return f"object of string to {_type(arguments[1])}"
    simple = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        bytes: "bytes (padded base64 string)",
        datetime: "timestamp",
        type(None): "null",
    }
    if annotation in simple:
        return simple[annotation]
    if annotation is Any:
        return "any JSON"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel | enum.Enum):
        return _anchor(annotation.__name__)
    raise TypeError(f"no wire type for {annotation!r}")


def _referenced(annotation: Any) -> Iterator[type]:
    """Models and enums an annotation mentions, in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel | enum.Enum):
        yield annotation
    for argument in get_args(annotation):
        yield from _referenced(argument)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return f"`{_json_literal(made)}`" if isinstance(made, list | dict) else "generated"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{_json_literal(field.default)}`"


def _json_literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return f'"{value.value}"'
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[]"
    if isinstance(value, dict):
        return "{}"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


# --- tables -----------------------------------------------------------------------------------------


def _own_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's fields without the envelope's (those are listed once, under Envelope)."""
    inherited = Envelope.model_fields if issubclass(model, Envelope) and model is not Envelope else {}
    return {name: field for name, field in model.model_fields.items() if name not in inherited}


def _model_table(model: type[BaseModel]) -> list[str]:
    lines = [f"### {model.__name__}", "", _cell((model.__doc__ or "").strip()), ""]
    if issubclass(model, Envelope) and model is not Envelope:
        lines += [f"Also carries every field of {_anchor('Envelope')}.", ""]
    fields = _own_fields(model)
    if not fields:
        return [*lines, "No fields of its own.", ""]
    lines += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in fields.items():
        lines.append(
            f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {_cell(field.description or '')} |"
        )
    return [*lines, ""]


def _enum_table(kind: type[enum.Enum]) -> list[str]:
    values = ", ".join(f"`{member.value}`" for member in kind)
    return [f"### {kind.__name__}", "", _cell((kind.__doc__ or "").strip()), "", f"Values: {values}.", ""]


def _commands() -> list[type[StoreOperation]]:
    union = get_args(StoreCommand)[0]
    return list(get_args(union))


def _closure(roots: list[Any]) -> tuple[list[type[BaseModel]], list[type[enum.Enum]]]:
    """Every model and enum reachable from `roots`, models in the order first met."""
    models: list[type[BaseModel]] = []
    enums: list[type[enum.Enum]] = []
    pending = list(roots)
    while pending:
        item = pending.pop(0)
        if isinstance(item, type) and issubclass(item, enum.Enum):
            if item not in enums:
                enums.append(item)
            continue
        if not (isinstance(item, type) and issubclass(item, BaseModel)) or item in models:
            pending[:0] = [found for found in _referenced(item) if found is not item]
            continue
        models.append(item)
        for field in item.model_fields.values():
            pending.extend(_referenced(field.annotation))
    return models, sorted(enums, key=lambda kind: kind.__name__)


# --- the document -----------------------------------------------------------------------------------

_INTRO = """\
# Quipu on the wire

What every Kafka topic carries, byte for byte, for people who write a producer or consumer in
another language. Generated from the contracts by `python -m quipu.contracts.wire_doc`; do not edit by
hand (a test fails when this file and the contracts disagree). The same, machine-readable:
[asyncapi.json](asyncapi.json), an AsyncAPI 3 document the gateway also serves at `/asyncapi.json`.

## Conventions

- **Values** are one UTF-8 JSON object per Kafka record. **Keys** are the UTF-8 bytes of the id the
  table names; they decide ordering only (everything of one session stays on one partition),
  never correctness.
- **Topic names** are the registry names below, each prefixed by the deployment's
  `QUIPU_KAFKA_TOPIC_PREFIX` (empty in production). Every topic has a dead-letter sibling
  `<topic>.dlq` with as many partitions.
- **Timestamps** are RFC 3339 strings with a UTC offset, written `YYYY-MM-DDTHH:MM:SS.mmmZ` (three
  fractional digits). Runtime store and memory timestamps have millisecond precision: a
  non-zero digit after the third is INVALID_ARGUMENT, and a non-zero digit after the sixth is
  refused wherever it appears; nothing is ever truncated.
- **Bytes** (record payloads, checkpoints) travel as padded standard base64 strings.
- **Identifiers** are strings compared byte for byte; `""` means absent.
- **Envelope**: every payload carries `event_id` (the idempotency key: consumers de-duplicate on
  it, and outputs derive theirs from it), `schema_version`, `occurred_at`, `tenant_id`,
  `correlation_id` and `causation_id` (see [`Envelope`](#envelope)).
- **Unknown fields**: topic payloads ignore fields they do not know, so an older consumer keeps
  working next to a newer producer. Storage commands are the exception (next section).
- **Sealed messages**: in a deployment with a key channel, a message that carries a person's
  words names whose data key seals them in `sealed_for` (`{tenant_id, principal_id}`, in clear)
  and carries its word-carrying fields (table below) as one padded base64 string in `sealed`
  instead: `version (1) | key tag (8) | nonce (12) | AES-256-GCM ciphertext and tag` of their JSON
  object, with the canonical JSON (sorted keys, no spaces) of every other field as associated
  data. Data keys come from the storage owner's key endpoint, never from a topic. A message
  without `sealed_for` is plain JSON and is accepted as such; once the person is forgotten, the
  key is gone and every sealed copy, dead letters included, is unreadable.
- **Headers**: no topic needs a header except `storage.commands` (reply routing). Producers built
  on FastStream add `content-type` and a `correlation_id` of their own; no Quipu consumer reads
  them. A FastStream `reply_to` header is ignored: no consumer publishes anything because a
  message asked it to.
"""

_COMMANDS = """\
## Storage commands and replies

Every write and read of the runtime store and of memory is a command on `storage.commands`, applied
by the storage owner (the only writer to MongoDB), and answered on `storage.replies`.

### Framing

A command is one JSON object whose `op` names the operation (tables below). The owner decodes it
with one strictness, the same at every level of the object:

- an unknown field, at the top level or inside any nested object, is refused;
- a key repeated in any JSON object is refused (never "the last one wins");
- `correlation_id` must be a non-empty string (it is how the reply is matched); a command without
  one is dead-lettered and never applied;
- a lifecycle record's payload (base64 of canonical JSON) is decoded strictly on top of that.

A command that breaks these rules is not applied. When its `correlation_id` can be read, it is
answered with an `INVALID_ARGUMENT` reply; it always goes to `storage.commands.dlq`
(`x-dlq-reason: invalid_payload`). A well-formed command the store refuses is answered with the
store's error code and is not dead-lettered.

Send the same bytes again (same `correlation_id`) when no reply came in time: the owner answers a
resent write as an exact retry (`inserted: false`). Key a command by its session id, else its run
id (runtime commands) or principal id (memory commands).

### Reply routing

Replies go to the deployment's own `storage.replies` topic, and only there: the owner takes the
topic from its settings, never from a message. A command says where in that topic its caller
listens with one header:

{route_headers}

Without a route the reply goes to any partition of the replies topic. A route naming another
topic, a partition the topic does not have or anything malformed is refused before the command is
applied: an `INVALID_ARGUMENT` reply (on any partition), the command on `storage.commands.dlq`
(`x-dlq-reason: permanent_error`), and a log line naming the rule, never the header's value.

A client names one partition on every command, reads that partition without a consumer group
from its end offset (fetching only while a command of its own waits), and resolves each reply by
`correlation_id`, ignoring replies nobody waits for. On Tansu, where a waiting fetch is repeated
every 10 ms, a Quipu client does not fetch for a command that an owner in its own process holds
the partition of: it is answered by the reply as that owner queues it, and reads the record once
published, to move past it (it fetches as for any command once the owner no longer holds the
partition). Quipu's clients take a partition of their own
so that none fetches another's replies: each is a member of the consumer group `store-replies`
(prefixed like every group), whose assignor (`quipu-one-partition-each`) gives every member a
partition number in its assignment's user data (`<partition>:<members sharing it>`) and no
partition to fetch; a member joins with `held:<n>` (the partition it was given last, kept when no
other member keeps it) or `preferred:<n>` (the one it reads before its first claim). Only with more
clients than partitions do several share one. A client in another language may pick any partition:
a partition is where honest clients look, not a permission. Whatever a command names, its reply
stays in the deployment's replies topic, which only the deployment's services read.

A reply is a [`StoreReply`](#storereply): `result` (the operation's result as JSON) or `error`
(`{code, message, retryable}`). Only `UNAVAILABLE` is retryable (resend the identical command);
every other code is final.
"""

_DEAD_LETTERS = """\
## Dead letters

A message a consumer can never handle goes to `<topic>.dlq`: same key, the original body, the
original headers, plus these (values are UTF-8 strings):
"""


def _topics_table() -> list[str]:
    lines = [
        "## Topics",
        "",
        "| topic | key | payload | partitions | dead letters |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in TOPICS:
        payload = spec.payload
        link = (
            "[`StoreCommand`](#storage-commands-and-replies)"
            if payload is StoreCommand
            else _anchor(payload.__name__)
        )
        lines.append(
            f"| `{spec.topic.value}` | {spec.key} | {link} | {spec.partitions} | "
            f"`{dead_letter_topic(spec.topic.value)}` |"
        )
    return [*lines, ""]


def _operations_table() -> list[str]:
    lines = [
        "### Operations",
        "",
        "| `op` | arguments | result | key |",
        "| --- | --- | --- | --- |",
    ]
    for command in _commands():
        op = command.model_fields["op"].default
        arguments = ", ".join(f"`{name}`" for name in _own_fields(command) if name != "op") or "none"
        result = "null" if command.result_type is None else _type(command.result_type)
        lines.append(f"| {_anchor(op)} | {arguments} | {result} | {_KEYS[command.backend]} |")
    return [*lines, ""]


def _errors_table() -> list[str]:
    lines = ["### Error codes", "", "| code | retryable |", "| --- | --- |"]
    lines += [f"| `{code.value}` | {'yes' if code.retryable else 'no'} |" for code in ErrorCode]
    return [*lines, ""]


_LIFECYCLE = """\
### Lifecycle record payloads

A record's `payload` is opaque bytes for ordinary types. The five lifecycle types are written only
by their operations, and their payload (the bytes behind the base64) is decoded strictly before
anything is read or written: valid UTF-8 (no lone surrogates, escaped or not), exactly one JSON
object, exactly the keys below (no unknown, repeated, differently-cased or `null` key), integers as
integer literals, no Unicode normalisation. Writers encode canonically, so a retry repeats the
bytes: compact UTF-8, keys in the order below, label keys sorted, empty optional keys left out.
"""


def _lifecycle_tables() -> list[str]:
    lines = [_LIFECYCLE]
    for record_type, keys in lifecycle_payload_keys().items():
        lines += [f"`{record_type}`:", "", "| key | type | required |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {kind} | {'yes' if required else 'no'} |" for name, kind, required in keys]
        lines.append("")
    return lines


def _sealed_table() -> list[str]:
    lines = [
        "### Sealed fields",
        "",
        "| payload | sealed in `sealed` when `sealed_for` is set |",
        "| --- | --- |",
    ]
    for spec in TOPICS:
        for model in spec.models:
            fields: frozenset[str] = getattr(model, "sealed_field_names", frozenset)()
            if fields and spec.payload is StoreCommand:
                lines.append("| every storage command | every argument (all but the envelope and `op`) |")
                break
            if fields:
                lines.append(f"| `{model.__name__}` | {', '.join(f'`{name}`' for name in sorted(fields))} |")
    return [*lines, ""]


def render() -> str:
    """The whole document, from the contracts."""
    topic_payloads = [payload for topic, payload in PAYLOADS.items() if payload is not StoreCommand]
    models, enums = _closure([Envelope, *topic_payloads, *_commands()])
    results = [command.result_type for command in _commands() if command.result_type is not None]
    result_models, result_enums = _closure(results)
    models += [model for model in result_models if model not in models]
    enums = sorted({*enums, *result_enums}, key=lambda kind: kind.__name__)
    route_headers = ["| header | value | meaning |", "| --- | --- | --- |"]
    route_headers += [f"| `{name}` | {value} | {meaning} |" for name, value, meaning in ROUTE_HEADERS]
    commands = _COMMANDS.replace("{route_headers}", "\n".join(route_headers))
    lines = [_INTRO, *_topics_table(), *_sealed_table(), commands, *_operations_table(), *_lifecycle_tables()]
    lines += [*_errors_table(), _DEAD_LETTERS]
    lines += ["| header | value |", "| --- | --- |"]
    lines += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in DEAD_LETTER_HEADERS]
    lines += ["", "## Payloads", ""]
    for model in models:
        lines += _model_table(model)
    lines += ["## Enumerations", ""]
    for kind in enums:
        lines += _enum_table(kind)
    return "\n".join(lines).rstrip() + "\n"


def write_or_check(path: Path, text: str, argv: list[str], command: str) -> int:
    """Write a generated document, or with `--check` tell whether the committed one is `text`
    (exit 1 and say `command` when it is stale)."""
    if "--check" in argv:
        current = path.exists() and path.read_text(encoding="utf-8") == text
        if not current:
            print(f"{path} is stale: run {command}", file=sys.stderr)
        return 0 if current else 1
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0


def main(argv: list[str]) -> int:
    """Write docs/wire.md, or with `--check` tell whether it is current (exit 1 when not)."""
    return write_or_check(DOC_PATH, render(), argv, "python -m quipu.contracts.wire_doc")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
