"""`payment_card` and `bank_account`: a card number passing the Luhn check, a CVV, a card's expiry
or last digits; an IBAN passing mod-97, an account, routing or sort-code number."""

from __future__ import annotations

import re

from quipu.services.domain.memory.sensitive.words import words

_DIGIT_RUN = re.compile(r"(?<![\d])\d(?:[ \-.]?\d){11,22}(?![\d])")
_CARD_WORD = words(
    r"cards?",
    r"tarjetas?",
    r"visa",
    r"master ?card",
    r"amex",
    r"american express",
    r"credit card",
    r"debit card",
)
_CARD_DETAIL = re.compile(
    # "Visa ending in 4242", "tarjeta que termina en 1234", "card number 4111...", "caduca 04/27"
    rf"\b{_CARD_WORD}\b.{{0,40}}?(?:\bending\b|\bends\b|\btermina\w*\b|\bacaba\w*\b|\blast\b|"
    rf"\bultim\w*\b|\bnumber\b|\bnumero\b|\bn\.?o\b|nº|#|\bexpir\w*\b|\bcaduc\w*\b|\bvence\w*\b|"
    rf"\bvalid\w*\b).{{0,20}}?\d{{2,4}}"
    # "the last four digits of her card are 0043", "los últimos dígitos de su tarjeta son 5566"
    rf"|\b(?:last|ultim\w*)\s+(?:\w+\s+)?(?:digits|digitos|numbers|numeros|cifras|four|cuatro)\b"
    rf".{{0,30}}?\b{_CARD_WORD}\b.{{0,20}}?\d{{2,4}}"
    r"|\b(?:cvv2?|cvc2?|csc|security code|codigo de seguridad|card verification|codigo cvv)\b"
    # the CVV described rather than named
    r"|\b(?:three|3|tres|four|4|cuatro) (?:digits|digitos|numeros|numbers|cifras) (?:on|at|in|de|del|en) "
    r"(?:the |la |el )?(?:back|reverse|detras|atras|reverso|dorso)\b"
    r"|\b(?:expir\w*|caduc\w*|vence\w*)\b.{0,15}?\b(?:0[1-9]|1[0-2])\s*/\s*\d{2,4}\b"
)

IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20,
    "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18,
    "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30,
    "KW": 30, "KZ": 20, "LB": 28, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24,
    "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28,
    "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SE": 24, "SI": 19, "SK": 24,
    "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}  # fmt: skip
"""IBAN length by country (the IBAN registry): a candidate is checked at its country's length only."""

_IBAN_START = re.compile(r"(?<![A-Z0-9])([A-Z]{2})(\d{2})((?:[ ]?[A-Z0-9]){11,30})")
_BANK_DETAIL = re.compile(
    r"\b(?:swift|bic|account number|acct\.? (?:no|number)|routing number|aba number|sort code|"
    r"bank account|checking account|savings account|numero de cuenta|cuenta bancaria|cuenta corriente|"
    r"n\.? de cuenta|num\.? de cuenta|ccc)\b.{0,30}?\d[\d \-]{5,}"
    r"|\biban\b"
)


def luhn_valid(digits: str) -> bool:
    """Whether a digit string passes the Luhn check (every payment card number does)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return len(digits) > 0 and total % 10 == 0


def iban_valid(candidate: str) -> bool:
    """Whether a string is an IBAN of a known country, of its length, whose mod-97 check holds."""
    compact = candidate.replace(" ", "").upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit():
        return False
    rearranged = compact[4:] + compact[:4]
    try:
        number = int("".join(str(int(char, 36)) for char in rearranged))
    except ValueError:
        return False
    return number % 97 == 1


def _has_iban(original: str) -> bool:
    for match in _IBAN_START.finditer(original.upper()):
        country, check, rest = match.groups()
        length = IBAN_LENGTHS.get(country)
        if length is None:
            continue
        compact = (country + check + rest.replace(" ", ""))[:length]
        if iban_valid(compact):
            return True
    return False


def _has_card_number(original: str) -> bool:
    for match in _DIGIT_RUN.finditer(original):
        digits = re.sub(r"\D", "", match.group(0))
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            return True
    return False


def is_payment(original: str, folded: str) -> bool:
    return _has_card_number(original) or bool(_CARD_DETAIL.search(folded))


def is_bank(original: str, folded: str) -> bool:
    return _has_iban(original) or bool(_BANK_DETAIL.search(folded))
