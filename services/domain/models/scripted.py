"""`ScriptedModel`: an offline, deterministic model that drives every path of the agent loop.

No network, no randomness: the same request always gives the same response. It answers by
simple rules over the transcript, so a test or the demo can make the loop answer, call tools
(one or several at once), call a child agent, ask the user and finish.

Rules, first match wins:

1. **Explicit script.** `script={key: entry}`: a `str` key matches `request.call_key` exactly; a
   compiled `re.Pattern` key is searched in `request.call_key` (patterns tried in the order
   given, after every exact key). An entry is a `ModelResponse` (returned as is) or a callable
   `(request) -> ModelResponse | None` (None falls through to the rules below).
2. **Structured output** (`request.output_schema` set): one JSON text part, from the
   `structured_output` hook if it returns a value; else, for a fact-extraction request, each
   "my X is Y" the user said (`fact_operations`); for a summarizer request, the extractive
   summary (`quipu.services.domain.memory.extractive`: the key sentences of what is folded, within the
   budget); else `example_for_schema` (see there).
3. **Nothing to answer**: no messages, or the last message is not a user message →
   "I have nothing to answer yet."
4. **Tool results** (the last user message holds `tool_result` parts): a final answer, one
   sentence per result in their order: an `ask_user` result → `You answered: "<answer>".`;
   a failed tool → `The <tool> failed: <error>.`; any other → `The <tool> says <content>.`
   (e.g. "The calculator says 42."), or `The <tool> answered: "<content>"` when the content is
   itself a sentence (an agent-tool's answer). Content: a string as is; an object's `answer`, `result`,
   `text`, `value`, `output` or `iso` member, or its only member; else compact JSON.
5. **Commands** in the last user message's text. The text is split on `;` into clauses; each
   clause gives at most one tool use (first matching pattern, case-insensitive), in order:

   | clause contains | tool use |
   | --- | --- |
   | `ask the user <x>` | `ask_user` with `{"question": "<X>?"}` (first letter upper-cased) |
   | `ask the <name> <task>` | `<name>` with `{"task": <task without a leading "to">}` |
   | `delegate <task>` | first offered tool named `*_agent` (else `math_agent`), `{"task": ...}` |
   | `calculate <expr>` | `calculator` with `{"expression": <expr>}` (trailing `?.!` dropped) |
   | `note <key>=<value>` | `notes` with `{"action": "set", "key": <key>, "value": <value>}` |
   | `recall <key>` | `notes` with `{"action": "get", "key": <key>}` |
   | `ask me <x>` | `ask_user` with `{"question": "What is your answer to: <x>?"}` |
   | `confirm <x>` | `ask_user` with `{"question": "Do you confirm: <x>?", "choices": ["yes", "no"]}` |
   | `time in <Area/City>` (or `UTC`) | `current_time` with `{"timezone": <zone>}` |
   | the word `time` | `current_time` with `{}` |

   A command whose tool is not among `request.tools` is skipped when the request offers any
   tools (a model only calls what it is offered); with no tools offered every command counts.
   When at least one clause matched, the answer is the text `Calling <names>.` followed by the
   tool uses (several clauses make one parallel group), stop reason `tool_use`.
6. **No command**: "what is my X" is answered from the fenced memory block of the system prompt
   (`From an earlier conversation: ...`, or `I don't know your X yet.`); "my X is Y" is said back
   (`You told me your X is Y.`; the fact extractor may keep it as a fact).
7. **Any other tool** (your own): when the request offers tools these rules do not know (not the
   shipped four, not an `*_agent`), the model calls them as pydantic-ai's `TestModel` does: the
   ones the text names (as a whole word), else every one, once each, with arguments drawn to fit
   the tool's JSON schema (`fitting.fitting_value`, seeded by the tool-use id, so a retried step
   asks for the very same call). A named tool takes what its clause says after its name first
   (`said.said_arguments`): `name=value` pairs for its parameters, and the rest of the clause as
   its free-text parameter (`search_articles about a late parcel` → `{"query": "a late
   parcel"}`). Their results then get the answer of rule 4.
8. Anything else is an echo, `You said: "<text>". ...`, with a hint of one phrase per command
   family (`HINT_PHRASES`).

Tool-use ids are `toolu_` + 24 hex digits of SHA-256 over the call key (or, without one, over
the transcript) and the tool use's position: stable across retries, unique across steps.
When `request.thinking_budget > 0`, answers from rules 3-6 start with a signed thinking part,
so a transcript satisfies ValidateThinkingFirst. Like a real model, an answer never spends more than
`request.max_tokens` output tokens: past it the text is cut and the stop reason is `max_tokens`
(structured output excepted).
Answer text is streamed through `on_text` in a
few chunks whose concatenation is the text. Usage is the local estimate (`estimate.py`).

One module (about 500 lines) on purpose: the rules above are one ordered list, and reading them
in one place is how a test author knows what the offline model will do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from quipu.contracts.transcript import (
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    encode_json_value,
    encode_messages,
)
from quipu.services.domain.memory.extractive import summary_answer
from quipu.services.domain.models.estimate import (
    CHARS_PER_TOKEN,
    estimate_parts_tokens,
    estimate_request_tokens,
)
from quipu.services.domain.models.fitting import fitting_value
from quipu.services.domain.models.port import (
    ModelRequest,
    ModelResponse,
    StopReason,
    TextDelta,
    ToolSpec,
    Usage,
)
from quipu.services.domain.models.said import said_arguments
from quipu.services.domain.models.schema_examples import example_for_schema, transcript_digest
from quipu.services.domain.transcript import tool_result_text

SCRIPTED_MODEL_NAME = "scripted"
"""`ModelResponse.model` of scripted answers."""

CALCULATOR_TOOL = "calculator"
CLOCK_TOOL = "current_time"
NOTES_TOOL = "notes"
ASK_USER_TOOL = "ask_user"
DEFAULT_AGENT_TOOL = "math_agent"
AGENT_TOOL_SUFFIX = "_agent"
"""A tool whose name ends with this is taken for an agent-as-tool by `delegate`."""

PHRASE_TOOLS = frozenset({CALCULATOR_TOOL, CLOCK_TOOL, NOTES_TOOL, ASK_USER_TOOL})
"""The tools the phrase rules call; any other offered tool is called with schema-fitted arguments."""

NOTHING_TO_ANSWER = "I have nothing to answer yet."
STREAM_CHUNKS = 3
"""Answer text is streamed in at most this many chunks."""

REQUESTS_KEPT = 1000
"""How many of the latest requests `ScriptedModel.requests` keeps (a long demo must not grow)."""

ScriptHook = Callable[[ModelRequest], ModelResponse | None]
"""Computes the answer to a request, or None to let the built-in rules answer."""

ScriptEntry = ModelResponse | ScriptHook
ScriptKey = str | re.Pattern[str]
StructuredOutputHook = Callable[[ModelRequest], Any]
"""Returns the JSON value to answer a structured-output request with, or None."""


class ScriptedModel:
    """An offline, deterministic `ModelClient` (rules in the module docstring)."""

    def __init__(
        self,
        script: Mapping[ScriptKey, ScriptEntry] | None = None,
        *,
        structured_output: StructuredOutputHook | None = None,
        name: str = SCRIPTED_MODEL_NAME,
        latency_s: float = 0.0,
    ) -> None:
        """Answer by `script` first, then by the built-in rules.

        `structured_output` answers requests with an `output_schema` before the schema example;
        `latency_s` is awaited before each answer of `complete`, as a remote model's would be.
        """
        self.name = name
        self._latency_s = latency_s
        self._exact = {key: entry for key, entry in (script or {}).items() if isinstance(key, str)}
        self._patterns = [
            (key, entry) for key, entry in (script or {}).items() if isinstance(key, re.Pattern)
        ]
        self._structured_output = structured_output
        self.requests: deque[ModelRequest] = deque(maxlen=REQUESTS_KEPT)
        """The last requests `complete` was given, in order (for tests: how often was I called?)."""

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        """Answer `request` and stream its text parts through `on_text`."""
        self.requests.append(request)
        if self._latency_s:
            await asyncio.sleep(self._latency_s)
        response = self.respond(request)
        await stream_text(response, on_text)
        return response

    async def count_tokens(self, request: ModelRequest) -> int:
        """The local estimate of the request's input tokens."""
        return estimate_request_tokens(request)

    def respond(self, request: ModelRequest) -> ModelResponse:
        """The answer to `request`, without streaming or recording it (a pure function)."""
        scripted = self._scripted(request)
        if scripted is not None:
            return scripted
        if request.output_schema is not None:
            # Structured output stays whole: the memory services' callers size max_tokens for it.
            return self._answer(request, [TextPart(text=self._structured_text(request))], StopReason.END_TURN)
        parts, stop_reason = _rule_answer(request)
        if request.thinking_budget > 0:
            parts = [_thinking(request, parts), *parts]
        return self._answer(request, *within_max_tokens(parts, stop_reason, request.max_tokens))

    def _scripted(self, request: ModelRequest) -> ModelResponse | None:
        entries: list[ScriptEntry] = []
        if request.call_key in self._exact:
            entries.append(self._exact[request.call_key])
        entries.extend(entry for pattern, entry in self._patterns if pattern.search(request.call_key))
        for entry in entries:
            response = entry if isinstance(entry, ModelResponse) else entry(request)
            if response is not None:
                return response
        return None

    def _structured_text(self, request: ModelRequest) -> str:
        assert request.output_schema is not None
        value = self._structured_output(request) if self._structured_output is not None else None
        if value is None:
            value = fact_operations(request)
        if value is None:
            value = summary_answer(request)
        if value is None:
            value = example_for_schema(request.output_schema, digest=transcript_digest(request.messages))
        return encode_json_value(value).decode("utf-8")

    def _answer(self, request: ModelRequest, parts: list[Part], stop_reason: StopReason) -> ModelResponse:
        usage = Usage(
            input_tokens=estimate_request_tokens(request), output_tokens=estimate_parts_tokens(parts)
        )
        return ModelResponse(parts=parts, stop_reason=stop_reason, usage=usage, model=self.name)


