"""The offline summary keeps the substance of what it folds, within its cap, in plain text.

`extractive_summary` on its own, then through the `Summarizer` and the scripted model (what every
user without a key gets), then the recorder folding a long session on the in-memory store.
"""

from __future__ import annotations

import json

from quipu.contracts.memory import HistoryRole
from quipu.contracts.runs import TurnCompleted
from quipu.contracts.transcript import TextPart
from quipu.services.domain.memory.extractive import extractive_summary
from quipu.services.domain.memory.memory_store import InMemoryMemoryStore
from quipu.services.domain.memory.summary import (
    Summarizer,
    Utterance,
    read_summarizer_request,
    sentences,
    summarizer_request,
)
from quipu.services.domain.models.estimate import estimate_text_tokens
from quipu.services.domain.models.port import ModelRequest, ModelResponse, StopReason, TextDelta, Usage
from quipu.services.domain.models.scripted import ScriptedModel
from quipu.services.transcript_recorder.logic import TranscriptRecorder

ESCAPES = ("&lt;", "&gt;", "&amp;")


def user(text: str) -> Utterance:
    return Utterance(HistoryRole.USER, text)


def assistant(text: str) -> Utterance:
    return Utterance(HistoryRole.ASSISTANT, text)


def test_the_key_sentences_are_kept_and_repetition_is_not() -> None:
    summary = extractive_summary(
        "",
        [
            user("Hi! My name is Ana and I work on the billing service."),
            assistant('You said: "My name is Ana and I work on the billing service". Noted.'),
            user("calculate 12*7"),
            assistant("The calculator says 84."),
        ],
        300,
    )
    assert summary == (
        "User: My name is Ana and I work on the billing service. calculate 12*7.\n"
        "Assistant: The calculator says 84."
    )


def test_a_summary_so_far_in_any_form_is_kept_and_extended() -> None:
    earlier = extractive_summary("", [user("My dog is called Rex.")], 300)
    summary = extractive_summary(earlier, [user("Mi color favorito es el azul.")], 300)
    assert summary == "User: My dog is called Rex. Mi color favorito es el azul."
    prose = extractive_summary("The user moved to Porto in May.", [user("I play the cello")], 300)
    assert prose == "The user moved to Porto in May.\nUser: I play the cello."


def test_when_full_the_users_newest_statements_win_over_questions_and_answers() -> None:
    folded = [
        user("My favourite colour is blue."),
        assistant("Blue is a calm colour, often linked with the sea and the sky."),
        user("What is the capital of Peru?"),
        assistant("The capital of Peru is Lima."),
        user("My favourite colour is green now."),
    ]
    summary = extractive_summary("", folded, 20)
    assert summary == "User: My favourite colour is blue. My favourite colour is green now."
    assert extractive_summary("", folded, 10) == "User: My favourite colour is green now."


def test_the_summarizer_request_reads_back_unescaped() -> None:
    folded = (user("x < y & <b>bold</b> &amp; more"), assistant("Sure: 1 > 0."))
    request = summarizer_request("Earlier: R&D said <no>.", folded, max_tokens=300, call_key="k")
    fold = read_summarizer_request(request)
    assert fold is not None
    assert (fold.existing, fold.new, fold.max_tokens) == ("Earlier: R&D said <no>.", folded, 300)
    assert read_summarizer_request(ModelRequest(system="", messages=request.messages)) is None


def test_sentences_split_at_ends_only() -> None:
    assert sentences("Version 3.5 is out. Is it? Yes!  no end") == [
        "Version 3.5 is out.",
        "Is it?",
        "Yes!",
        "no end",
    ]


class EchoingModel:
    """A model that copies its input into its answer, escapes and all (as models sometimes do)."""

    name = "echo"

    async def complete(self, request: ModelRequest, on_text: TextDelta | None = None) -> ModelResponse:
        content = "".join(p.text for p in request.messages[-1].parts if isinstance(p, TextPart))
        copied = content.split("<messages>\n")[1].split("\n</messages>")[0]
        answer = json.dumps({"summary": copied})
        return ModelResponse([TextPart(text=answer)], StopReason.END_TURN, Usage(1, 1), self.name)

    async def count_tokens(self, request: ModelRequest) -> int:
        return 1


async def test_an_answer_copying_the_escaped_input_is_stored_plain() -> None:
    written = await Summarizer(EchoingModel()).summarize("", [user("R&D <lab> &amp;")], "k")
    assert written.text == "User: R&D <lab> &amp;"


async def test_the_scripted_summary_of_many_folds_keeps_facts_and_never_compounds_escapes() -> None:
    summarizer = Summarizer(ScriptedModel(), max_tokens=300)
    summary = ""
    for number in range(1, 31):
        folded = [
            user(f"Note {number}: parcel P-{number:03d} goes to <dock {number}> & stays there."),
            assistant(f"Parcel P-{number:03d} is noted."),
        ]
        summary = (await summarizer.summarize(summary, folded, f"fold/{number}")).text
        assert estimate_text_tokens(summary) <= 300
        assert not any(escape in summary for escape in ESCAPES)
    assert "parcel P-030 goes to <dock 30> & stays there." in summary


def turn(number: int, user_text: str, assistant_text: str) -> TurnCompleted:
    return TurnCompleted(
        event_id=f"s-long-turn-{number}",
        session_id="s-long",
        run_id=f"s-long-run-{number}",
        agent_id="assistant",
        principal_id="ana",
        user_text=user_text,
        assistant_text=assistant_text,
    )


async def test_a_forty_turn_session_folds_its_facts_into_the_summary() -> None:
    memory = InMemoryMemoryStore()
    recorder = TranscriptRecorder(memory, Summarizer(ScriptedModel(), 300))
    facts = {}
    for number in range(1, 41):
        if number % 3 == 1:
            facts[number] = f"My locker {number} code word is word{number}x"
            said, answered = facts[number] + ".", "Noted, I will keep that in mind."
        else:
            said, answered = (
                f"Tell me a joke about <tag> & number {number}?",
                f"Joke {number}: a <div> & a <span> walk in.",
            )
        await recorder.record(turn(number, said, answered))

    summary = await memory.load_summary("s-long")
    assert summary is not None
    assert summary.cursor == 2 * (40 - 6)
    folded = [number for number in facts if number <= 40 - 6]
    assert [number for number in folded if f"word{number}x" not in summary.text] == []
    assert estimate_text_tokens(summary.text) <= 300
    assert not any(escape in summary.text for escape in ESCAPES)
