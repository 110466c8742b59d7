#!/usr/bin/env python3
"""Nothing depends on the caller's search_path (SPEC Security): a function that sets no
search_path of its own resolves every unqualified name in its body through the caller's.
So in the SQL and PL/pgSQL functions of sqlonly/sql/*.sql and idempotency--1.4--1.5.sql
that have no `SET search_path` clause, every operator must be written
OPERATOR(pg_catalog.x), and nothing may compare through an operator found by name
(NULLIF, IN, BETWEEN, LIKE, IS DISTINCT FROM, CASE x WHEN, JOIN ... USING), and every
function, type (casts, PL/pgSQL declarations), collation and relation must be
schema-qualified. A function made inside a DO block is checked with the whole block.
(A token scan, not a parser: it knows the constructs these files use.)

Prints each violation as FILE:LINE: FUNCTION: what; exits 1 if there is any.
Usage: test/check_search_path.py [FILE...]
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FILES = sorted(glob.glob(os.path.join(ROOT, "sqlonly/sql/*.sql"))) + [
    os.path.join(ROOT, "idempotency--1.4--1.5.sql")]

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<dollar>\$(?P<tag>[A-Za-z_][A-Za-z_0-9]*)?\$)
  | (?P<str>[Ee]'(?:[^'\\]|''|\\.)*'|(?:[BbXx]|[Uu]&)?'(?:[^']|'')*')
  | (?P<param>\$\d+)
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)
  | (?P<ident>[A-Za-z_\x80-\uffff][A-Za-z_0-9$\x80-\uffff]*)
  | (?P<punct>::|:=|=>|\.\.|[(),;\[\].:])
  | (?P<op>[-+*/<>=~!@#%^&|`?]+)
""", re.X | re.S)

# Words followed by "(" that are syntax, not a function found by name. (GREATEST and
# LEAST compare through the type's default btree operator class, not by name.)
SYNTAX = set("""
    all and any array as atomic begin between by call case cast coalesce conflict
    constraint default diagnostics distinct do else elsif exists exit extract filter for
    foreach from greatest grouping if in into is join lateral least limit loop not
    nullif offset on operator or ordinality over overlay perform position query raise return
    returning returns row rows select set some substring table then trim union update
    using values when where while with
    bit char character dec decimal float interval numeric nchar national time timestamp
    varchar
""".split())
# Type names the grammar maps to pg_catalog itself.
KEYWORD_TYPES = set("""
    bigint bit boolean char character dec decimal double float int integer interval
    national nchar numeric precision real smallint time timestamp varchar
""".split())


def tokenize(text, base=0):
    """Significant tokens as (kind, value, offset, content): content is a dollar
    string's text; whitespace and comments dropped."""
    tokens, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            tokens.append(("other", text[pos], base + pos, None))
            pos += 1
            continue
        kind = m.lastgroup if m.lastgroup != "tag" else "dollar"
        if kind == "dollar":
            end = text.find(m.group(), m.end())
            if end < 0:
                raise SystemExit(f"unterminated {m.group()} at offset {base + pos}")
            tokens.append(("dollar", m.group(), base + pos,
                           (text[m.end():end], base + m.end())))
            pos = end + len(m.group())
            continue
        if kind == "op" and ("--" in m.group() or "/*" in m.group()):
            cut = min(i for i in (m.group().find("--"), m.group().find("/*")) if i >= 0)
            if cut > 0:
                tokens.append(("op", m.group()[:cut], base + pos, None))
            pos += cut
            continue
        if kind not in ("ws", "comment"):
            tokens.append((kind, m.group(), base + pos, None))
        pos = m.end()
    return tokens


def word(token):
    return token[1].lower() if token and token[0] == "ident" else None


def statements(tokens):
    """Top-level statements as token lists (split at ';')."""
    current = []
    for t in tokens:
        current.append(t)
        if t[1] == ";":
            yield current
            current = []
    if current:
        yield current


NONE = ("", "", 0, None)