def within_max_tokens(
    parts: list[Part], stop_reason: StopReason, max_tokens: int
) -> tuple[list[Part], StopReason]:
    """The answer as a real model gives it under `max_tokens`: generation stops at the limit, so
    parts past it are cut (text to the tokens left) or left out, and the stop reason says why."""
    kept: list[Part] = []
    left = max_tokens
    for part in parts:
        cost = estimate_parts_tokens([part])
        if cost <= left:
            kept.append(part)
            left -= cost
            continue
        if isinstance(part, TextPart) and left > 0:
            kept.append(TextPart(text=part.text[: left * CHARS_PER_TOKEN]))
        return kept, StopReason.MAX_TOKENS
    return kept, stop_reason


# --- the built-in rules ---------------------------------------------------------------------------


def _rule_answer(request: ModelRequest) -> tuple[list[Part], StopReason]:
    last = request.messages[-1] if request.messages else None
    if last is None or last.role != "user":
        return [TextPart(text=NOTHING_TO_ANSWER)], StopReason.END_TURN
    results = [part for part in last.parts if isinstance(part, ToolResultPart)]
    if results:
        return [TextPart(text=_results_answer(request.messages, results))], StopReason.END_TURN
    text = "\n".join(part.text for part in last.parts if isinstance(part, TextPart))
    calls = [call for clause in text.split(";") if (call := _command(clause, request.tools)) is not None]
    offered = {tool.name for tool in request.tools}
    if offered:
        calls = [(name, arguments) for name, arguments in calls if name in offered]
    if calls:
        return _calling(
            [
                ToolUsePart(id=tool_use_id(request, position), name=name, input=arguments)
                for position, (name, arguments) in enumerate(calls)
            ]
        )
    answer = _plain_answer(request.system, text)
    if answer is not None:
        return [TextPart(text=answer)], StopReason.END_TURN
    uses = _fitted_uses(request, _unknown_tools(request.tools, text), text)
    if uses:
        return _calling(uses)
    return [TextPart(text=_echo(text))], StopReason.END_TURN


