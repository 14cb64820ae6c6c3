"""The offline summary: the key sentences of what a fold takes, within the summary's budget.

This is how the scripted model answers a summarizer request (`summary_answer`), so that without
a model key, too, folding and compaction keep the substance of what left the window — what was
said, in the words it was said — and lose only the rest of the wording. Pure functions.

The summary is lines `User: <sentences>` and `Assistant: <sentences>`, in conversation order. A
summary so far in that form is read back line by line; a line in any other form (a model's prose,
from before a key was set) is kept as sentences ranked like the user's. Every sentence of the
summary so far and of the new messages is a candidate, taken in this order while it fits:

1. what the user stated (and earlier prose), newest first;
2. the user's questions, then the assistant's sentences, newest first.

A candidate adds nothing, and is left out, when it has no content words (`tokenize`: "Hi!",
"Noted.") or its words are already in what was taken: all of them for a statement of the user
(a new value is a new word), two thirds for the rest (the assistant repeating the user, a hint
said every turn). Newest first because the summary bridges the window and the durable facts: a
statement made again or corrected later is the one to keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quipu.contracts.memory import HistoryRole
from quipu.services.domain.memory.ranking import tokenize
from quipu.services.domain.memory.summary import Utterance, neutralise, read_summarizer_request, sentences
from quipu.services.domain.models.estimate import estimate_text_tokens
from quipu.services.domain.models.port import ModelRequest

_PREFIXES = {HistoryRole.USER: "User: ", HistoryRole.ASSISTANT: "Assistant: "}
_QUESTION_STARTS = ("¿",)
_FILLER_TEXT = """
    hi hello hey thanks thank ok okay sure noted great cool fine please
    hola gracias vale claro bien perfecto favor
"""
_FILLER = frozenset(_FILLER_TEXT.split())
"""Words of conversation that carry no substance of their own."""
_SECONDARY_COVERAGE = 2 / 3
"""Share of its words already taken that makes a question or an assistant sentence redundant."""


@dataclass(frozen=True)
class _Sentence:
    role: HistoryRole | None
    """None: prose of an earlier summary (not in the line form)."""
    text: str
    position: int

    @property
    def primary(self) -> bool:
        """A statement of the user, or earlier prose (taken first)."""
        if self.role is HistoryRole.ASSISTANT:
            return False
        return self.role is None or not (self.text.endswith("?") or self.text.startswith(_QUESTION_STARTS))


def extractive_summary(existing: str, new: Sequence[Utterance], max_tokens: int) -> str:
    """The summary so far extended with the key sentences of `new`, within `max_tokens` (rules above)."""
    candidates = _read(existing)
    for item in new:
        candidates += [
            _Sentence(item.role, _ended(text), len(candidates) + offset)
            for offset, text in enumerate(sentences(item.text))
        ]
    ranked = sorted(candidates, key=lambda sentence: (not sentence.primary, -sentence.position))
    taken: list[_Sentence] = []
    words: set[str] = set()
    for candidate in ranked:
        terms = set(tokenize(candidate.text)) - _FILLER
        if not terms or _covered(terms, words, candidate.primary):
            continue
        trial = sorted([*taken, candidate], key=lambda sentence: sentence.position)
        if estimate_text_tokens(_render(trial)) <= max_tokens:
            taken = trial
            words |= terms
    return _render(taken)


def summary_answer(request: ModelRequest) -> dict[str, Any] | None:
    """The scripted model's answer to a summarizer request (None for any other request).

    The answer is written in the request's encoding, as a model copying from it would: the
    summarizer decodes it once.
    """
    fold = read_summarizer_request(request)
    if fold is None:
        return None
    return {"summary": neutralise(extractive_summary(fold.existing, fold.new, fold.max_tokens))}


def _covered(terms: set[str], taken: set[str], primary: bool) -> bool:
    known = len(terms & taken)
    return known == len(terms) if primary else known >= _SECONDARY_COVERAGE * len(terms)


def _ended(text: str) -> str:
    """A sentence with an end, so that it reads back as one sentence when joined to the next."""
    return text if sentences(text + " x")[-1] == "x" else text + "."


def _read(summary: str) -> list[_Sentence]:
    found: list[_Sentence] = []
    for line in summary.splitlines():
        role = next((role for role, prefix in _PREFIXES.items() if line.startswith(prefix)), None)
        body = line[len(_PREFIXES[role]) :] if role is not None else line
        found += [_Sentence(role, _ended(text), len(found) + n) for n, text in enumerate(sentences(body))]
    return found


def _render(taken: Sequence[_Sentence]) -> str:
    lines: list[tuple[HistoryRole | None, list[str]]] = []
    for sentence in taken:
        if lines and lines[-1][0] is sentence.role and sentence.role is not None:
            lines[-1][1].append(sentence.text)
        else:
            lines.append((sentence.role, [sentence.text]))
    return "\n".join((_PREFIXES[role] if role is not None else "") + " ".join(texts) for role, texts in lines)
