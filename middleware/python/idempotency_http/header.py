"""The Idempotency-Key field: the IETF draft's Structured Field String (RFC 8941),
optionally with parameters, which are checked and ignored, or a bare key as most
clients send it. The same rules, and the same messages, in every language's
middleware (docs/middleware.md, "The key")."""
import re

_CHARS = r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*'
_FIELD = re.compile(
    r'"(' + _CHARS + r')"'                           # the String
    r'(?:;[ ]*[a-z*][a-z0-9_.*-]*'                     # ;name
    r'(?:=(?:"' + _CHARS + r'"|[A-Za-z0-9*:?.+/=!#$%&\'^_`|~-]+))?)*')  # =value


class MalformedKey(ValueError):
    """The field is not one usable key; the message says why."""


def parse_idempotency_key(values):
    """The key in the field's values (one string per field line, each byte one
    character, as latin-1 decodes it)."""
    if len(values) != 1:
        raise MalformedKey("more than one Idempotency-Key field: send one")
    text = values[0].strip(" \t")
    if text == "":
        raise MalformedKey("the Idempotency-Key field is empty")
    if text.startswith('"'):
        match = _FIELD.fullmatch(text)
        if not match:
            raise MalformedKey(
                'the key starts with a double quote but is not one Structured Field String: '
                'a closing quote, \\" and \\\\ the only escapes, nothing after it but '
                'parameters (;name=value)')
        key = re.sub(r'\\(.)', r'\1', match.group(1))
    else:
        key = text
        if '"' in key:
            raise MalformedKey(
                f'a bare key cannot hold a double quote (at position {key.index(chr(34)) + 1}): '
                'send it as a Structured Field String, "...", with \\" for the quote')
    # An idem_key: 1 to 255 visible ASCII characters.
    if key == "":
        raise MalformedKey("the key is empty: 1 to 255 visible ASCII characters")
    for position, char in enumerate(key, 1):
        if not "\x21" <= char <= "\x7e":
            raise MalformedKey(f"the key has a character that is not visible ASCII (0x21 to 0x7E) "
                               f"at position {position}")
    if len(key) > 255:
        raise MalformedKey(f"the key is {len(key)} characters long: at most 255")
    return key
