"""The sensitive-data filter: what may never enter curated memory, and what must still get in.

Two labelled corpora under tests/data, in English and Spanish, hold texts a model could plausibly
propose as facts: sensitive ones, and ordinary ones that share a word or a shape with them (a
password manager, a PIN-code reader, the National Insurance office, "es clave", a year, a
graphics card), so the filter is shown to be narrow as well as wide.

- safety_tuning.json is what the patterns were written against: every sentence is asserted here.
- safety_heldout.json was written before the tuning and measured once; the figures it gave are the
  floor `test_the_held_out_figures_hold` keeps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stdnum import verhoeff
from stdnum.br import cpf
from stdnum.es import dni, nie
from stdnum.fr import nir
from stdnum.in_ import aadhaar
from stdnum.it import codicefiscale
from stdnum.mx import curp
from stdnum.us import ssn

from quipu.services.domain.memory.safety import (
    SensitiveCategory,
    filter_lines,
    fold,
    is_rememberable,
    sensitive_category,
)
from quipu.services.domain.memory.sensitive.national_ids import nino_valid
from quipu.services.domain.memory.sensitive.payment import iban_valid, luhn_valid

C = SensitiveCategory
DATA = Path(__file__).parents[1] / "data"


class Labelled(NamedTuple):
    """One sentence of a labelled corpus: the category it must be refused for, or None to keep it."""

    text: str
    lang: str
    category: SensitiveCategory | None


def load_corpus(name: str) -> list[Labelled]:
    """The sentences of a labelled corpus under tests/data."""
    document = json.loads((DATA / name).read_text(encoding="utf-8"))
    return [
        Labelled(row["text"], row["lang"], None if row["category"] is None else C(row["category"]))
        for row in document["sentences"]
    ]


TUNING = load_corpus("safety_tuning.json")
HELD_OUT = load_corpus("safety_heldout.json")

REFUSED: list[tuple[SensitiveCategory, str]] = [(s.category, s.text) for s in TUNING if s.category]
KEPT = [s.text for s in TUNING if s.category is None]


@dataclass(frozen=True)
class Figures:
    """How the filter did on a labelled corpus."""

    sensitive: int
    benign: int
    caught: int
    """Sensitive sentences refused, whatever the category named."""
    right_category: int
    false_refusals: int

    @property
    def recall(self) -> float:
        return self.caught / self.sensitive

    @property
    def false_refusal_rate(self) -> float:
        return self.false_refusals / self.benign

    @property
    def precision(self) -> float:
        return self.caught / (self.caught + self.false_refusals)

    @property
    def category_accuracy(self) -> float:
        return self.right_category / self.sensitive


def measure(corpus: list[Labelled]) -> Figures:
    """Run the filter over every sentence of a corpus and count what it refused."""
    answers = [(sentence.category, sensitive_category(sentence.text)) for sentence in corpus]
    return Figures(
        sensitive=sum(1 for label, _ in answers if label is not None),
        benign=sum(1 for label, _ in answers if label is None),
        caught=sum(1 for label, answer in answers if label is not None and answer is not None),
        right_category=sum(1 for label, answer in answers if label is not None and answer is label),
        false_refusals=sum(1 for label, answer in answers if label is None and answer is not None),
    )


HELD_OUT_RECALL_FLOOR = 0.90
HELD_OUT_FALSE_REFUSAL_CEILING = 0.012
HELD_OUT_PRECISION_FLOOR = 0.99
"""Measured once on the held-out corpus after tuning (111 of 123 sensitive refused, 1 of 90
ordinary facts refused); a change that does worse on texts it was not written for fails here."""


def test_the_held_out_figures_hold() -> None:
    figures = measure(HELD_OUT)
    assert figures.recall >= HELD_OUT_RECALL_FLOOR, figures
    assert figures.false_refusal_rate <= HELD_OUT_FALSE_REFUSAL_CEILING, figures
    assert figures.precision >= HELD_OUT_PRECISION_FLOOR, figures


def test_the_corpora_are_broad_and_separate() -> None:
    for corpus in (TUNING, HELD_OUT):
        assert len(corpus) >= 150
        assert {s.lang for s in corpus} == {"en", "es"}
        assert {s.category for s in corpus} == {*SensitiveCategory, None}
        assert sum(1 for s in corpus if s.category is None) >= 60
    assert not {s.text for s in TUNING} & {s.text for s in HELD_OUT}


@pytest.mark.parametrize(("category", "text"), REFUSED, ids=[text[:40] for _, text in REFUSED])
def test_sensitive_text_is_refused_with_its_category(category: SensitiveCategory, text: str) -> None:
    assert sensitive_category(text) is category
    assert not is_rememberable(text)


@pytest.mark.parametrize("text", KEPT, ids=[text[:40] for text in KEPT])
def test_ordinary_facts_pass(text: str) -> None:
    assert sensitive_category(text) is None
    assert is_rememberable(text)


@pytest.mark.parametrize(
    "text",
    ["MY PASSWORD IS HUNTER2", "mi contraseña es perro123", "Mi Contrasena Es Perro123", "Padece  Depresión"],
)
def test_case_accents_and_spacing_do_not_hide_anything(text: str) -> None:
    assert sensitive_category(text) is not None


def test_luhn() -> None:
    assert luhn_valid("4111111111111111")
    assert luhn_valid("378282246310005")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("")


def test_a_long_number_that_fails_luhn_is_not_a_card() -> None:
    assert sensitive_category("Order 4111 1111 1111 1112 shipped") is None


def test_iban() -> None:
    assert iban_valid("ES9121000418450200051332")
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("ES9121000418450200051333")
    assert not iban_valid("ZZ9121000418450200051332")


def test_fold_drops_case_accents_and_extra_spaces() -> None:
    assert fold("  Contraseña   ÉS  ") == "contrasena es"


def test_filter_lines_keeps_the_safe_lines_and_names_the_others() -> None:
    result = filter_lines(["Lives in Madrid", "Padece diabetes", "PIN: 4821", "Prefers short answers"])
    assert result.kept == ["Lives in Madrid", "Prefers short answers"]
    assert result.refused == [SensitiveCategory.HEALTH, SensitiveCategory.CREDENTIAL]


def test_nino() -> None:
    assert nino_valid("AB 12 34 56 C")
    assert nino_valid("jg103759a")
    assert not nino_valid("AB 12 34 56 E")  # the suffix is A-D
    assert not nino_valid("DA 12 34 56 A")  # D is never a first letter
    assert not nino_valid("AO 12 34 56 A")  # O is never a second letter
    assert not nino_valid("GB 12 34 56 A")  # a prefix never issued


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("Reference 76018955E", C.NATIONAL_ID),  # a DNI whose letter is right
        ("Reference 76018955A", None),  # the same digits, the wrong letter
        ("Booking SK904412D", C.NATIONAL_ID),  # a NINO, no name needed
        ("Booking SK904412E", None),
        ("Code HRFZMG82A03E530Q", C.NATIONAL_ID),  # a codice fiscale
        ("Code HRFZMG82A03E530A", None),  # its check letter is wrong
        ("Tracking 927.711.634-03", C.NATIONAL_ID),  # a CPF
        ("Tracking 927.711.634-04", None),
        ("Ticket 000-12-3456", None),  # no SSN starts with 000
        ("Order 529781116", None),  # passes the BSN check, but nothing names it
        ("BSN 529781116", C.NATIONAL_ID),
        ("Su NIE está en trámite desde 2024", None),  # the name without a number is not the number
    ],
)
def test_identifiers_need_their_check_or_their_name(text: str, category: SensitiveCategory | None) -> None:
    assert sensitive_category(text) is category


def _digits(size: int) -> st.SearchStrategy[str]:
    return st.text("0123456789", min_size=size, max_size=size)


def _letters(size: int, alphabet: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ") -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=size, max_size=size)


def _cpf(digits: str) -> str:
    # python-stdnum has no public calculator for the CPF's two check digits; one pair of 100 fits
    written = next(digits + f"{check:02d}" for check in range(100) if cpf.is_valid(digits + f"{check:02d}"))
    return cpf.format(written)


_WRITTEN_IDENTIFIERS: dict[str, st.SearchStrategy[str]] = {
    "US SSN": st.builds(
        "{:03d}-{:02d}-{:04d}".format,
        st.integers(1, 665),
        st.integers(1, 99),
        st.integers(1, 9999),
    ).filter(ssn.is_valid),
    "Spanish DNI": _digits(8).map(lambda digits: digits + dni.calc_check_digit(digits)),
    "Spanish NIE": st.builds(str.__add__, st.sampled_from("XYZ"), _digits(7)).map(
        lambda base: base + nie.calc_check_digit(base)
    ),
    "UK NINO": st.builds(
        "{}{} {} {} {} {}".format,
        st.sampled_from("ABCEGHJKLMNOPRSTWXYZ"),
        st.sampled_from("ABCEGHJKLMNPRSTWXYZ"),
        _digits(2),
        _digits(2),
        _digits(2),
        st.sampled_from("ABCD"),
    ).filter(nino_valid),
    "Italian codice fiscale": st.builds(
        "{}{:02d}{}{:02d}{}{}".format,
        _letters(6),
        st.integers(0, 99),
        st.sampled_from("ABCDEHLMPRST"),
        st.sampled_from([*range(1, 29), *range(41, 69)]),
        st.sampled_from("ABCDEFGHLMZ"),
        _digits(3),
    ).map(lambda base: base + codicefiscale.calc_check_digit(base)),
    "Mexican CURP": st.builds(
        "{}{}{:02d}{:02d}{:02d}{}{}{}0".format,
        _letters(1, "BCDFGLMNPRSTVZ"),
        _letters(3, "AEIOUBCDFGLMNPRSTVZ"),
        st.integers(0, 99),
        st.integers(1, 12),
        st.integers(1, 28),
        st.sampled_from("HM"),
        st.sampled_from(["DF", "JC", "NL", "PL", "GT", "VZ", "BC", "YN"]),
        _letters(3, "BCDFGLMNPRSTVZ"),
    )
    .map(lambda base: base + curp.calc_check_digit(base))
    .filter(curp.is_valid),
    "Brazilian CPF": _digits(9).filter(lambda digits: len(set(digits)) > 1).map(_cpf),
    "French NIR": st.builds(
        "{}{:02d}{:02d}{:02d}{}".format,
        st.sampled_from("12"),
        st.integers(0, 99),
        st.integers(1, 12),
        st.integers(1, 95),
        _digits(6),
    )
    .map(lambda base: nir.format(base + nir.calc_check_digits(base)))
    .filter(nir.is_valid),
    "Indian Aadhaar": st.builds(str.__add__, st.sampled_from("23456789"), _digits(10))
    .map(lambda base: base + verhoeff.calc_check_digit(base))
    .filter(aadhaar.is_valid)
    .map(lambda number: f"{number[:4]} {number[4:8]} {number[8:]}"),
}


@pytest.mark.parametrize("scheme", sorted(_WRITTEN_IDENTIFIERS))
def test_any_identifier_of_a_checked_scheme_is_refused_without_its_name(scheme: str) -> None:
    @given(_WRITTEN_IDENTIFIERS[scheme])
    def check(identifier: str) -> None:
        assert sensitive_category(f"Reference {identifier}, filed in March") is C.NATIONAL_ID

    check()


@given(
    st.sampled_from(["Her BSN is", "SIN:", "Steuer-ID", "Su PESEL es", "Su cédula es la", "Passport no."]),
    st.integers(10_000, 999_999_999_999),
)
def test_a_number_next_to_an_identifier_name_is_refused(name: str, number: int) -> None:
    assert sensitive_category(f"{name} {number}") is C.NATIONAL_ID


@given(st.integers(10_000, 999_999_999_999))
def test_an_order_number_is_kept(number: int) -> None:
    assert sensitive_category(f"Order {number} arrived late") is None
