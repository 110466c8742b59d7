package idempotency.servlet;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The request's fingerprint, computed here exactly as the server's idem_fingerprint(jsonb)
 * computes it (docs/fingerprint.md) for the document {"method": M, "path": P, "body": B}:
 * B is the body's JSON value when the body is JSON, null when there is none; any other
 * body gives {"method": M, "path": P, "raw": HEX}, HEX the SHA-256 of its bytes. P is the
 * path with the query string, as sent.
 */
public final class Fingerprint {
  private static final JsonFactory JSON = new JsonFactory();

  /** Not JSON that jsonb accepts. */
  private static final class NotJsonb extends Exception {
    private static final long serialVersionUID = 1L;
  }

  private Fingerprint() {}

  /** The request's fingerprint: 32 bytes. */
  public static byte[] of(String method, String path, byte[] body) {
    String head = "\"method\":" + quote(method) + ",\"path\":" + quote(path);
    String document;
    if (body.length == 0) {
      document = "{\"body\":null," + head + "}";
    } else {
      String canonical = canonicalJsonOrNull(body);
      document = canonical != null
          ? "{\"body\":" + canonical + "," + head + "}"
          : "{" + head + ",\"raw\":\"" + HexFormat.of().formatHex(sha256(body)) + "\"}";
    }
    return sha256(document.getBytes(StandardCharsets.UTF_8));
  }

  /**
   * The canonical text of a JSON document (docs/fingerprint.md), or null when it is not
   * JSON that jsonb accepts. Numbers are kept as written and written in plain decimal;
   * members are sorted by their UTF-8 bytes; of duplicate keys the last wins.
   */
  public static String canonicalJsonOrNull(byte[] text) {
    try {
      // Strict UTF-8 first: Jackson would guess UTF-16 or UTF-32 from the first bytes.
      String decoded = StandardCharsets.UTF_8.newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(ByteBuffer.wrap(text)).toString();
      try (JsonParser parser = JSON.createParser(decoded)) {
        JsonToken first = parser.nextToken();
        if (first == null) {
          return null;
        }
        String out = value(parser, first);
        if (parser.nextToken() != null) {
          return null; // something after the value
        }
        return out;
      }
    } catch (IOException | NotJsonb e) { // CharacterCodingException: not UTF-8
      return null;
    }
  }

  private static String value(JsonParser parser, JsonToken token) throws IOException, NotJsonb {
    switch (token) {
      case START_ARRAY: {
        List<String> elements = new ArrayList<>();
        for (JsonToken t = parser.nextToken(); t != JsonToken.END_ARRAY; t = parser.nextToken()) {
          elements.add(value(parser, t));
        }
        return "[" + String.join(",", elements) + "]";
      }
      case START_OBJECT: {
        Map<String, String> members = new TreeMap<>(Fingerprint::compareUtf8);
        for (JsonToken t = parser.nextToken(); t != JsonToken.END_OBJECT; t = parser.nextToken()) {
          String name = string(parser.getCurrentName());
          members.put(name, value(parser, parser.nextToken()));
        }
        List<String> out = new ArrayList<>();
        members.forEach((k, v) -> out.add(quote(k) + ":" + v));
        return "{" + String.join(",", out) + "}";
      }
      case VALUE_STRING:
        return quote(string(parser.getText()));
      case VALUE_NUMBER_INT:
      case VALUE_NUMBER_FLOAT:
        return number(parser.getText());
      case VALUE_TRUE:
        return "true";
      case VALUE_FALSE:
        return "false";
      case VALUE_NULL:
        return "null";
      default:
        throw new NotJsonb();
    }
  }

  /** A string jsonb takes: no U+0000, no lone surrogate (an escape of one half of a pair). */
  private static String string(String s) throws NotJsonb {
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == 0) {
        throw new NotJsonb();
      }
      if (Character.isHighSurrogate(c)) {
        if (i + 1 >= s.length() || !Character.isLowSurrogate(s.charAt(i + 1))) {
          throw new NotJsonb();
        }
        i++;
      } else if (Character.isLowSurrogate(c)) {
        throw new NotJsonb();
      }
    }
    return s;
  }

  /**
   * A JSON number literal's exact value in plain decimal: no exponent, no '+', no leading
   * or trailing zeros, every zero "0".
   */
  static String number(String literal) throws NotJsonb {
    String sign = "";
    if (literal.startsWith("-")) {
      sign = "-";
      literal = literal.substring(1);
    }
    String mantissa = literal;
    long exponent = 0;
    int e = Math.max(literal.indexOf('e'), literal.indexOf('E'));
    if (e >= 0) {
      try {
        exponent = new BigInteger(literal.substring(e + 1)).longValueExact();
      } catch (ArithmeticException | NumberFormatException x) {
        throw new NotJsonb();
      }
      if (exponent > 1_000_000_000L || exponent < -1_000_000_000L) {
        throw new NotJsonb();
      }
      mantissa = literal.substring(0, e);
    }
    String integer = mantissa;
    String fraction = "";
    int dot = mantissa.indexOf('.');
    if (dot >= 0) {
      integer = mantissa.substring(0, dot);
      fraction = mantissa.substring(dot + 1);
    }
    String all = integer + fraction;
    String digits = all.replaceFirst("^0+", "");
    // Where the decimal point falls among the significant digits.
    long point = integer.length() + exponent - (all.length() - digits.length());
    digits = digits.replaceFirst("0+$", "");
    if (digits.isEmpty()) {
      return "0";
    }
    // Beyond jsonb's numeric range (and so that 1e999999999 cannot exhaust memory).
    if (point > 131072 || digits.length() - point > 16383) {
      throw new NotJsonb();
    }
    if (point <= 0) {
      return sign + "0." + "0".repeat((int) -point) + digits;
    }
    if (point < digits.length()) {
      return sign + digits.substring(0, (int) point) + "." + digits.substring((int) point);
    }
    return sign + digits + "0".repeat((int) (point - digits.length()));
  }

  /**
   * A string as the canonical text writes it: '"' and '\' escaped, \b \t \n \f \r, other
   * characters below U+0020 as a six-character escape (backslash, u, 00xx, lowercase),
   * everything else as it is.
   */
  static String quote(String s) {
    StringBuilder b = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"': b.append("\\\""); break;
        case '\\': b.append("\\\\"); break;
        case '\b': b.append("\\b"); break;
        case '\t': b.append("\\t"); break;
        case '\n': b.append("\\n"); break;
        case '\f': b.append("\\f"); break;
        case '\r': b.append("\\r"); break;
        default:
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
      }
    }
    return b.append('"').toString();
  }

  private static int compareUtf8(String a, String b) {
    return java.util.Arrays.compareUnsigned(a.getBytes(StandardCharsets.UTF_8), b.getBytes(StandardCharsets.UTF_8));
  }

  static byte[] sha256(byte[] data) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(data);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
