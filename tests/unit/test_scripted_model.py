"""ScriptedModel: deterministic answers by the documented rules; the local token estimate; settings."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from quipu.contracts.transcript import (
    ImagePart,
    Message,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
)
from quipu.services.domain.models.estimate import (
    IMAGE_TOKENS,
    estimate_request_tokens,
    estimate_text_tokens,
)
from quipu.services.domain.models.factory import ModelSettings, make_model
from quipu.services.domain.models.port import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    StopReason,
    ToolSpec,
    Usage,
)
from quipu.services.domain.models.schema_examples import example_for_schema
from quipu.services.domain.models.scripted import NOTHING_TO_ANSWER, ScriptedModel, text_chunks
from quipu.services.domain.transcript import (
    encode_anthropic_messages,
    validate_planner_transcript,
    validate_thinking_first,
)
from tests.support.transcripts import assistant, user

SAFE_ID = re.compile(r"toolu_[0-9a-f]{24}")


def said(text: str) -> Message:
    return user(TextPart(text=text))


def request(*messages: Message, call_key: str = "run-1:1", **options: Any) -> ModelRequest:
    return ModelRequest(system="You are helpful.", messages=list(messages), call_key=call_key, **options)


def answer(text: str, **options: Any) -> ModelResponse:
    return ScriptedModel().respond(request(said(text), **options))


def uses(response: ModelResponse) -> list[tuple[str, dict[str, Any]]]:
    return [(part.name, dict(part.input)) for part in response.parts if isinstance(part, ToolUsePart)]


def texts(response: ModelResponse) -> list[str]:
    return [part.text for part in response.parts if isinstance(part, TextPart)]


# --- determinism --------------------------------------------------------------------------------


def test_the_same_request_gets_the_same_response_from_any_instance() -> None:
    same = request(said("calculate 6*7; what time is it"))
    assert ScriptedModel().respond(same) == ScriptedModel().respond(same)
    assert ScriptedModel().respond(same) == ScriptedModel().respond(
        request(said("calculate 6*7; what time is it"))
    )


def test_tool_use_ids_are_safe_stable_and_differ_between_steps_and_positions() -> None:
    first = uses_ids(request(said("calculate 1+1; time"), call_key="run-1:1"))
    again = uses_ids(request(said("calculate 1+1; time"), call_key="run-1:1"))
    later = uses_ids(request(said("calculate 1+1; time"), call_key="run-1:2"))
    assert first == again
    assert len(set(first)) == 2
    assert not set(first) & set(later)
    assert all(SAFE_ID.fullmatch(tool_id) for tool_id in first + later)


def test_without_a_call_key_ids_derive_from_the_transcript() -> None:
    one = uses_ids(request(said("calculate 1+1"), call_key=""))
    other = uses_ids(
        request(said("hello"), assistant(TextPart(text="hi")), said("calculate 1+1"), call_key="")
    )
    assert one == uses_ids(request(said("calculate 1+1"), call_key=""))
    assert one != other


def uses_ids(model_request: ModelRequest) -> list[str]:
    response = ScriptedModel().respond(model_request)
    return [part.id for part in response.parts if isinstance(part, ToolUsePart)]


# --- commands -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Please calculate (17.5 - 2) * 3 ** 2?", [("calculator", {"expression": "(17.5 - 2) * 3 ** 2"})]),
        ("What time is it?", [("current_time", {})]),
        ("what's the time in Europe/Madrid", [("current_time", {"timezone": "Europe/Madrid"})]),
        ("time in utc", [("current_time", {"timezone": "UTC"})]),
        ("note color=blue sky", [("notes", {"action": "set", "key": "color", "value": "blue sky"})]),
        ("recall color?", [("notes", {"action": "get", "key": "color"})]),
        (
            "ask me my favourite colour",
            [("ask_user", {"question": "What is your answer to: my favourite colour?"})],
        ),
        ("Ask me", [("ask_user", {"question": "What would you like me to do?"})]),
        (
            "confirm the deletion.",
            [("ask_user", {"question": "Do you confirm: the deletion?", "choices": ["yes", "no"]})],
        ),
        ("ask the user whether to proceed", [("ask_user", {"question": "Whether to proceed?"})]),
        ("ask the math_agent to calculate 6*7", [("math_agent", {"task": "calculate 6*7"})]),
        ("please delegate calculate 2+3", [("math_agent", {"task": "calculate 2+3"})]),
        (
            "calculate 1+1; note a=b; what time is it",
            [
                ("calculator", {"expression": "1+1"}),
                ("notes", {"action": "set", "key": "a", "value": "b"}),
                ("current_time", {}),
            ],
        ),
    ],
)
def test_commands_call_the_documented_tool(text: str, expected: list[tuple[str, dict[str, Any]]]) -> None:
    response = answer(text)
    assert uses(response) == expected
    assert response.stop_reason is StopReason.TOOL_USE
    names = ", ".join(dict.fromkeys(name for name, _ in expected))
    assert response.parts[0] == TextPart(text=f"Calling {names}.")


def test_delegate_picks_the_offered_agent_tool() -> None:
    tools = [
        ToolSpec("calculator", "math", {"type": "object"}),
        ToolSpec("research_agent", "looks things up", {"type": "object"}),
    ]
    response = answer("delegate find the capital of Peru", tools=tools)
    assert uses(response) == [("research_agent", {"task": "find the capital of Peru"})]


def test_only_offered_tools_are_called_when_tools_are_offered() -> None:
    tools = [ToolSpec("calculator", "math", {"type": "object"})]
    assert uses(answer("calculate 2*3; what time is it", tools=tools)) == [
        ("calculator", {"expression": "2*3"})
    ]
    assert uses(answer("what time is it", tools=tools)) == []
    assert texts(answer("what time is it", tools=tools))[0].startswith('You said: "what time is it"')


def test_a_clause_without_a_command_is_ignored_when_another_matches() -> None:
    assert uses(answer("hello; calculate 2*2; thanks")) == [("calculator", {"expression": "2*2"})]


def test_anything_else_is_echoed() -> None:
    response = answer("Hello there")
    assert response.stop_reason is StopReason.END_TURN
    assert uses(response) == []
    assert texts(response)[0].startswith('You said: "Hello there".')


@pytest.mark.parametrize(
    "messages",
    [[], [said("hi"), assistant(TextPart(text="hello"))]],
    ids=["no messages", "last is assistant"],
)
def test_nothing_to_answer(messages: list[Message]) -> None:
    response = ScriptedModel().respond(request(*messages))
    assert texts(response) == [NOTHING_TO_ANSWER]
    assert response.stop_reason is StopReason.END_TURN


# --- tool results and the loop --------------------------------------------------------------------


def run_tools(text: str, results: dict[str, Any], *, error: str = "") -> list[Message]:
    """One loop step: the user's text, the model's tool uses, then their results."""
    first = ScriptedModel().respond(request(said(text), call_key="run-1:1"))
    tool_uses = [part for part in first.parts if isinstance(part, ToolUsePart)]
    answers = tuple(
        ToolResultPart(tool_use_id=use.id, content=error, is_error=True)
        if error
        else ToolResultPart(tool_use_id=use.id, content=results[use.name])
        for use in tool_uses
    )
    return [said(text), assistant(*first.parts), user(*answers)]


def test_tool_results_end_the_turn_with_a_summary() -> None:
    clock = {
        "timezone": "UTC",
        "iso": "2030-01-02T03:04:05+00:00",
        "time": "03:04:05",
        "weekday": "Wednesday",
    }
    calculator = {"expression": "6*7", "result": 42}
    transcript = run_tools(
        "calculate 6*7; what time is it", {"calculator": calculator, "current_time": clock}
    )
    validate_planner_transcript(transcript)
    response = ScriptedModel().respond(request(*transcript, call_key="run-1:2"))
    assert texts(response) == ["The calculator says 42. The current_time says 2030-01-02T03:04:05+00:00."]
    assert response.stop_reason is StopReason.END_TURN
    validate_planner_transcript([*transcript, assistant(*response.parts)])


def test_a_failed_tool_is_reported() -> None:
    transcript = run_tools("calculate 1/0", {}, error="division by zero")
    response = ScriptedModel().respond(request(*transcript, call_key="run-1:2"))
    assert texts(response) == ["The calculator failed: division by zero."]


def test_an_agent_tool_answer_that_is_a_sentence_is_quoted_not_run_into_ours() -> None:
    transcript = run_tools(
        "ask the math_agent to calculate 12*12", {"math_agent": "The calculator says 144."}
    )
    response = ScriptedModel().respond(request(*transcript, call_key="run-1:2"))
    assert texts(response) == ['The math_agent answered: "The calculator says 144."']


def test_every_phrase_the_hint_suggests_is_understood_and_memory_is_among_them() -> None:
    """The echo's hint is the demo's menu: each phrase in it must do something other than echo,
    and it must offer the memory phrases ("my X is Y", "what is my X") the README promises."""
    hint = texts(answer("hello"))[0]
    phrases = [re.sub(r"<[^>]+>", "blue", phrase) for phrase in re.findall(r'"([^"]+)"', hint)[1:]]
    assert len(phrases) >= 8, hint
    replies = {phrase: answer(phrase) for phrase in phrases}
    for phrase, reply in replies.items():
        assert uses(reply) or not texts(reply)[0].startswith("You said"), phrase
    memory_replies = [texts(reply)[0] for reply in replies.values() if not uses(reply)]
    assert any(reply.startswith("You told me your name is blue") for reply in memory_replies), hint
    assert any(reply == "I don't know your name yet." for reply in memory_replies), hint


def test_a_fact_about_the_user_is_said_back() -> None:
    response = answer("by the way, my favourite colour is green")
    assert texts(response) == ["You told me your favourite colour is green."]
    assert uses(response) == []


@pytest.mark.parametrize("content", ["blue", {"answer": "blue"}, {"choice": "blue"}])
def test_a_resumed_ask_user_quotes_the_answer(content: Any) -> None:
    transcript = run_tools("ask me my favourite colour", {"ask_user": content})
    response = ScriptedModel().respond(request(*transcript, call_key="run-2:1"))
    assert texts(response) == ['You answered: "blue".']


def test_an_object_result_without_a_main_member_is_json() -> None:
    transcript = run_tools("note a=b", {"notes": {"saved": True, "key": "a"}})
    response = ScriptedModel().respond(request(*transcript, call_key="run-1:2"))
    assert texts(response) == ['The notes says {"saved":true,"key":"a"}.']


# --- your own tools: arguments fitted to their schemas -----------------------------------------------


class Forecast(BaseModel):
    """Arguments of a user's tool."""

    model_config = {"extra": "forbid"}

    city: str = Field(min_length=2, max_length=40)
    days: int = Field(ge=1, le=7)
    units: Literal["C", "F"] = "C"


