"""What curated memory must never hold: a filter for fact and profile texts.

Memory ends up in the context of every later call (cross-session-memory seed), so a text is
refused when it carries (checked in this order; the first that applies names the refusal):

- `credential`: a password, passcode, PIN or NIP, API key, token, secret, unlock or door code,
  combination or security answer given with its value, in English and Spanish and in their short
  forms ("gmail pass", "pwd", "clave del cajero", "contra del wifi"); a connection string with a
  user and password; any string shaped like a secret (`sk-...`, `ghp_...`, `AKIA...`, a JWT, a
  long hex or mixed-case token). Talk about credentials is not one ("password manager",
  "PIN-code reader", "the password is too short");
- `national_id`: an identifier whose written form and check digits give it away (US SSN, Spanish
  DNI/NIE, UK NINO, Italian codice fiscale, Mexican CURP, Brazilian CPF, French NIR, Indian
  Aadhaar, Chinese resident id, Chilean RUT; validated with python-stdnum), or any number of five
  digits or more next to the name of an identifier (SIN, BSN, Steuer-ID, PESEL, cédula, passport,
  "National Insurance number", ...). The name alone is not one ("works at the National Insurance
  office");
- `payment_card`: a card number (13-19 digits passing the Luhn check), a CVV/CVC, a card's expiry
  or its last digits;
- `bank_account`: an IBAN (mod-97 check), or an account, routing or sort-code number;
- `health`: conditions, diagnoses, medications, treatments, devices, disabilities, in English and
  Spanish;
- `instruction`: text aimed at the assistant rather than about the person ("ignore previous
  instructions", "always answer...", "you must...", "a partir de ahora...", markup that could
  break out of the memory fence). Memory is data; a fact that reads as a command is not one.

It is a deliberately cautious, cheap, deterministic net under the model's own instructions: it
prefers refusing a harmless fact to keeping a secret. Matching is done on a folded copy of the
text (case-folded, accents removed), so "Contraseña", "CONTRASENA" and "contraseña" are alike.
Callers log the category only, never the text. Its precision and recall are measured on a
held-out labelled corpus (tests/data/safety_heldout.json) that the patterns were not written
against. The patterns live in `memory.sensitive`, one module per category; this module folds
the text and asks them in the order above.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from quipu.services.domain.memory.sensitive.credentials import is_credential
from quipu.services.domain.memory.sensitive.health import is_health
from quipu.services.domain.memory.sensitive.instructions import is_instruction
from quipu.services.domain.memory.sensitive.national_ids import is_national_id
from quipu.services.domain.memory.sensitive.payment import is_bank, is_payment


class SensitiveCategory(StrEnum):
    """Why a text may not enter memory."""

    CREDENTIAL = "credential"
    PAYMENT_CARD = "payment_card"
    BANK_ACCOUNT = "bank_account"
    NATIONAL_ID = "national_id"
    HEALTH = "health"
    INSTRUCTION = "instruction"


def fold(text: str) -> str:
    """Case-folded, accent-free text with single spaces: the form every pattern here matches."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(char for char in decomposed if not unicodedata.combining(char))
    return " ".join(plain.casefold().split())


def sensitive_category(text: str) -> SensitiveCategory | None:
    """The first reason `text` may not be remembered, or None when it may."""
    folded = fold(text)
    checks: tuple[tuple[SensitiveCategory, bool], ...] = (
        (SensitiveCategory.CREDENTIAL, is_credential(text, folded)),
        (SensitiveCategory.NATIONAL_ID, is_national_id(text, folded)),
        (SensitiveCategory.PAYMENT_CARD, is_payment(text, folded)),
        (SensitiveCategory.BANK_ACCOUNT, is_bank(text, folded)),
        (SensitiveCategory.HEALTH, is_health(folded)),
        (SensitiveCategory.INSTRUCTION, is_instruction(folded)),
    )
    for category, found in checks:
        if found:
            return category
    return None


def is_rememberable(text: str) -> bool:
    """Whether `text` may enter curated memory."""
    return sensitive_category(text) is None


@dataclass(frozen=True)
class FilteredLines:
    """Lines that passed the filter, and the categories of those that did not."""

    kept: list[str]
    refused: list[SensitiveCategory]


def filter_lines(lines: Iterable[str]) -> FilteredLines:
    """Keep the lines that may be remembered (a profile is filtered line by line)."""
    kept: list[str] = []
    refused: list[SensitiveCategory] = []
    for line in lines:
        category = sensitive_category(line)
        if category is None:
            kept.append(line)
        else:
            refused.append(category)
    return FilteredLines(kept=kept, refused=refused)
