"""The request's fingerprint, computed here exactly as the server's idem_fingerprint(jsonb)
computes it (docs/fingerprint.md), so the claim needs no second round trip.

The fingerprinted document is {"method": M, "path": P, "body": B}: B is the body's JSON
value when the body is JSON (so a retry that re-serialises the same value matches), null
when there is no body; any other body is {"method": M, "path": P, "raw": HEX}, HEX the
SHA-256 of its bytes. P is the path with the query string, as the client sent it.
"""
import hashlib
import json
from decimal import Decimal


def _refuse(constant):
    raise ValueError("not JSON: " + constant)


def _number(d):
    if d == 0:
        return "0"
    # Beyond jsonb's numeric range (so 1e999999999 cannot exhaust memory): not JSON here.
    if d.adjusted() >= 131072 or d.as_tuple().exponent < -16383:
        raise ValueError("number out of jsonb's range")
    s = format(d, "f")  # exact: no rounding, no exponent
    return s.rstrip("0").rstrip(".") if "." in s else s


def _string(s):
    if "\x00" in s:
        raise ValueError("jsonb refuses U+0000")
    return json.dumps(s, ensure_ascii=False)


def _write(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Decimal):
        return _number(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ",".join(map(_write, v)) + "]"
    # Python orders str by code point, which is the UTF-8 byte order the rules want.
    return "{" + ",".join(_string(k) + ":" + _write(v[k]) for k in sorted(v)) + "}"


def canonical_json(text):
    """The canonical text of a JSON document; ValueError if it is not JSON jsonb takes."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")  # jsonb's text is UTF-8; a BOM is refused below
    value = json.loads(text, parse_float=Decimal, parse_int=Decimal, parse_constant=_refuse)
    out = _write(value)
    out.encode("utf-8")  # a lone surrogate fails here, as jsonb refuses it
    return out


def request_fingerprint(method, path, body):
    """32 bytes: idem_fingerprint(jsonb) of the request's document (see above)."""
    head = '"method":' + _string(method) + ',"path":' + _string(path)
    try:
        document = ('{"body":' + canonical_json(body) + "," + head + "}") if body else \
            '{"body":null,' + head + "}"
    except (ValueError, RecursionError):  # UnicodeDecodeError and UnicodeEncodeError included
        document = "{" + head + ',"raw":"' + hashlib.sha256(body).hexdigest() + '"}'
    return hashlib.sha256(document.encode("utf-8")).digest()