def _fitted_uses(request: ModelRequest, tools: Sequence[ToolSpec], text: str) -> list[ToolUsePart]:
    """One use of each tool: what the text says after the tool's name (`said.said_arguments`) over
    an input drawn to fit the tool's schema (seeded by the use's id)."""
    uses = []
    for position, tool in enumerate(tools):
        use_id = tool_use_id(request, position)
        fitted = fitting_value(tool.input_schema, seed=use_id)
        arguments = fitted if isinstance(fitted, dict) else {}
        after = _after_name(tool.name, text)
        if after is not None:
            arguments |= said_arguments(tool.input_schema, after)
        uses.append(ToolUsePart(id=use_id, name=tool.name, input=arguments))
    return uses


def _after_name(name: str, text: str) -> str | None:
    """What follows the first whole-word mention of `name` in its clause; None if not named."""
    match = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
    return text[match.end() :].split(";", 1)[0] if match else None


def _calling(uses: list[ToolUsePart]) -> tuple[list[Part], StopReason]:
    names = ", ".join(dict.fromkeys(use.name for use in uses))
    return [TextPart(text=f"Calling {names}."), *uses], StopReason.TOOL_USE


def _unknown_tools(tools: Sequence[ToolSpec], text: str) -> list[ToolSpec]:
    """The offered tools no phrase calls: those the text names, else all of them."""
    unknown = [
        tool for tool in tools if tool.name not in PHRASE_TOOLS and not tool.name.endswith(AGENT_TOOL_SUFFIX)
    ]
    named = [tool for tool in unknown if _after_name(tool.name, text) is not None]
    return named or unknown


