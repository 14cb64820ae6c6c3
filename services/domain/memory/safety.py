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
against.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

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


def _words(*alternatives: str) -> str:
    return r"(?:" + "|".join(alternatives) + r")"


# --- credentials ----------------------------------------------------------------------------------

_SECRET_SHAPES = re.compile(
    r"\b(?:sk|pk|rk)[-_][A-Za-z0-9_\-]{8,}"  # Anthropic, OpenAI, Stripe style keys
    r"|\b(?:ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abposr]|hf|npm|pypi|whsec|tok)[-_][A-Za-z0-9_\-]{6,}"
    r"|\bA(?:KIA|SIA)[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\bAIza[0-9A-Za-z_\-]{30,}"  # Google API keys
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\bssh-(?:rsa|ed25519|dss) [A-Za-z0-9+/=]{20,}"
    r"|\b[a-z][a-z0-9+.\-]*://[^\s/:@]+:[^\s/@]+@"  # user:password@ in a URI
    r"|\bbearer\s+[A-Za-z0-9_\-.=~+/]{8,}"
    r"|\b[0-9a-fA-F]{32,}\b",  # long hex: keys, hashes of secrets
    re.IGNORECASE,
)

_MIXED_TOKEN = re.compile(r"(?<![\w@.])[A-Za-z0-9_\-+/=]{20,}(?![\w@])")
"""A long unbroken token; a secret when it mixes lower case, upper case and digits."""

_STRONG_CREDENTIAL = _words(
    r"passwords?",
    r"passwd",
    r"pwd",
    r"pw",
    r"pswd?",
    r"pword",
    r"passphrase",
    r"pass ?codes?",
    r"pins?(?: codes?| numbers?)?",
    r"nip",
    r"one[- ]time (?:code|password)",
    r"otp",
    r"(?:2fa|backup|recovery|unlock|door|gate|garage|alarm|keypad|entry|access) codes?",
    r"unlock pattern",
    r"api[ _-]?keys?",
    r"(?:secret|private|access) keys?",
    r"(?:client|app|webhook|signing|api) secrets?",
    r"(?:access|auth|bearer|api|refresh|session|github|slack|personal access) tokens?",
    r"tokens? de (?:acceso|autenticacion|sesion|api|la api)",
    r"credentials?",
    r"security answers?",
    r"(?:security|secret) questions?",
    r"contrasenas?",
    r"credenciales",
    r"claves? (?:de acceso|privada|secreta|del wifi|de la wifi|de api|api)",
    r"(?:codigo|numero) (?:pin|nip|secreto|de acceso|de verificacion|de desbloqueo)",
    r"patron de desbloqueo",
    r"(?:respuestas?|preguntas?) (?:de seguridad|secretas?)",
    r"(?:wifi|wi-fi|wpa2?|wep|network|router|license|licence|product|serial|recovery|bitlocker|encryption|"
    r"decryption|master) keys?",
)
"""Words that name a credential whatever is said about it: one followed by a value is a secret."""

_SHORT_CREDENTIAL = _words(
    r"pass",
    r"claves?",
    r"contra",
    r"tokens?",
)
"""Words that name a credential only when they say what they open ("gmail pass", "clave del
cajero"): alone they are a bus pass, a key idea or a board-game token. A login (a user name)
or a secret ("her Gmail secret is that she never deletes anything") is one only with a value that
has a digit or quotes, or next to a password (`_VALUED_CREDENTIAL`)."""

_SHORT_CODE = _words(r"codes?", r"codigos?", r"combinations?", r"combinacion")
"""A code is a secret only when it opens something physical ("alarm code", "código del
portal"): an app's code is its source and a phone code a dialling prefix."""

_VALUED_CREDENTIAL = _words(
    r"tokens?", r"secrets?", r"secretos?", r"claves?", r"login", r"pins", r"combinations?", r"combinacion"
)
"""Words that name a credential when a value with a digit or in quotes follows ("token abc123")."""

