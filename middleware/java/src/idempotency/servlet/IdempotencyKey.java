package idempotency.servlet;

import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The Idempotency-Key field: the IETF draft's Structured Field String (RFC 8941),
 * optionally with parameters, which are checked and ignored, or a bare key as most
 * clients send it. The same rules, and the same messages, in every language's middleware
 * (docs/middleware.md, "The key").
 */
public final class IdempotencyKey {
  private static final String CHARS = "(?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e]|\\\\[\"\\\\])*";
  private static final Pattern FIELD = Pattern.compile(
      "\"(" + CHARS + ")\"(?:;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:\"" + CHARS
          + "\"|[A-Za-z0-9*:?.+/=!#$%&'^_`|~-]+))?)*");
  private static final Pattern ESCAPE = Pattern.compile("\\\\(.)");

  /** The field is not one usable key; the message says why. */
  public static final class MalformedKeyException extends Exception {
    private static final long serialVersionUID = 1L;

    MalformedKeyException(String message) {
      super(message);
    }
  }

  private IdempotencyKey() {}

  /**
   * The key in the field's values (one string per field line; servlet containers give
   * each byte as one character, ISO-8859-1).
   */
  public static String parse(List<String> values) throws MalformedKeyException {
    if (values.size() != 1) {
      throw new MalformedKeyException("more than one Idempotency-Key field: send one");
    }
    String text = values.get(0).replaceAll("^[ \\t]+|[ \\t]+$", "");
    if (text.isEmpty()) {
      throw new MalformedKeyException("the Idempotency-Key field is empty");
    }
    String key;
    if (text.startsWith("\"")) {
      Matcher match = FIELD.matcher(text);
      if (!match.matches()) {
        throw new MalformedKeyException("the key starts with a double quote but is not one Structured Field"
            + " String: a closing quote, \\\" and \\\\ the only escapes, nothing after it but parameters"
            + " (;name=value)");
      }
      key = ESCAPE.matcher(match.group(1)).replaceAll("$1");
    } else {
      key = text;
      int quote = key.indexOf('"');
      if (quote >= 0) {
        throw new MalformedKeyException("a bare key cannot hold a double quote (at position " + (quote + 1)
            + "): send it as a Structured Field String, \"...\", with \\\" for the quote");
      }
    }
    // An idem_key: 1 to 255 visible ASCII characters.
    if (key.isEmpty()) {
      throw new MalformedKeyException("the key is empty: 1 to 255 visible ASCII characters");
    }
    for (int i = 0; i < key.length(); i++) {
      char c = key.charAt(i);
      if (c < 0x21 || c > 0x7e) {
        throw new MalformedKeyException(
            "the key has a character that is not visible ASCII (0x21 to 0x7E) at position " + (i + 1));
      }
    }
    if (key.length() > 255) {
      throw new MalformedKeyException("the key is " + key.length() + " characters long: at most 255");
    }
    return key;
  }
}
