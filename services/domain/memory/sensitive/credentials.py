"""`credential`: a password, PIN, key, token, secret or code given with its value, a connection
string with a password, or any string shaped like a secret; talk about credentials is not one."""

from __future__ import annotations

import re

from quipu.services.domain.memory.sensitive.words import words

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

_STRONG_CREDENTIAL = words(
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

_SHORT_CREDENTIAL = words(
    r"pass",
    r"claves?",
    r"contra",
    r"tokens?",
)
"""Words that name a credential only when they say what they open ("gmail pass", "clave del
cajero"): alone they are a bus pass, a key idea or a board-game token. A login (a user name)
or a secret ("her Gmail secret is that she never deletes anything") is one only with a value that
has a digit or quotes, or next to a password (`_VALUED_CREDENTIAL`)."""

_SHORT_CODE = words(r"codes?", r"codigos?", r"combinations?", r"combinacion")
"""A code is a secret only when it opens something physical ("alarm code", "código del
portal"): an app's code is its source and a phone code a dialling prefix."""

_VALUED_CREDENTIAL = words(
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
_POSSESSIVE = words(r"my", r"his", r"her", r"their", r"your", r"mi", r"tu", r"su", r"sus", r"mis")
_OF = words(r"for", r"of", r"to", r"on", r"de", r"del", r"al", r"para", r"a")

_NAMED_CREDENTIAL = words(
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


def is_credential(original: str, folded: str) -> bool:
    if _SECRET_SHAPES.search(original) or _looks_like_secret_token(original):
        return True
    return bool(_CREDENTIAL_VALUE.search(_NOT_A_CREDENTIAL.sub(" ~ ", folded)))