def problems(tokens):
    """(offset, what) of every name or operator the caller's search_path resolves."""
    found = []
    assigning = False  # in SET a = ..., RAISE ... USING x = ..., GET DIAGNOSTICS x = ...
    depth = list_depth = 0
    in_declare = False
    ctes = {word(tokens[i]) for i in range(len(tokens) - 2)
            if word(tokens[i + 1]) == "as" and tokens[i + 2][1] == "("}
    for i, t in enumerate(tokens):
        kind, value, offset = t[0], t[1], t[2]
        prev2 = tokens[i - 2] if i > 1 else NONE
        prev = tokens[i - 1] if i > 0 else NONE
        nxt = tokens[i + 1] if i + 1 < len(tokens) else NONE
        nxt2 = tokens[i + 2] if i + 2 < len(tokens) else NONE
        w = word(t)
        depth += (value == "(") - (value == ")")
        join_using = w == "using" and any(word(x) == "join" for x in tokens[max(0, i - 8):i])
        if w in ("set", "diagnostics") or w == "using" and in_statement(tokens, i, "raise"):
            assigning, list_depth = True, depth
        elif value == ";" or w in ("where", "returning", "from") and depth == list_depth:
            assigning = False
        if w in ("declare", "begin"):
            in_declare = w == "declare"

        if kind == "op":
            qualified = prev[1] == "." and i >= 4 and word(tokens[i - 4]) == "operator"
            star = value == "*" and (prev[1] in ("(", ".", ",")
                                     or word(prev) in ("select", "returning"))
            placeholder = (value.endswith("%") and nxt[0] == "ident"  # format(), %TYPE
                           and nxt[2] == offset + len(value)
                           and nxt[1].lower() in ("s", "i", "l", "type", "rowtype"))
            directive = value == "#" and word(nxt) in ("variable_conflict", "print_strict_params")
            negative = value == "-" and nxt[0] == "num" and (  # a constant, no operator
                prev[0] in ("op", "") or prev[1] in ("(", ",", "[") or word(prev) in SYNTAX)
            assignment = value == "=" and assigning and prev[0] in ("ident", "qident") and (
                prev2[1] in (",", ".") or word(prev2) in ("set", "using", "diagnostics"))
            if not (qualified or star or placeholder or directive or negative or assignment):
                found.append((offset, f"operator {value} (write OPERATOR(pg_catalog.{value}))"))
        elif w in ("nullif", "between", "like", "ilike", "similar", "natural") \
                and word(prev) not in ("rows", "range", "groups") or join_using \
                or w == "case" and word(nxt) != "when" and word(prev) != "end" \
                or w == "distinct" and (word(prev) == "is"
                                        or word(prev) == "not" and word(prev2) == "is"):
            what = {"case": "CASE x WHEN", "distinct": "IS DISTINCT FROM",
                    "using": "JOIN ... USING"}.get(w, w.upper())
            found.append((offset, f"{what} compares with an operator found by name"))
        elif w == "in" and not loop_head(tokens, i):
            found.append((offset, "IN compares with an operator found by name"))
        elif kind in ("ident", "qident") and nxt[1] == "(" and prev[1] not in (".", ")") \
                and w not in SYNTAX and word(prev) not in ("as", "into"):
            found.append((offset, f"function {value}() (qualify it: pg_catalog.{value})"))
        elif value == "::" and nxt[0] in ("ident", "qident") and word(nxt) not in KEYWORD_TYPES \
                and nxt2[1] != ".":
            found.append((offset, f"type {nxt[1]} (qualify it: pg_catalog.{nxt[1]})"))
        elif w == "collate" and nxt2[1] != ".":
            found.append((offset, f"collation {nxt[1]} (qualify it: pg_catalog.{nxt[1]})"))
        elif in_declare and kind == "ident" and depth == 0 \
                and (prev[1] == ";" or word(prev) == "declare") and word(nxt) != "alias":
            j = i + 1 + (word(nxt) == "constant")  # name [CONSTANT] type
            typ, after = tokens[j], tokens[j + 1]
            if typ[0] in ("ident", "qident") and after[1] not in (".", "%") \
                    and word(typ) not in KEYWORD_TYPES | {"record", "cursor"}:
                found.append((typ[2], f"type {typ[1]} (qualify it: pg_catalog.{typ[1]})"))
        elif w == "from" and word(prev) != "distinct" or w == "join" \
                or w == "update" and word(prev) != "for" or w == "into" and word(prev) == "insert":
            if nxt[0] in ("ident", "qident") and word(nxt) not in SYNTAX | {"only"} | ctes \
                    and nxt2[1] not in ((".",) if w == "into" else (".", "(")) \
                    and not in_call(tokens, i, ("extract", "substring", "trim", "overlay",
                                                "position")):
                found.append((nxt[2], f"relation {nxt[1]} (qualify it with its schema)"))
        # A dollar-quoted string inside a body is SQL run by it (EXECUTE): checked too.
        if kind == "dollar":
            found += problems(tokenize(*t[3]))
    return found


