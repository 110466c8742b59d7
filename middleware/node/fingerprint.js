// canonicalJson: the canonical text of docs/fingerprint.md, as the server's
// idem_fingerprint(jsonb) writes it. The parser of examples/fingerprint/fingerprint.mjs
// (which test/fingerprint_vectors.json checks), as a CommonJS module; keep the two alike.
'use strict';
const { createHash } = require('node:crypto');

// As in the extension's core: a number whose plain form is longer is refused (here: the
// body is fingerprinted as raw bytes), so that 1e999999999 cannot exhaust memory.
const MAX_NUMBER_CHARS = 200000;

class CanonicalJsonError extends Error {}

// The canonical text of a JSON document (a string, or UTF-8 bytes).
function canonicalJson(input) {
  // ignoreBOM keeps a leading U+FEFF, to be refused as the core refuses it.
  const text =
    typeof input === 'string' ? input : new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(input);
  const parser = new Parser(text);
  parser.space();
  const out = parser.value();
  parser.space();
  if (parser.pos !== text.length) parser.fail('unexpected text after the value');
  return out;
}

const UNESCAPE = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
const NUMBER = /-?(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?/y;

class Parser {
  constructor(text) {
    this.text = text;
    this.pos = 0;
  }

  fail(what) {
    throw new CanonicalJsonError(`invalid JSON at offset ${this.pos}: ${what}`);
  }

  // JSON's whitespace only (RFC 8259): not every character JavaScript calls space.
  space() {
    while (this.pos < this.text.length && ' \t\n\r'.includes(this.text[this.pos])) this.pos++;
  }

  // Recursive: nesting is bounded by Node's stack (thousands of levels), as it is in
  // jsonb by max_stack_depth.
  value() {
    const c = this.text[this.pos];
    if (c === '{') return this.object();
    if (c === '[') return this.array();
    if (c === '"') return quote(this.string());
    if (c === '-' || (c >= '0' && c <= '9')) return this.number();
    for (const word of ['true', 'false', 'null']) {
      if (this.text.startsWith(word, this.pos)) {
        this.pos += word.length;
        return word;
      }
    }
    return this.fail(c === undefined ? 'expected a value' : 'unexpected character');
  }

  object() {
    this.pos++;
    // Decoded key -> canonical value; a later duplicate replaces an earlier one (jsonb
    // keeps the last).
    const members = new Map();
    this.space();
    if (this.text[this.pos] === '}') {
      this.pos++;
      return '{}';
    }
    for (;;) {
      this.space();
      if (this.text[this.pos] !== '"') this.fail('expected a string as object key');
      const key = this.string();
      this.space();
      if (this.text[this.pos] !== ':') this.fail("expected ':' after an object key");
      this.pos++;
      this.space();
      members.set(key, this.value());
      this.space();
      const next = this.text[this.pos++];
      if (next === '}') break;
      if (next !== ',') this.fail("expected ',' or '}' after an object member");
    }
    // By the UTF-8 bytes of the keys: JavaScript's own string order compares UTF-16 code
    // units, which puts U+10000 and above before U+E000..U+FFFF.
    const keys = [...members.keys()].map((key) => [Buffer.from(key, 'utf8'), key]);
    keys.sort((a, b) => Buffer.compare(a[0], b[0]));
    return '{' + keys.map(([, key]) => quote(key) + ':' + members.get(key)).join(',') + '}';
  }

  array() {
    this.pos++;
    const elements = [];
    this.space();
    if (this.text[this.pos] === ']') {
      this.pos++;
      return '[]';
    }
    for (;;) {
      this.space();
      elements.push(this.value());
      this.space();
      const next = this.text[this.pos++];
      if (next === ']') break;
      if (next !== ',') this.fail("expected ',' or ']' after an array element");
    }
    return '[' + elements.join(',') + ']';
  }

  // The decoded string (escapes resolved, surrogate pairs joined).
  string() {
    this.pos++;
    let decoded = '';
    for (;;) {
      if (this.pos >= this.text.length) this.fail('unterminated string');
      const c = this.text[this.pos];
      const code = c.charCodeAt(0);
      if (c === '"') {
        this.pos++;
        return decoded;
      }
      if (code < 0x20) this.fail('control character in a string');
      if (code >= 0xd800 && code <= 0xdfff) {
        // A raw surrogate must be half of a pair: a lone one has no UTF-8 form.
        const low = this.text.charCodeAt(this.pos + 1);
        if (code > 0xdbff || !(low >= 0xdc00 && low <= 0xdfff)) this.fail('lone surrogate');
        decoded += this.text.slice(this.pos, this.pos + 2);
        this.pos += 2;
        continue;
      }
      if (c !== '\\') {
        decoded += c;
        this.pos++;
        continue;
      }
      const escape = this.text[this.pos + 1];
      this.pos += 2;
      if (Object.hasOwn(UNESCAPE, escape)) {
        decoded += UNESCAPE[escape];
        continue;
      }
      if (escape !== 'u') this.fail('unknown escape');
      const unit = this.hex4();
      if (unit >= 0xdc00 && unit <= 0xdfff) this.fail('low surrogate without a high one');
      if (unit >= 0xd800 && unit <= 0xdbff) {
        if (!this.text.startsWith('\\u', this.pos)) this.fail('high surrogate without a low one');
        this.pos += 2;
        const low = this.hex4();
        if (low < 0xdc00 || low > 0xdfff) this.fail('high surrogate without a low one');
        decoded += String.fromCharCode(unit, low);
      } else {
        decoded += String.fromCharCode(unit);
      }
    }
  }

  hex4() {
    const digits = this.text.slice(this.pos, this.pos + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) this.fail('bad \\u escape');
    this.pos += 4;
    return parseInt(digits, 16);
  }

  // The exact value of the literal in plain decimal: no exponent, no '+', no leading
  // or trailing zeros, every zero "0".
  number() {
    NUMBER.lastIndex = this.pos;
    const m = NUMBER.exec(this.text);
    if (!m) this.fail('expected a digit');
    this.pos = NUMBER.lastIndex;
    if (this.text[this.pos] >= '0' && this.text[this.pos] <= '9') this.fail('leading zero');
    const [literal, integer, fraction = '', sign, exponentDigits = '0'] = m;
    let digits = integer + fraction;
    // Saturated like the core's: past 10^15 the number is refused as too long anyway.
    const significantExponent = exponentDigits.replace(/^0+/, '');
    let exponent = significantExponent.length > 16 ? 1e15 : Math.min(Number(significantExponent), 1e15);
    if (sign === '-') exponent = -exponent;
    const first = digits.search(/[1-9]/);
    if (first < 0) return '0';
    digits = digits.slice(first).replace(/0+$/, '');
    // How many significant digits precede the decimal point; zero or less: 0.000ddd.
    const point = integer.length + exponent - first;
    const negative = literal[0] === '-' ? '-' : '';
    let length;
    if (point <= 0) length = 2 - point + digits.length;
    else if (point < digits.length) length = digits.length + 1;
    else length = point;
    if (negative.length + length > MAX_NUMBER_CHARS) this.fail('number too long in plain decimal');
    if (point <= 0) return negative + '0.' + '0'.repeat(-point) + digits;
    if (point < digits.length) return negative + digits.slice(0, point) + '.' + digits.slice(point);
    return negative + digits + '0'.repeat(point - digits.length);
  }
}

const SHORT_ESCAPES = { '"': '\\"', '\\': '\\\\', '\b': '\\b', '\t': '\\t', '\n': '\\n', '\f': '\\f', '\r': '\\r' };

// A decoded string in canonical form: `"` and `\` escaped, the five short escapes,
// other characters below U+0020 as \u00xx (lowercase), everything else as it is.
function quote(s) {
  const escape = (c) => SHORT_ESCAPES[c] ?? '\\u00' + c.charCodeAt(0).toString(16).padStart(2, '0');
  return '"' + s.replace(/["\\\u0000-\u001f]/g, escape) + '"';
}


// The request's fingerprint (32 bytes), computed here exactly as the server's
// idem_fingerprint(jsonb) computes it for the document {"method": M, "path": P, "body": B}:
// B is the body's JSON value when the body is JSON, null when there is none; any other
// body gives {"method": M, "path": P, "raw": HEX}, HEX the SHA-256 of its bytes. P is the
// path with the query string, as the client sent it.
function requestFingerprint(method, path, body) {
  const head = `"method":${quote(method)},"path":${quote(path)}`;
  let document;
  if (!body || body.length === 0) {
    document = `{"body":null,${head}}`;
  } else {
    try {
      const canonical = canonicalJson(body);
      // jsonb refuses U+0000, which the canonical text writes \u0000 (after an even
      // number of backslashes; after an odd one it is text).
      if (/(?<!\\)(?:\\\\)*\\u0000/.test(canonical)) throw new CanonicalJsonError('jsonb refuses U+0000');
      document = `{"body":${canonical},${head}}`;
    } catch (e) {
      // Not JSON, not UTF-8 (TypeError), nested too deep for the stack (RangeError).
      if (!(e instanceof CanonicalJsonError || e instanceof TypeError || e instanceof RangeError)) throw e;
      document = `{${head},"raw":"${createHash('sha256').update(body).digest('hex')}"}`;
    }
  }
  return createHash('sha256').update(Buffer.from(document, 'utf8')).digest();
}

module.exports = { canonicalJson, requestFingerprint };
