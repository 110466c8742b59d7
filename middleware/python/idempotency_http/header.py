"""The Idempotency-Key field (draft-ietf-httpapi-idempotency-key-header): a Structured
Field String (RFC 8941), optionally with parameters, which are checked and ignored."""
import re

_CHARS = r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*'
_FIELD = re.compile(
    r'"(' + _CHARS + r')"'                           # the String
    r'(?:;[ ]*[a-z*][a-z0-9_.*-]*'                     # ;name
    r'(?:=(?:"' + _CHARS + r'"|[A-Za-z0-9*:?.+/=!#$%&\'^_`|~-]+))?)*')  # =value


class MalformedKey(ValueError):
    """The field is not one usable key; the message says why."""


def parse_idempotency_key(values):
    """The key in the field's values (one string per field line)."""
    if len(values) != 1:
        raise MalformedKey("more than one Idempotency-Key field")
    text = values[0].strip(" \t")
    match = _FIELD.fullmatch(text)
    if not match:
        raise MalformedKey('the key must be one Structured Field String, in double quotes: '
                           'Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"')
    key = re.sub(r'\\(.)', r'\1', match.group(1))
    # An idem_key: 1 to 255 visible ASCII characters (a String may hold spaces).
    if not 1 <= len(key) <= 255 or " " in key:
        raise MalformedKey("the key must be 1 to 255 visible ASCII characters, without spaces")
    return key