_ASK_AGENT = re.compile(r"\bask the\s+([A-Za-z0-9_-]+)\s*(.*)", re.IGNORECASE | re.DOTALL)
_DELEGATE = re.compile(r"\bdelegate\b\s*(.*)", re.IGNORECASE | re.DOTALL)
_CALCULATE = re.compile(r"\bcalculate\s+(.+)", re.IGNORECASE | re.DOTALL)
_NOTE = re.compile(r"\bnote\s+([^=\s]+)\s*=\s*(.*\S)", re.IGNORECASE | re.DOTALL)
_RECALL = re.compile(r"\brecall\s+([^\s?.!]+)", re.IGNORECASE)
_TIME_IN = re.compile(r"\btime in\s+([A-Za-z_]+/[A-Za-z_/+-]+|UTC)\b", re.IGNORECASE)
_ASK_ME = re.compile(r"\bask me\b\s*(.*)", re.IGNORECASE | re.DOTALL)
_CONFIRM = re.compile(r"\bconfirm\b\s*(.*)", re.IGNORECASE | re.DOTALL)
_TIME = re.compile(r"\btime\b", re.IGNORECASE)
_LEADING_TO = re.compile(r"^to\s+", re.IGNORECASE)
_TRAILING_PUNCTUATION = "?.! \t\n"


def _command(clause: str, tools: Sequence[ToolSpec]) -> tuple[str, dict[str, Any]] | None:
    """The tool use one clause asks for: (tool name, input), or None."""
    if match := _ASK_AGENT.search(clause):
        if match.group(1).lower() == "user":
            return ASK_USER_TOOL, {"question": _sentence_question(_task(match.group(2), clause))}
        return match.group(1), {"task": _task(match.group(2), clause)}
    if match := _DELEGATE.search(clause):
        return _agent_tool(tools), {"task": _task(match.group(1), clause)}
    if match := _CALCULATE.search(clause):
        expression = match.group(1).strip().rstrip(_TRAILING_PUNCTUATION)
        if expression:
            return CALCULATOR_TOOL, {"expression": expression}
    if match := _NOTE.search(clause):
        return NOTES_TOOL, {"action": "set", "key": match.group(1), "value": match.group(2).strip()}
    if match := _RECALL.search(clause):
        return NOTES_TOOL, {"action": "get", "key": match.group(1)}
    if match := _ASK_ME.search(clause):
        topic = _topic(match.group(1))
        question = f"What is your answer to: {topic}?" if topic else "What would you like me to do?"
        return ASK_USER_TOOL, {"question": question}
    if match := _CONFIRM.search(clause):
        topic = _topic(match.group(1))
        question = f"Do you confirm: {topic}?" if topic else "Do you confirm?"
        return ASK_USER_TOOL, {"question": question, "choices": ["yes", "no"]}
    if match := _TIME_IN.search(clause):
        zone = match.group(1)
        return CLOCK_TOOL, {"timezone": "UTC" if zone.upper() == "UTC" else zone}
    if _TIME.search(clause):
        return CLOCK_TOOL, {}
    return None


