package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// RequestFingerprint is the request's fingerprint (32 bytes), computed here exactly as
// the server's idem_fingerprint(jsonb) computes it (docs/fingerprint.md) for the document
// {"method": M, "path": P, "body": B}: B is the body's JSON value when the body is JSON,
// null when there is none; any other body gives {"method": M, "path": P, "raw": HEX},
// HEX the SHA-256 of its bytes. P is the path with the query string, as sent.
func RequestFingerprint(method, path string, body []byte) []byte {
	head := `"method":` + quote(method) + `,"path":` + quote(path)
	var document string
	if len(body) == 0 {
		document = `{"body":null,` + head + `}`
	} else if canonical, err := CanonicalJSON(body); err == nil {
		document = `{"body":` + canonical + `,` + head + `}`
	} else {
		raw := sha256.Sum256(body)
		document = `{` + head + `,"raw":"` + hex.EncodeToString(raw[:]) + `"}`
	}
	sum := sha256.Sum256([]byte(document))
	return sum[:]
}

var errNotJSONB = errors.New("not JSON that jsonb accepts")

// CanonicalJSON is the canonical text of a JSON document (docs/fingerprint.md). Numbers
// are kept as written (json.Number) and written in plain decimal; members are sorted by
// their bytes, which is Go's string order; of duplicate keys the last wins.
func CanonicalJSON(text []byte) (string, error) {
	if !utf8.Valid(text) {
		return "", errNotJSONB
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	out, err := value(dec)
	if err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errNotJSONB // something after the value
	}
	return out, nil
}

func value(dec *json.Decoder) (string, error) {
	token, err := dec.Token()
	if err != nil {
		return "", err
	}
	switch t := token.(type) {
	case json.Delim:
		if t == '[' {
			var elements []string
			for dec.More() {
				v, err := value(dec)
				if err != nil {
					return "", err
				}
				elements = append(elements, v)
			}
			_, err := dec.Token() // ]
			return "[" + strings.Join(elements, ",") + "]", err
		}
		members := map[string]string{}
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return "", err
			}
			v, err := value(dec)
			if err != nil {
				return "", err
			}
			members[key.(string)] = v
		}
		if _, err := dec.Token(); err != nil { // }
			return "", err
		}
		keys := make([]string, 0, len(members))
		for k := range members {
			if strings.ContainsRune(k, 0) {
				return "", errNotJSONB
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = quote(k) + ":" + members[k]
		}
		return "{" + strings.Join(keys, ",") + "}", nil
	case string:
		if strings.ContainsRune(t, 0) { // jsonb refuses U+0000
			return "", errNotJSONB
		}
		return quote(t), nil
	case json.Number:
		return number(string(t))
	case bool:
		return strconv.FormatBool(t), nil
	default:
		return "null", nil
	}
}

// number writes a JSON number literal's exact value in plain decimal: no exponent, no
// '+', no leading or trailing zeros, every zero "0".
func number(literal string) (string, error) {
	sign := ""
	if strings.HasPrefix(literal, "-") {
		sign, literal = "-", literal[1:]
	}
	mantissa, exponent := literal, 0
	if i := strings.IndexAny(literal, "eE"); i >= 0 {
		e, err := strconv.Atoi(literal[i+1:])
		if err != nil || e > 1e9 || e < -1e9 {
			return "", errNotJSONB
		}
		mantissa, exponent = literal[:i], e
	}
	integer, fraction := mantissa, ""
	if i := strings.IndexByte(mantissa, '.'); i >= 0 {
		integer, fraction = mantissa[:i], mantissa[i+1:]
	}
	digits := strings.TrimLeft(integer+fraction, "0")
	// Where the decimal point falls among the significant digits.
	point := len(integer) + exponent - (len(integer+fraction) - len(digits))
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return "0", nil
	}
	// Beyond jsonb's numeric range (and so that 1e999999999 cannot exhaust memory).
	if point > 131072 || len(digits)-point > 16383 {
		return "", errNotJSONB
	}
	switch {
	case point <= 0:
		return sign + "0." + strings.Repeat("0", -point) + digits, nil
	case point < len(digits):
		return sign + digits[:point] + "." + digits[point:], nil
	default:
		return sign + digits + strings.Repeat("0", point-len(digits)), nil
	}
}

// quote writes a string as the canonical text does: `"` and `\` escaped, \b \t \n \f \r,
// other characters below U+0020 as \u00xx (lowercase), everything else as it is.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