WEATHER = ToolSpec("weather", "The forecast for a city.", Forecast.model_json_schema())
PING = ToolSpec("ping", "Answers pong.", {"type": "object", "properties": {}, "additionalProperties": False})
SHIPPED = [ToolSpec(name, "A shipped tool.", {"type": "object"}) for name in ("calculator", "notes")]


def test_an_offered_tool_of_yours_is_called_with_arguments_that_fit_its_schema() -> None:
    response = answer("hello", tools=[*SHIPPED, WEATHER, PING])
    assert response.stop_reason is StopReason.TOOL_USE
    assert texts(response) == ["Calling weather, ping."]
    [weather, ping] = [part for part in response.parts if isinstance(part, ToolUsePart)]
    Forecast.model_validate(weather.input)
    assert (weather.name, ping.name, ping.input) == ("weather", "ping", {})
    assert SAFE_ID.fullmatch(weather.id) and weather.id != ping.id
    # A retried step asks for the very same calls; another step for other arguments.
    assert answer("hello", tools=[*SHIPPED, WEATHER, PING]) == response
    others = [uses(answer("hello", tools=[WEATHER], call_key=f"run-1:{step}")) for step in range(2, 12)]
    assert len({json.dumps(call, sort_keys=True) for call in others}) > 1


def test_a_tool_the_text_names_is_the_one_called() -> None:
    def called(text: str) -> list[str]:
        return [name for name, _ in uses(answer(text, tools=[WEATHER, PING]))]

    assert called("check the weather please") == ["weather"]
    assert called("weathering") == ["weather", "ping"]  # a whole word only