def _task(rest: str, clause: str) -> str:
    task = _LEADING_TO.sub("", rest.strip()).rstrip(_TRAILING_PUNCTUATION)
    return task or clause.strip()


def _sentence_question(text: str) -> str:
    return text[:1].upper() + text[1:] + "?"


def _topic(rest: str) -> str:
    return rest.strip().rstrip(_TRAILING_PUNCTUATION)


def _agent_tool(tools: Sequence[ToolSpec]) -> str:
    for tool in tools:
        if tool.name.endswith(AGENT_TOOL_SUFFIX):
            return tool.name
    return DEFAULT_AGENT_TOOL


_WHAT_IS_MY = re.compile(r"\bwhat(?:'s| is| are)\s+my\s+([^?.!]+)", re.IGNORECASE)
_MEMORY_FENCE = re.compile(
    r"<memory_from_earlier_sessions>\n(.*?)\n</memory_from_earlier_sessions>", re.DOTALL
)
_MY_THING_IS = re.compile(
    r"\bmy ([a-z][a-z ]{0,40}?) (?:is|are) ([^.;,!?\n]+?)(?=\s+and\s+my\s|[.;,!?\n]|$)", re.IGNORECASE
)
_MI_COSA_ES = re.compile(
    r"\bmis? [^\W\d_](?:[^\W\d_]| ){0,40}? (?:es|son) [^.;,!?\n]+?(?=\s+y\s+mis?\s|[.;,!?\n]|$)",
    re.IGNORECASE,
)


def _plain_answer(system: str, text: str) -> str | None:
    """A text with no command: a question about the user or a fact about them, else None."""
    if question := _WHAT_IS_MY.search(text):
        return _from_memory(system, question.group(1))
    if told := _MY_THING_IS.findall(text):
        return _acknowledge(told)
    return None


def _from_memory(system: str, topic: str) -> str:
    """Answer "what is my X" from the fenced memory block the context put in the system prompt."""
    words = [word for word in re.findall(r"[a-z0-9]+", topic.lower()) if len(word) > 2]
    fence = _MEMORY_FENCE.search(system)
    lines = [line[2:] for line in fence.group(1).splitlines() if line.startswith("- ")] if fence else []
    matching = [line for line in lines if words and all(word in line.lower() for word in words)]
    if not matching:
        return f"I don't know your {topic.strip()} yet."
    return "From an earlier conversation: " + " ".join(_sentence(line) for line in matching)


def fact_operations(request: ModelRequest) -> dict[str, Any] | None:
    """Proposed facts for a fact-extraction request: each "my X is Y" ("mi X es Y") the user
    said, once, always as a new fact (code recognises a new value of a saved one)."""
    properties = (request.output_schema or {}).get("properties", {})
    if set(properties) != {"operations"} or not request.messages:
        return None
    text = "".join(part.text for part in request.messages[-1].parts if isinstance(part, TextPart))
    data = re.search(r"<data>\n(.*)\n</data>", text, re.DOTALL)
    try:
        turn = json.loads(data.group(1)) if data else {}
    except ValueError:
        return None
    said = str(turn.get("turn", {}).get("user_said", ""))
    saved = {str(fact.get("text", "")).lower() for fact in turn.get("saved_facts", [])}
    statements = [(m.start(), f"My {m[1].strip()} is {m[2].strip()}") for m in _MY_THING_IS.finditer(said)]
    statements += [(m.start(), m[0][:1].upper() + m[0][1:].strip()) for m in _MI_COSA_ES.finditer(said)]
    proposals = [
        {"op": "new", "text": fact, "source": "user_said"}
        for _, fact in sorted(statements)
        if fact.lower() not in saved
    ]
    return {"operations": proposals}