_OPENED = (
    r"(?:"
    r"e-?mail|g?mail|correo|outlook|hotmail|yahoo|icloud|apple id|wifi|wi-fi|router|modem|laptop|"
    r"portatil|computer|ordenador|pc|mac|tablet|ipad|phone|iphone|movil|telefono|celular|sim|"
    r"voicemail|buzon de voz|accounts?|cuentas?|bank\w*|banco|banca(?: online)?|online banking|"
    r"atm|cashpoint|cajero(?: automatico)?|cards?|tarjetas?|debit|credit|paypal|vpn|ssh|servers?|"
    r"servidor|database|db|nas|admin|root|intranet|app|aplicacion|netflix|spotify|amazon|steam|"
    r"xbox|playstation|facebook|instagram|twitter|tiktok|linkedin|whatsapp|github|gitlab|jira|"
    r"slack|aws|door|puerta|gate|garage|garaje|portal|alarm|alarma|safe|caja fuerte|locker|"
    r"taquilla|padlock|candado|keypad"
    r")"
)
"""What a password opens: mail, devices, accounts, banks and cards, services, doors and safes."""

_OPENED_BY_CODE = (
    r"(?:atm|cashpoint|cajero(?: automatico)?|cards?|tarjetas?|debit|credit|movil|celular|iphone|ipad|"
    r"tablet|sim|voicemail|buzon de voz|door|puerta|gate|garage|garaje|portal|building|edificio|alarm|"
    r"alarma|safe|caja fuerte|locker|taquilla|padlock|candado|keypad|lock|cerradura)"
)
"""What a code or a combination opens."""

_NOT_A_CREDENTIAL = re.compile(
    # a thing about credentials, not one: "password manager", "PIN-code reader", "token bucket"
    r"\b(?:passwords?|passcodes?|pins?|pin[- ]codes?|api keys?|tokens?|pass)[- ](?:managers?|polic(?:y|ies)|"
    r"resets?|hygiene|hashing|hash(?:es)?|generators?|strength|requirements?|rules|readers?|pads?|entry|"
    r"terminals?|machines?|bucket|based|authentication|rotation|mark)\b"
    r"|\b(?:gestor|administrador|politica|generador|lector|teclado|cambio|recuperacion)(?:es)? de "
    r"(?:(?:la|las|los|el) )?(?:contrasenas?|claves?|pins?|passwords?)\b"
    r"|\b(?:ski|bus|season|day|boarding|train|press|backstage|museum|gym|annual|monthly|zip|post(?:al)?|"
    r"area|country|dress|source|bar|qr|promo|discount) (?:pass|code|key)s?\b"
    r"|\bpalabras? clave\b|\bclaves? (?:publica|de sol|de fa|de do)\b|\bes clave\b"
)
"""Phrases that use a credential word for something that is not a secret; they are set aside
before the credential patterns run."""

_DESCRIPTION = (
    r"(?:"
    r"not|no|very|too|really|quite|muy|demasiado|bastante|an?|una?|the same|la misma|el mismo|"
    r"weak|strong|long|short|secure|insecure|safe|expired|wrong|incorrect|invalid|valid|valida|"
    r"required|stored|saved|kept|managed|in|on|debil|fuerte|segura|insegura|larga|corta|caducada|"
    r"incorrecta|erronea|obligatoria|guardada|almacenada|en"
    r")"
)
"""What can follow "password is" without being the password ("is too short", "is stored in
Bitwarden", "es débil"): the filter still refuses anything else after the copula."""

_COPULA = r"\s*(?:\bis\b|\bwas\b|\bare\b|\bes\b|\bera\b|\bsera\b|\bson\b|:|=|->)\s*"
_OPTIONAL_COPULA = rf"(?:{_COPULA}|\s+)"
_IN_SENTENCE = r"[^\s.;!?]"
_VALUE = rf"(?!{_DESCRIPTION}\b)\S"
_QUOTED = r"[\"'«“][^\"'»”]{3,}[\"'»”]"
_WITH_DIGIT = r"(?=\S*\d)\S{3,}"
_POSSESSIVE = _words(r"my", r"his", r"her", r"their", r"your", r"mi", r"tu", r"su", r"sus", r"mis")
_OF = _words(r"for", r"of", r"to", r"on", r"de", r"del", r"al", r"para", r"a")

