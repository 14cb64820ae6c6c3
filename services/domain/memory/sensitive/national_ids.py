"""`national_id`: an identifier whose written form and check digits give it away (python-stdnum),
or a number of five digits or more next to the name of an identifier; the name alone is not one."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from stdnum.br import cpf as br_cpf
from stdnum.cl import rut as cl_rut
from stdnum.cn import ric as cn_ric
from stdnum.es import dni as es_dni
from stdnum.es import nie as es_nie
from stdnum.fr import nir as fr_nir
from stdnum.in_ import aadhaar as in_aadhaar
from stdnum.it import codicefiscale as it_codice_fiscale
from stdnum.mx import curp as mx_curp
from stdnum.us import ssn as us_ssn

from quipu.services.domain.memory.sensitive.words import words


def nino_valid(candidate: str) -> bool:
    """Whether a string is a UK National Insurance number of an allocatable form (HMRC's rules).

    python-stdnum has no validator for it: two prefix letters (neither D, F, I, Q, U nor V, the
    second not O, and not one of the prefixes never issued), six digits and a suffix A-D.
    """
    compact = re.sub(r"\s", "", candidate).upper()
    if not re.fullmatch(r"[A-Z]{2}\d{6}[A-D]", compact):
        return False
    first, second = compact[0], compact[1]
    return (
        first not in "DFIQUV"
        and second not in "DFIOQUV"
        and compact[:2] not in {"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"}
    )


@dataclass(frozen=True)
class _IdentifierShape:
    """A national identifier written so that its shape and its check digits alone give it away."""

    pattern: re.Pattern[str]
    is_valid: Callable[[str], bool]


_SELF_EVIDENT_IDENTIFIERS = (
    _IdentifierShape(re.compile(r"\b\d{3}-\d{2}-\d{4}\b"), us_ssn.is_valid),
    _IdentifierShape(re.compile(r"\b\d{8}[ -]?[A-Z]\b"), es_dni.is_valid),
    _IdentifierShape(re.compile(r"\b[XYZ][ -]?\d{7}[ -]?[A-Z]\b"), es_nie.is_valid),
    _IdentifierShape(re.compile(r"\b[A-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"), nino_valid),
    _IdentifierShape(
        re.compile(r"\b[A-Z]{6}[0-9LMNP-V]{2}[A-Z][0-9LMNP-V]{2}[A-Z][0-9LMNP-V]{3}[A-Z]\b"),
        it_codice_fiscale.is_valid,
    ),
    _IdentifierShape(re.compile(r"\b[A-Z]{4}\d{6}[HMX][A-Z]{5}[A-Z\d]\d\b"), mx_curp.is_valid),
    _IdentifierShape(re.compile(r"\b\d{3}\.\d{3}\.\d{3}-\d{2}\b"), br_cpf.is_valid),
    _IdentifierShape(
        re.compile(r"\b[1-478] ?\d{2} ?\d{2} ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2}\b"), fr_nir.is_valid
    ),
    _IdentifierShape(re.compile(r"(?<!\d)(?<!\d )[2-9]\d{3} \d{4} \d{4}(?! ?\d)"), in_aadhaar.is_valid),
    _IdentifierShape(re.compile(r"\b\d{17}[\dX]\b"), cn_ric.is_valid),
    _IdentifierShape(re.compile(r"\b\d{1,2}\.\d{3}\.\d{3}-[\dK]\b"), cl_rut.is_valid),
)
"""Identifiers recognised anywhere: the US SSN, the Spanish DNI and NIE, the UK NINO, the Italian
codice fiscale, the Mexican CURP, the Brazilian CPF, the French NIR, the Indian Aadhaar, the
Chinese resident id and the Chilean RUT, each in its usual written form and passing its check.

Plain runs of nine to twelve digits (a Dutch BSN, a Canadian SIN, a German Steuer-ID, a Polish
PESEL) are not among them: a phone or an order number passes a mod-11 or Luhn check one time in
ten, so those count only next to the identifier's name (`_NAMED_IDENTIFIER`)."""

_IDENTIFIER_NAME = words(
    r"ssn",
    r"social security(?: number| no\.?)?",
    r"social insurance(?: number| no\.?)?",
    r"national insurance(?: number| no\.?)?",
    r"nino",
    r"seguridad social",
    r"nuss",
    r"securite sociale",
    r"insee",
    r"dni",
    r"documento (?:nacional )?de identidad",
    r"(?:carne|carnet|cedula|tarjeta|documento) de identidad",
    r"cedula",
    r"identity (?:card|number|document)",
    r"id (?:card|number|no\.?)",
    r"national id(?:entity)?(?: number| card)?",
    r"numero de identificacion",
    r"passport(?: number| no\.?)?",
    r"(?:numero de )?pasaporte",
    r"tax (?:id|identification number|number|code)",
    r"steuer-?id",
    r"steuer(?:identifikations)?nummer",
    r"fiscal code",
    r"codice fiscale",
    r"codigo fiscal",
    r"bsn",
    r"burgerservicenummer",
    r"citizen service number",
    r"cpf",
    r"curp",
    r"aadhaa?r",
    r"pesel",
    r"personnummer",
    r"cuil",
    r"cuit",
    r"driver'?s licen[cs]e(?: number| no\.?)?",
)
"""Names of national identifiers that no ordinary word shares, matched in any case."""

_IDENTIFIER_ACRONYM = re.compile(r"\b(?:SIN|NI|NIE|NIF|NIR|NSS|RUT|RUN|RFC|TIN|PPS|CPR)\b")
"""Acronyms that are also words ("sin azúcar", "nie", "rut") count only in capitals."""

_IDENTIFIER_VALUE = r"(?<!\d)(?<!\d[ .\-/])(?>\d(?:[ .\-/]?\d){4,})"
"""Five digits or more, however grouped: no identifier is shorter, and a year or a count is.

It starts where a number starts and is matched atomically, so a long run of digits costs one pass."""

_NAMED_IDENTIFIER = re.compile(
    rf"\b{_IDENTIFIER_NAME}\b.{{0,30}}?{_IDENTIFIER_VALUE}|{_IDENTIFIER_VALUE}.{{0,12}}?\b{_IDENTIFIER_NAME}\b"
)
_ACRONYM_VALUE = re.compile(rf".{{0,30}}?{_IDENTIFIER_VALUE}")


def _has_self_evident_identifier(original: str) -> bool:
    upper = original.upper()
    return any(
        shape.is_valid(match.group(0))
        for shape in _SELF_EVIDENT_IDENTIFIERS
        for match in shape.pattern.finditer(upper)
    )


def _has_named_identifier(original: str, folded: str) -> bool:
    if _NAMED_IDENTIFIER.search(folded):
        return True
    acronyms = _IDENTIFIER_ACRONYM.finditer(original)
    return any(_ACRONYM_VALUE.match(original, acronym.end()) for acronym in acronyms)


def is_national_id(original: str, folded: str) -> bool:
    return _has_self_evident_identifier(original) or _has_named_identifier(original, folded)