class Ticket(BaseModel):
    """Arguments of a user's tool with a free-text parameter that is not the first."""

    customer: str = Field(min_length=1, max_length=80)
    summary: str = Field(min_length=1, max_length=24)
    urgent: bool = False
    copies: int | None = None


TICKET = ToolSpec("open_ticket", "Opens a ticket.", Ticket.model_json_schema())


def test_a_named_tool_takes_what_its_clause_says_after_its_name() -> None:
    text = "open_ticket customer=ana@example.com: my parcel never came"
    [(name, arguments)] = uses(answer(text, tools=[TICKET]))
    assert name == "open_ticket"
    assert (arguments["customer"], arguments["summary"]) == ("ana@example.com", "my parcel never came")
    [(_, searched)] = uses(answer("weather about Lisbon please; ping", tools=[WEATHER]))
    assert searched["city"] == "Lisbon please"  # the only plain string, up to the clause's end
    Forecast.model_validate(searched)


def test_said_pairs_are_typed_by_the_schema_and_what_does_not_fit_stays_fitted() -> None:
    text = 'open_ticket urgent=yes copies=3 customer="Ana Lopez" days=4 about a parcel that never came'
    [(_, arguments)] = uses(answer(text, tools=[TICKET]))
    assert (arguments["urgent"], arguments["copies"], arguments["customer"]) == (True, 3, "Ana Lopez")
    assert "days" not in arguments  # not a parameter of this tool
    assert arguments["summary"] == "a parcel that never came"[:24]  # cut to its maxLength
    Ticket.model_validate(arguments)
    [(_, unparsed)] = uses(answer("weather days=soon", tools=[WEATHER]))
    Forecast.model_validate(unparsed)  # `soon` is no integer: the fitted days stay
    assert unparsed == dict(uses(answer("weather days=soon", tools=[WEATHER])))["weather"]