HINT_PHRASES = (
    "calculate 6*7",
    "what time is it?",
    "note color=blue",
    "recall color",
    "ask me <question>",
    "confirm <action>",
    "ask the math_agent to <task>",
    "my name is <name>",
    "what is my name?",
)
"""What the echo suggests: one phrase per command family the rules understand."""


def _echo(text: str) -> str:
    phrases = ", ".join(f'"{phrase}"' for phrase in HINT_PHRASES[:-1])
    return (
        f'You said: "{text.strip()}". I am the scripted model: try {phrases} or "{HINT_PHRASES[-1]}" '
        "(with a principal, what you tell me about yourself is remembered across sessions)."
    )


def _acknowledge(said: list[tuple[str, str]]) -> str:
    """The answer to "my X is Y": what was heard, said back (whether it is kept as a fact is the
    fact extractor's decision, so no promise is made here)."""
    return (
        "You told me " + "; ".join(f"your {thing.strip()} is {value.strip()}" for thing, value in said) + "."
    )


def _results_answer(messages: Sequence[Message], results: list[ToolResultPart]) -> str:
    names = {
        part.id: part.name
        for message in messages
        if message.role == "assistant"
        for part in message.parts
        if isinstance(part, ToolUsePart)
    }
    sentences = []
    for result in results:
        name = names.get(result.tool_use_id, "tool")
        if result.is_error:
            sentences.append(_sentence(f"The {name} failed: {tool_result_text(result.content)}"))
        elif name == ASK_USER_TOOL:
            sentences.append(f'You answered: "{result_text(result.content)}".')
        else:
            sentences.append(_says(name, result_text(result.content)))
    return " ".join(sentences)


def _says(name: str, text: str) -> str:
    """What a tool said: a value inline ("The calculator says 42."), a sentence quoted, so an
    agent's whole answer never runs into ours ("The math_agent answered: "The calculator says 42."")."""
    if text.endswith((".", "!", "?")) and " " in text:
        return f'The {name} answered: "{text}"'
    return _sentence(f"The {name} says {text}")


def _sentence(text: str) -> str:
    """`text` ending with one full stop (a result that is itself a sentence keeps its own)."""
    return text if text.endswith((".", "!", "?")) else text + "."


_ANSWER_MEMBERS = ("answer", "result", "text", "value", "output", "iso")


def result_text(content: Any) -> str:
    """A tool result as a short text: a string as is, an object's main member, else JSON."""
    if isinstance(content, dict):
        for member in _ANSWER_MEMBERS:
            if member in content:
                return result_text(content[member])
        if len(content) == 1:
            return result_text(next(iter(content.values())))
    return tool_result_text(content)


def tool_use_id(request: ModelRequest, position: int) -> str:
    """The id of the `position`-th tool use answering `request`: `toolu_` + 24 hex digits."""
    basis = request.call_key or hashlib.sha256(encode_messages(request.messages)).hexdigest()
    return "toolu_" + hashlib.sha256(f"{basis}#{position}".encode()).hexdigest()[:24]


def _thinking(request: ModelRequest, parts: list[Part]) -> ThinkingPart:
    kinds = ", ".join(part.kind for part in parts)
    basis = request.call_key or hashlib.sha256(encode_messages(request.messages)).hexdigest()
    signature = "scripted-" + hashlib.sha256(f"{basis}#thinking".encode()).hexdigest()[:32]
    return ThinkingPart(text=f"Scripted reasoning: answer with {kinds}.", signature=signature, final=True)


async def stream_text(response: ModelResponse, on_text: TextDelta | None) -> None:
    """Stream the response's text parts through `on_text` in a few chunks, as a model streams them."""
    if on_text is None:
        return
    for part in response.parts:
        if isinstance(part, TextPart):
            for chunk in text_chunks(part.text):
                await on_text(chunk)


def text_chunks(text: str, count: int = STREAM_CHUNKS) -> list[str]:
    """`text` cut at word boundaries into at most `count` chunks that concatenate back to it."""
    words = re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    size = max(1, math.ceil(len(words) / count))
    return ["".join(words[start : start + size]) for start in range(0, len(words), size)]