_NAMED_CREDENTIAL = _words(
    _STRONG_CREDENTIAL,
    # "gmail pass", "netflix login"; "ATM code", "locker combination"
    rf"{_OPENED}(?:'s)? {_SHORT_CREDENTIAL}",
    rf"{_OPENED_BY_CODE}(?:'s)? {_SHORT_CODE}",
    # "pass for steam", "clave del cajero", "contra de mi Gmail"; "código de la alarma"
    rf"{_SHORT_CREDENTIAL} {_OF} (?:\S+ ){{0,2}}?{_OPENED}",
    rf"{_SHORT_CODE} {_OF} (?:\S+ ){{0,2}}?{_OPENED_BY_CODE}",
)

_CREDENTIAL_VALUE = re.compile(
    # "password is X", "gmail pass: X", "la clave del cajero es X", "api key = X"
    # (up to eight words between, none ending a sentence: "Reset her password. Her cat is Tom" is two)
    rf"\b{_NAMED_CREDENTIAL}\b{_IN_SENTENCE}*(?:\s+{_IN_SENTENCE}+){{0,8}}?{_COPULA}{_VALUE}"
    # "password hunter2", "clave de acceso 1234abcd"
    rf"|\b{_NAMED_CREDENTIAL}\b\s+[\"'«“]?{_WITH_DIGIT}"
    # a quoted value after the noun
    rf"|\b{_NAMED_CREDENTIAL}\b[^\"'«“]{{0,30}}{_QUOTED}"
    # "mi clave es golondrina", "my pass: tulip" (and not "mi clave para dormir bien es leer")
    rf"|\b{_POSSESSIVE} (?:clave|contra|pass){_COPULA}{_VALUE}"
    # "token abc123def", "combination 12-34-56", "la clave es 'perro'"
    rf"|\b{_VALUED_CREDENTIAL}\b{_OPTIONAL_COPULA}(?:{_WITH_DIGIT}|{_QUOTED})"
    # "usuario admin y contraseña admin", "username: pedro, password: pedro1"
    rf"|\b(?:user(?:name)?|usuario|login){_OPTIONAL_COPULA}\S+\s*(?:,|/|;|\band\b|\by\b)?\s*"
    rf"(?:(?:{_POSSESSIVE}|the|la|el)\s+)?(?:{_STRONG_CREDENTIAL}|{_SHORT_CREDENTIAL}){_OPTIONAL_COPULA}\S"
)


def _looks_like_secret_token(text: str) -> bool:
    for match in _MIXED_TOKEN.finditer(text):
        token = match.group(0)
        kinds = sum(
            (
                any(char.islower() for char in token),
                any(char.isupper() for char in token),
                any(char.isdigit() for char in token),
            )
        )
        if kinds == 3:
            return True
    return False


def _is_credential(original: str, folded: str) -> bool:
    if _SECRET_SHAPES.search(original) or _looks_like_secret_token(original):
        return True
    return bool(_CREDENTIAL_VALUE.search(_NOT_A_CREDENTIAL.sub(" ~ ", folded)))


# --- payment cards and bank accounts --------------------------------------------------------------