def test_the_phrase_rules_still_win_and_shipped_tools_alone_leave_the_echo() -> None:
    assert uses(answer("calculate 2+2", tools=[*SHIPPED, WEATHER])) == [("calculator", {"expression": "2+2"})]
    assert texts(answer("my name is Ana", tools=[WEATHER])) == ["You told me your name is Ana."]
    assert texts(answer("hello", tools=SHIPPED))[0].startswith('You said: "hello".')


def test_the_results_of_your_tools_get_the_usual_answer() -> None:
    call = answer("hello", tools=[WEATHER])
    [use] = [part for part in call.parts if isinstance(part, ToolUsePart)]
    result = user(ToolResultPart(tool_use_id=use.id, content={"answer": "sunny"}))
    final = ScriptedModel().respond(request(said("hello"), assistant(*call.parts), result, tools=[WEATHER]))
    assert texts(final) == ["The weather says sunny."]


# --- thinking and streaming -----------------------------------------------------------------------


def test_with_a_thinking_budget_every_answer_starts_with_signed_thinking() -> None:
    response = answer("calculate 2+2", thinking_budget=2048)
    thought = response.parts[0]
    assert isinstance(thought, ThinkingPart)
    assert thought.signature.startswith("scripted-")
    assert thought.final
    validate_thinking_first([said("calculate 2+2"), assistant(*response.parts)])
    # The parts are valid for the Anthropic encoding too (thinking only in assistant messages).
    encode_anthropic_messages([said("calculate 2+2"), assistant(*response.parts)])
    assert not any(isinstance(part, ThinkingPart) for part in answer("calculate 2+2").parts)


async def test_answer_text_is_streamed_in_chunks_that_make_the_text() -> None:
    chunks: list[str] = []

    async def on_text(delta: str) -> None:
        chunks.append(delta)

    model = ScriptedModel()
    response = await model.complete(request(said("Hello there, how are you today?")), on_text)
    assert len(chunks) > 1
    assert "".join(chunks) == "".join(texts(response))
    assert list(model.requests) == [request(said("Hello there, how are you today?"))]