def loop_head(tokens, i):
    """Whether the IN at i is PL/pgSQL's FOR x IN or FOREACH x [SLICE n] IN."""
    j = i - 1
    while j >= 0 and (tokens[j][0] in ("ident", "num") or tokens[j][1] == ",") \
            and word(tokens[j]) not in ("for", "foreach"):
        j -= 1
    return j >= 0 and word(tokens[j]) in ("for", "foreach")


def in_statement(tokens, i, keyword):
    """Whether keyword occurs in the statement before token i."""
    for j in range(i - 1, -1, -1):
        if tokens[j][1] == ";":
            return False
        if word(tokens[j]) == keyword:
            return True
    return False


def in_call(tokens, i, names):
    """Whether token i is inside the parentheses of a call of one of names."""
    depth = 0
    for j in range(i - 1, -1, -1):
        if tokens[j][1] == ")":
            depth += 1
        elif tokens[j][1] == "(":
            if depth == 0:
                return j > 0 and word(tokens[j - 1]) in names
            depth -= 1
    return False


def functions(tokens, block=None):
    """(name, header tokens, body tokens) of each CREATE FUNCTION; for one made inside a
    DO block (`block`, directly or by EXECUTE of a dollar-quoted string), the body is
    the whole block."""
    for stmt in statements(tokens):
        words = [word(t) for t in stmt]
        if words[:1] == ["do"]:
            body = next((t for t in stmt if t[0] == "dollar"), None)
            if body:
                inner = tokenize(*body[3])
                yield from functions(inner, inner)
            continue
        if block is not None:
            for t in stmt:
                if t[0] == "dollar":
                    yield from functions(tokenize(*t[3]), block)
        k = next((j for j in range(len(words)) if words[j:j + 2] == ["create", "function"]
                  or words[j:j + 4] == ["create", "or", "replace", "function"]), None)
        if k is None:
            continue
        stmt, words = stmt[k:], words[k:]
        k = words.index("function") + 1
        name = stmt[k][1] + (stmt[k + 1][1] + stmt[k + 2][1] if stmt[k + 1][1] == "." else "")
        body_at = next((j for j, t in enumerate(stmt)
                        if t[0] == "dollar" and words[j - 1] == "as"), None)
        if body_at is not None:
            header, body = stmt[:body_at] + stmt[body_at + 1:], tokenize(*stmt[body_at][3])
        elif "return" in words:  # a SQL-standard body: RETURN expression
            r = words.index("return")
            header, body = stmt[:r], stmt[r:]
        else:
            header, body = stmt, []
        yield name, header, block if block is not None else body


def sets_search_path(header):
    return any(word(header[j]) == "set" and word(header[j + 1]) == "search_path"
               for j in range(len(header) - 1))


def language(header):
    words = [word(t) or t[1].lower() for t in header]
    return words[words.index("language") + 1] if "language" in words else None


def main(paths):
    bad = checked = 0
    for path in paths:
        text = open(path, encoding="utf-8").read()
        rel = os.path.relpath(path, ROOT)
        for name, header, body in functions(tokenize(text)):
            if sets_search_path(header) or language(header) not in ("sql", "plpgsql"):
                continue
            checked += 1
            for offset, what in sorted(set(problems(body))):
                line = text.count("\n", 0, offset) + 1
                print(f"{rel}:{line}: {name}: {what}; {name} sets no search_path")
                bad += 1
    if bad:
        print(f"{bad} unqualified names resolved through the caller's search_path (SPEC Security)")
        return 1
    print(f"{checked} SQL and PL/pgSQL functions without SET search_path: "
          "every operator, function, type, collation and relation schema-qualified")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT_FILES))