_DIGIT_RUN = re.compile(r"(?<![\d])\d(?:[ \-.]?\d){11,22}(?![\d])")
_CARD_WORD = _words(
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


def _is_payment(original: str, folded: str) -> bool:
    return _has_card_number(original) or bool(_CARD_DETAIL.search(folded))


def _is_bank(original: str, folded: str) -> bool:
    return _has_iban(original) or bool(_BANK_DETAIL.search(folded))


# --- national identifiers -------------------------------------------------------------------------


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

_IDENTIFIER_NAME = _words(
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


def _is_national_id(original: str, folded: str) -> bool:
    return _has_self_evident_identifier(original) or _has_named_identifier(original, folded)


# --- health ---------------------------------------------------------------------------------------

_HEALTH = re.compile(
    r"\b(?:"
    # diagnoses and the words around them
    r"diagnos\w*|prognosis|suffers? from|suffering from|padece\w*|padecimiento|sufre de|"
    r"enfermedad\w*|disease|illness|disorder|trastorno\w*|syndrome|sindrome|"
    r"medical (?:condition|history|record|issue|problem|leave)|health (?:condition|issue|problem)s?|"
    r"condicion medica|historial (?:medico|clinico)|problemas? de salud|salud mental|mental health|"
    r"baja medica|sick leave|chronic|cronic[oa]|terminal(?:ly)? ill|"
    # conditions
    r"cancer|tumou?rs?|tumor\w*|leukemia|leucemia|chemo\w*|quimio\w*|radiotherapy|radioterapia|"
    r"diabet\w*|asthma\w*|asma|asmatic[oa]|hiv|vih|sida|hepatitis|tuberculosis|"
    r"depress\w*|depresi\w*|deprimid[oa]|anxiety|panic attacks?|ataques? de panico|ansiedad|"
    r"bipolar|schizophreni\w*|esquizofreni\w*|psychosis|psicosis|adhd|tdah|autis\w*|asperger|"
    r"epilep\w*|seizures?|convulsion\w*|hypertension|hipertension|high blood pressure|tension alta|"
    r"heart (?:disease|attack|condition|failure)|infarto|cardiopatia|arrhythmia|arritmia|"
    r"(?:had|suffered) a stroke|ictus|"
    r"migraines?|migranas?|allerg\w*|alergi\w*|alergic[oa]|celiac\w*|coeliac|celiaquia|"
    r"lymphoma|linfoma|melanoma|carcinoma|sarcoma|myeloma|mieloma|glioma|metasta\w*|"
    r"crohn\w*|colitis|arthritis|artritis|dementia|demencia|alzheimer\w*|parkinson\w*|"
    r"multiple sclerosis|esclerosis|fibromyalgia|fibromialgia|lupus|covid\w*|"
    r"eating disorder|anorexi\w*|bulimi\w*|ocd|ptsd|tept|insomni\w*|sleep apnea|apnea del sueno|"
    r"addict\w*|adiccion\w*|adict[oa]|alcoholi\w*|rehab|rehabilitacion|sobriety|sobriedad|overdose|"
    r"suicid\w*|self[- ]harm|autolesi\w*|pregnan\w*|embarazad[oa]|embarazo|miscarriage|aborto|"
    r"infertil\w*|ivf|fecundacion in vitro|herpes|"
    r"disabilit\w*|disabled|discapacidad|discapacitad[oa]|wheelchair|silla de ruedas|"
    r"blind|ciego|ciega|deaf|sordo|sorda|"
    # treatment and care
    r"medicat\w*|medicament\w*|medicacion|prescri\w*|receta medica|pills?|pastillas?|"
    r"tablets? (?:of|de)|dosis|dosage|insulin\w*|insulina|metformin\w*|antidepress\w*|antidepresiv\w*|"
    r"sertralin\w*|fluoxetin\w*|prozac|zoloft|lexapro|xanax|valium|diazepam|lorazepam|"
    r"adderall|ritalin|methylphenidate|metilfenidato|methotrexate|metotrexato|statins?|estatinas?|"
    r"levothyrox\w*|eutirox|antibiotic\w*|antibiotico\w*|inhaler|inhalador|ventolin|"
    r"ibuprofen\w*|paracetamol|opioid\w*|opiaceo\w*|morphine|morfina|"
    r"therapy|terapia|psychiatric|psiquiatric[oa]|"
    r"(?:sees|seeing|visits|goes to) (?:a |an |his |her |their )?(?:psychologist|psychiatrist|therapist|"
    r"counsel+or|oncologist|cardiologist|neurologist|rheumatologist|endocrinologist)|"
    r"(?:va|acude|fue) (?:al|a la|a su) (?:psicolog[oa]|psiquiatra|terapeuta|oncolog[oa]|cardiolog[oa]|"
    r"neurolog[oa]|reumatolog[oa]|endocrino)|"
    r"treated for|under treatment|en tratamiento (?:por|de|contra)|(?:se )?esta tratando (?:de |un |una )|"
    r"surgery|cirugia|operad[oa] de|transplant\w*|trasplante|hospitali[sz]\w*|"
    r"dialysis|dialisis|physiotherapy|fisioterapia|"
    # a device a body depends on, when the person has one (not when they build them)
    r"(?:has|had|have|wears?|wearing|uses?|using|got|gets|needs?|relies on|lleva|llevaba|tiene|usa|"
    r"necesita|pusieron|implantaron|puesto)\b(?:\s+\S+){0,3}?\s+(?:pacemaker|marcapasos|defibrillator|"
    r"desfibrilador|hearing aids?|audifonos?|insulin pump|bomba de insulina|prosthe\w*|protesis|stent|"
    r"cpap|colostom\w*|glucose monitor)|"
    r"blood (?:type|group|test)|grupo sanguineo|analisis de sangre"
    r")\b"
    r"|\b\d+(?:[.,]\d+)?\s?(?:mg|mcg)\b"
)


def _is_health(folded: str) -> bool:
    return bool(_HEALTH.search(folded))


# --- instructions hidden in facts -----------------------------------------------------------------

_ASSISTANT = _words(
    r"the (?:assistant|ai|bot|chatbot)",
    r"claude",
    r"chatgpt",
    r"el (?:asistente|bot|chatbot)",
    r"la (?:ia|inteligencia artificial)",
)
_BASE_VERBS = _words(
    r"answer",
    r"respond",
    r"reply",
    r"say",
    r"tell",
    r"mention",
    r"use",
    r"include",
    r"recommend",
    r"call",
    r"refuse",
    r"reveal",
    r"ask",
    r"write",
    r"speak",
    r"talk",
    r"address",
    r"greet",
    r"add",
    r"end",
    r"start",
    r"begin",
    r"sign",
    r"suggest",
    r"agree",
    r"obey",
    r"follow",
    r"do",
    r"output",
    r"print",
    r"send",
    r"share",
    r"trust",
    r"comply",
    r"lie",
    r"give",
    r"provide",
    r"assume",
    r"treat",
    r"prioriti[sz]e",
    r"ignore",
    r"forget",
    r"link",
    r"redirect",
    r"approve",
    r"grant",
    r"execute",
    r"run",
)
_FENCE_TAGS = _words(
    r"system",
    r"assistant",
    r"user",
    r"human",
    r"instructions?",
    r"memory",
    r"memoria",
    r"facts?",
    r"hechos",
    r"prompt",
    r"tool\w*",
    r"context",
    r"session",
    r"sesion",
    r"document\w*",
    r"im_start",
    r"im_end",
    r"user_said",
    r"previous_assistant",
    r"assistant_answered",
    r"profile",
)
_INSTRUCTION = re.compile(
    # overriding the rules
    r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,30}?"
    r"\b(?:instructions?|rules?|prompts?|guidelines?|polic(?:y|ies)|guardrails?|"
    r"everything (?:above|before))\b"
    r"|\b(?:ignora\w*|olvida\w*|omite|descarta)\b.{0,30}?"
    r"\b(?:instrucciones|reglas|indicaciones|normas|prompt|lo anterior|todo lo anterior)\b"
    r"|\b(?:previous|prior|above|earlier|original|system|developer|hidden) (?:instructions?|prompts?|rules)\b"
    r"|\binstrucciones (?:anteriores|previas|originales|del sistema|ocultas)\b"
    r"|\b(?:system prompt|prompt del sistema|jailbreak|developer mode|modo desarrollador|do anything now)\b"
    # addressing the assistant
    r"|\byou (?:must|should|shall|will|have to|need to|are (?:now|required|to|not allowed)|may not|"
    r"cannot|can't|must not|mustn't|are going to)\b"
    rf"|\b{_ASSISTANT}\b.{{0,15}}?\b(?:must|should|shall|will|has to|needs to|always|never|"
    r"is (?:required|not allowed)|debe\w*|tiene que|siempre|nunca|ha de)\b"
    rf"|\b(?:always|never|don't|do not)\s+(?:\w+\s+)?{_BASE_VERBS}\b"
    r"|\b(?:from now on|going forward|henceforth|a partir de ahora|de ahora en adelante|desde ahora)\b"
    r"|\b(?:act|behave|respond|answer) as (?:if|though|an?|the)\b|\bpretend (?:to be|that|you)\b|\broleplay\b"
    r"|\b(?:actua|comportate|responde) como\b|\bfinge (?:ser|que)\b|\bhaz como si\b|\bhaz de cuenta\b"
    r"|\b(?:debes|deberas|deberias|tienes que|tendras que|estas obligad[oa])\b"
    r"|\bno (?:le |me |les )?(?:digas|menciones|reveles|respondas|contestes|uses|hagas|sigas|obedezcas|"
    r"compartas|pidas)\b"
    r"|\b(?:nunca|jamas|siempre) (?:le |me |les )?(?:digas|menciones|reveles|respondas|contestes|"
    r"recomiendes|incluyas|uses|hables|escribas)\b"
    r"|\b(?:respondeme|contestame|dime|dile|recuerdame|llamame|hablame|escribeme|obedeceme)\b"
    # exfiltration: "send the data to http://..."
    r"|\b(?:send|forward|email|upload|post|leak|exfiltrate|envia|reenvia|manda|sube|filtra)\b.{0,60}?"
    r"(?:https?://|www\.|\S+@\S+\.\w+)"
    # markup that could break out of the memory fence
    rf"|</?\s*{_FENCE_TAGS}\b[^>]*>|\[/?(?:inst|system|sys)\]|```|<\|"
    r"|^\W*(?:system|assistant|user|human|sistema|asistente)\s*:"
)
_IMPERATIVE_OPENING = re.compile(
    r"^\W*(?:ignore|disregard|forget|answer|respond|reply|say|tell|pretend|reveal|print|output|send|"
    r"include|recommend|use|write|obey|follow|do|don't|stop|remember to|make sure|be|call|translate|"
    r"add|start|begin|end|act|speak|talk)\b"
)
"""A fact opening with a bare English imperative ("Use tabs", "Reply in French") is a command.

A declarative fact drops its subject but keeps the verb's -s ("Uses tabs", "Replies fast").
Spanish is not checked this way: its familiar imperative is spelled like the third person ("Usa
PostgreSQL" is both), so Spanish commands are recognised by the phrases above instead."""


def _is_instruction(folded: str) -> bool:
    if _INSTRUCTION.search(folded):
        return True
    return bool(_IMPERATIVE_OPENING.search(folded))


# --- the filter -----------------------------------------------------------------------------------


def sensitive_category(text: str) -> SensitiveCategory | None:
    """The first reason `text` may not be remembered, or None when it may."""
    folded = fold(text)
    checks: tuple[tuple[SensitiveCategory, bool], ...] = (
        (SensitiveCategory.CREDENTIAL, _is_credential(text, folded)),
        (SensitiveCategory.NATIONAL_ID, _is_national_id(text, folded)),
        (SensitiveCategory.PAYMENT_CARD, _is_payment(text, folded)),
        (SensitiveCategory.BANK_ACCOUNT, _is_bank(text, folded)),
        (SensitiveCategory.HEALTH, _is_health(folded)),
        (SensitiveCategory.INSTRUCTION, _is_instruction(folded)),
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