async def test_complete_without_on_text_and_protocol_conformance() -> None:
    model: ModelClient = ScriptedModel()
    assert model.name == "scripted"
    response = await model.complete(request(said("calculate 3*3")))
    assert uses(response) == [("calculator", {"expression": "3*3"})]


@pytest.mark.parametrize("text", ["", "one", "  two words  ", "a b c d e f g h i j", "line\nbreak\n"])
def test_text_chunks_concatenate_back(text: str) -> None:
    chunks = text_chunks(text)
    assert "".join(chunks) == text
    assert len(chunks) <= 3


# --- explicit scripts -----------------------------------------------------------------------------


def scripted_reply(text: str) -> ModelResponse:
    return ModelResponse(
        parts=[TextPart(text=text)], stop_reason=StopReason.END_TURN, usage=Usage(1, 1), model="script"
    )


def test_an_exact_call_key_wins_over_patterns_and_rules() -> None:
    model = ScriptedModel(
        script={re.compile(r"^run-1:"): scripted_reply("pattern"), "run-1:1": scripted_reply("exact")}
    )
    assert texts(model.respond(request(said("calculate 1"), call_key="run-1:1"))) == ["exact"]
    assert texts(model.respond(request(said("calculate 1"), call_key="run-1:7"))) == ["pattern"]
    assert uses(model.respond(request(said("calculate 1"), call_key="run-2:1"))) == [
        ("calculator", {"expression": "1"})
    ]


def test_a_hook_answering_none_falls_through() -> None:
    seen: list[str] = []

    def hook(model_request: ModelRequest) -> ModelResponse | None:
        seen.append(model_request.call_key)
        return scripted_reply("second step") if model_request.call_key.endswith(":2") else None

    model = ScriptedModel(script={re.compile(r"run-1"): hook})
    assert uses(model.respond(request(said("time"), call_key="run-1:1"))) == [("current_time", {})]
    assert texts(model.respond(request(said("time"), call_key="run-1:2"))) == ["second step"]
    assert seen == ["run-1:1", "run-1:2"]


async def test_scripted_text_is_streamed_too() -> None:
    chunks: list[str] = []

    async def on_text(delta: str) -> None:
        chunks.append(delta)

    model = ScriptedModel(script={"k": scripted_reply("one two three four")})
    await model.complete(request(said("x"), call_key="k"), on_text)
    assert "".join(chunks) == "one two three four"


# --- structured output ----------------------------------------------------------------------------


class FactOperation(BaseModel):
    op: Literal["new", "update", "delete"]
    fact_id: str | None = None
    text: str = Field(max_length=20)


class Extraction(BaseModel):
    summary: str = Field(min_length=3, max_length=50)
    operations: list[FactOperation]
    confidence: float = Field(ge=0.5)
    count: int = Field(gt=2)
    seen_at: str = Field(json_schema_extra={"format": "date-time"})
    tags: list[str] = Field(default_factory=list)
    nested: dict[str, int]


def test_structured_output_is_json_valid_for_a_pydantic_schema() -> None:
    schema = Extraction.model_json_schema()
    response = answer("Remember that I like tea", output_schema=schema)
    assert response.stop_reason is StopReason.END_TURN
    (text,) = texts(response)
    value = Extraction.model_validate_json(text)
    assert value.summary.startswith("Remember that I like tea")
    assert value.operations == []
    assert value.count == 3
    assert value.seen_at == "1970-01-01T00:00:00Z"


def test_structured_output_follows_refs_unions_and_minimums() -> None:
    schema = {
        "type": "object",
        "properties": {
            "op": {"$ref": "#/$defs/Op"},
            "either": {"anyOf": [{"type": "integer", "minimum": 4}, {"type": "string"}]},
            "maybe": {"type": ["null", "boolean"]},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Op"}, "minItems": 2},
            "fixed": {"const": "v1"},
        },
        "$defs": {"Op": {"type": "object", "properties": {"kind": {"enum": ["new", "delete"]}}}},
    }
    value = example_for_schema(schema, digest="d")
    assert value == {
        "op": {"kind": "new"},
        "either": 4,
        "maybe": False,
        "items": [{"kind": "new"}, {"kind": "new"}],
        "fixed": "v1",
    }


def test_the_structured_output_hook_answers_first() -> None:
    model = ScriptedModel(
        structured_output=lambda model_request: {"summary": f"{len(model_request.messages)} messages"}
    )
    response = model.respond(request(said("a"), said("b"), output_schema={"type": "object"}))
    assert json.loads(texts(response)[0]) == {"summary": "2 messages"}


# --- the token estimate ---------------------------------------------------------------------------


def test_text_tokens_are_a_quarter_of_the_characters_rounded_up() -> None:
    assert [estimate_text_tokens(text) for text in ("", "abcd", "abcde", "x" * 400)] == [0, 1, 2, 100]


def test_the_request_estimate_grows_with_each_part_and_counts_images_flat() -> None:
    base = request(said("hello"))
    longer = request(said("hello"), assistant(TextPart(text="hi there")), said("more"))
    with_tools = request(said("hello"), tools=[ToolSpec("calculator", "does math", {"type": "object"})])
    with_image = request(user(TextPart(text="hello"), ImagePart(format="png", bytes=b"\x89PNG")))
    assert estimate_request_tokens(longer) > estimate_request_tokens(base)
    assert estimate_request_tokens(with_tools) > estimate_request_tokens(base)
    assert estimate_request_tokens(with_image) >= estimate_request_tokens(base) + IMAGE_TOKENS


async def test_count_tokens_and_usage_are_the_estimate() -> None:
    model = ScriptedModel()
    model_request = request(said("calculate 6*7"))
    assert await model.count_tokens(model_request) == estimate_request_tokens(model_request)
    assert (await model.complete(model_request)).usage.input_tokens == estimate_request_tokens(model_request)


# --- settings and the factory ---------------------------------------------------------------------


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "QUIPU_MODEL_API_KEY", "QUIPU_MODEL_PROVIDER"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_key")
def test_without_a_key_the_factory_gives_the_scripted_model() -> None:
    assert isinstance(make_model(ModelSettings()), ScriptedModel)


@pytest.mark.usefixtures("no_key")
def test_the_key_comes_from_anthropic_api_key_and_scripted_can_be_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    settings = ModelSettings()
    assert settings.uses_anthropic
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(settings)
    monkeypatch.setenv("QUIPU_MODEL_PROVIDER", "scripted")
    assert isinstance(make_model(ModelSettings()), ScriptedModel)


@pytest.mark.usefixtures("no_key")
@pytest.mark.parametrize(
    "fields",
    [
        {"provider": "anthropic"},
        {"thinking_budget": 1023},
        {"timeout_s": 60, "deadline_s": 30},
        {"timeout_s": 0},
        {"max_retries": -1},
    ],
)
def test_settings_refuse_what_cannot_work(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelSettings(**fields)


@pytest.mark.usefixtures("no_key")
def test_the_deadline_must_fit_in_the_consumer_poll_interval() -> None:
    settings = ModelSettings(api_key="sk-test", timeout_s=60, deadline_s=300)
    with pytest.raises(ValueError, match="max_poll_interval"):
        make_model(settings, max_poll_interval_ms=300_000)


# --- the output budget ----------------------------------------------------------------------------


def test_an_answer_is_cut_at_max_tokens_and_says_so() -> None:
    response = answer("x" * 4000, max_tokens=50)
    assert response.stop_reason is StopReason.MAX_TOKENS
    assert response.usage.output_tokens <= 50 and texts(response)[0].startswith("You said")
    calls = answer("calculate 6*7", max_tokens=2)
    assert calls.stop_reason is StopReason.MAX_TOKENS and uses(calls) == []


@pytest.mark.parametrize(("latency_s", "waits"), [(0.0, []), (0.25, [0.25])])
async def test_the_scripted_latency_setting_is_awaited_before_each_answer(
    latency_s: float, waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    awaited: list[float] = []

    async def sleep(seconds: float) -> None:
        awaited.append(seconds)

    monkeypatch.setattr("quipu.services.domain.models.scripted.asyncio.sleep", sleep)
    model = make_model(ModelSettings(provider="scripted", scripted_latency_s=latency_s))
    response = await model.complete(request(said("calculate 3*3")))
    assert awaited == waits
    assert uses(response) == [("calculator", {"expression": "3*3"})]
