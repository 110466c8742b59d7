package idempotency.servlet;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.Charset;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.Base64;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.function.IntPredicate;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.stream.Collectors;
import javax.sql.DataSource;

/**
 * A jakarta.servlet filter (Spring Boot 3 and later, Tomcat 10, Jetty 11 and later) that
 * serves the Idempotency-Key header from the idempotency PostgreSQL extension, on the
 * application's {@link DataSource}. docs/middleware.md in the repository has the whole
 * story.
 *
 * <p>For each request it is mapped to (GET, HEAD, OPTIONS and TRACE pass untouched): parse
 * the key, fingerprint the request, take a connection, claim the key and run the rest of
 * the chain with that connection inside the claim's transaction (the request attribute
 * {@link #ATTRIBUTE}, a {@link Claim}); hold the response back, store it with
 * idem_complete (or idem_fail for a final error), commit, then send it. A retry gets the
 * stored response with Idempotent-Replayed: true. One filter instance serves one set of
 * options: map one per kind of route.
 */
public final class IdempotencyFilter implements Filter {
  /** The request attribute that holds the {@link Claim}. */
  public static final String ATTRIBUTE = Claim.class.getName();

  private static final Logger LOG = Logger.getLogger(IdempotencyFilter.class.getName());
  private static final ObjectMapper JSON = new ObjectMapper();

  // The server's idempotency.max_response_size in bytes (the SQL-only edition may leave it
  // unset: its default then), read with the claim: no round trip of its own.
  private static final String LIMIT =
      "pg_size_bytes(coalesce(current_setting('idempotency.max_response_size', true), '1MB'))";
  private static final String CLAIM = "SELECT outcome, response::text, attempt, checkpoint,"
      + " checkpoint_data::text, ceil(extract(epoch FROM retry_after))::int, " + LIMIT
      + " FROM idem_claim(?, ?::idem_key, ?, ?::interval, ?::interval, ?::interval)";

  // Errors that say "come back later", answered 409 with Retry-After, never retried inside
  // the request (a retry would run the handler again): a wait that ran out, a
  // serialization failure or deadlock, a lock timeout, a lease holder fenced out.
  private static final Set<String> BUSY = Set.of("IK003", "IK005", "40001", "40P01", "55P03");
  private static final Map<String, Integer> STATUS =
      Map.of("IK001", 422, "22P02", 400, "57014", 503, "25006", 503, "IK006", 503);
  private static final Set<String> SAFE = Set.of("GET", "HEAD", "OPTIONS", "TRACE");

  private final DataSource dataSource;
  private boolean required = true;
  private String scope;
  private Duration lease;
  private Duration ttl;
  private Duration wait;
  private List<String> storedHeaders = List.of("content-type", "location");
  private IntPredicate isFinal = IdempotencyFilter::finalError;
  private long maxResponseSize = Long.MAX_VALUE;

  /** Keys belong to the role the DataSource logs in as. */
  public IdempotencyFilter(DataSource dataSource) {
    if (dataSource == null) {
      throw new IllegalArgumentException("idempotency: a DataSource is required");
    }
    this.dataSource = dataSource;
  }

  /** Whether a request must carry a key (default true); without one it runs as if unfiltered, in one transaction. */
  public IdempotencyFilter required(boolean value) {
    required = value;
    return this;
  }

  /** The keys' scope; default "METHOD /path" (the path within the application). */
  public IdempotencyFilter scope(String value) {
    scope = value;
    return this;
  }

  /** Lease mode: the claim commits before the handler runs, for this long. */
  public IdempotencyFilter lease(Duration value) {
    lease = value;
    return this;
  }

  /** The dedup window; default the server's idempotency.default_ttl. */
  public IdempotencyFilter ttl(Duration value) {
    ttl = value;
    return this;
  }

  /** How long a claim waits for a request in flight; default idempotency.wait_timeout. */
  public IdempotencyFilter waitFor(Duration value) {
    wait = value;
    return this;
  }

  /** The response headers stored and replayed (default Content-Type, Location). */
  public IdempotencyFilter storedHeaders(List<String> names) {
    storedHeaders = names.stream().map(n -> n.toLowerCase(Locale.ROOT)).collect(Collectors.toList());
    return this;
  }

  /** Which error responses are final: stored with idem_fail rather than rolled back. */
  public IdempotencyFilter isFinal(IntPredicate value) {
    isFinal = value;
    return this;
  }

  /** The largest response body held back, in bytes (never more than the server's limit). */
  public IdempotencyFilter maxResponseSize(long bytes) {
    maxResponseSize = bytes;
    return this;
  }

  /**
   * The default for which error responses are final, stored with idem_fail and replayed:
   * a 4xx other than those that say "try again" (408, 409, 423, 425, 429).
   */
  public static boolean finalError(int status) {
    return status >= 400 && status < 500 && status != 408 && status != 409 && status != 423
        && status != 425 && status != 429;
  }

  @Override
  public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
      throws IOException, ServletException {
    HttpServletRequest request = (HttpServletRequest) req;
    HttpServletResponse response = (HttpServletResponse) res;
    if (SAFE.contains(request.getMethod())) {
      chain.doFilter(req, res);
      return;
    }
    String path = request.getServletPath() + (request.getPathInfo() == null ? "" : request.getPathInfo());
    String keyScope = scope != null ? scope : request.getMethod() + " " + path;
    String key = null;
    List<String> values = Collections.list(request.getHeaders("Idempotency-Key"));
    if (!values.isEmpty()) {
      try {
        key = IdempotencyKey.parse(values);
      } catch (IdempotencyKey.MalformedKeyException e) {
        send(response, problem(400, "malformed-key", "Idempotency-Key is malformed", e.getMessage()));
        return;
      }
    } else if (required) {
      send(response, problem(400, "missing-key", "Idempotency-Key is missing",
          keyScope + " requires an Idempotency-Key header"));
      return;
    }
    byte[] body = request.getInputStream().readAllBytes();
    String uri = request.getRequestURI() + (request.getQueryString() == null ? "" : "?" + request.getQueryString());
    byte[] fingerprint = Fingerprint.of(request.getMethod(), uri, body);
    BufferedRequest again = new BufferedRequest(request, body); // the handler reads it again
    Answer answer;
    try (Connection connection = dataSource.getConnection()) {
      Claim claim = new Claim(connection, dataSource, keyScope, key, lease != null && key != null);
      boolean autoCommit = connection.getAutoCommit();
      try {
        answer = lease != null && key != null
            ? withLease(connection, claim, fingerprint, again, response, chain)
            : inTransaction(connection, claim, fingerprint, again, response, chain);
      } catch (SQLException e) {
        rollback(connection);
        answer = databaseError(e);
      } finally {
        try {
          connection.setAutoCommit(autoCommit); // as the pool lent it
        } catch (SQLException e) { // a broken connection: the pool's to find out
          LOG.log(Level.WARNING, "idempotency: " + e.getMessage());
        }
      }
    } catch (SQLException e) { // no connection
      answer = databaseError(e);
    }
    if (answer.notStored != null) {
      answer = notStored(answer.notStored, answer.limit);
    }
    if (!answer.captured) {
      response.reset(); // the handler's headers, if it ran
    }
    send(response, answer);
  }

  /** Claim, handler and completion in one transaction. */
  private Answer inTransaction(Connection c, Claim claim, byte[] fingerprint, HttpServletRequest request,
      HttpServletResponse response, FilterChain chain) throws SQLException {
    c.setAutoCommit(false);
    long limit;
    if (claim.getKey() != null) {
      Claimed claimed = claim(c, claim, fingerprint);
      if (claimed.answer != null) {
        c.commit();
        return claimed.answer;
      }
      limit = claimed.limit;
    } else {
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT " + LIMIT)) {
        r.next();
        limit = r.getLong(1);
      }
    }
    Answer captured = run(request, response, chain, claim, Math.min(limit, maxResponseSize));
    if (finish(c, claim, captured, null)) {
      c.commit();
    } else {
      c.rollback(); // the claim and the handler's writes are gone
    }
    return captured;
  }

  /**
   * The claim commits first (a lease); the handler then runs in a transaction of its own,
   * which completes the key with the attempt.
   */
  private Answer withLease(Connection c, Claim claim, byte[] fingerprint, HttpServletRequest request,
      HttpServletResponse response, FilterChain chain) throws SQLException {
    c.setAutoCommit(false);
    Claimed claimed = claim(c, claim, fingerprint);
    c.commit();
    if (claimed.answer != null) {
      return claimed.answer;
    }
    boolean finished = false;
    try {
      Answer captured = run(request, response, chain, claim, Math.min(claimed.limit, maxResponseSize));
      finished = finish(c, claim, captured, claim.attempt);
      if (finished) {
        c.commit();
      }
      return captured;
    } finally {
      // Not finished (an error, or a response that is not kept): give the key up so a
      // retry runs afresh, unless the handler recorded a checkpoint: then the claim stays
      // until its lease runs out, and a retry takes it over from there.
      if (!finished) {
        rollback(c);
        if (!claim.checkpointed) {
          try (PreparedStatement s = c.prepareStatement("SELECT idem_release(?, ?::idem_key, ?)")) {
            c.setAutoCommit(true);
            s.setString(1, claim.getScope());
            s.setString(2, claim.getKey());
            s.setInt(3, claim.attempt);
            s.execute();
          } catch (SQLException e) { // the lease runs out instead
            LOG.log(Level.WARNING, "idempotency: idem_release failed: " + e.getMessage());
          }
        }
      }
    }
  }

  private static final class Claimed {
    Answer answer;
    long limit;
  }

  private Claimed claim(Connection c, Claim claim, byte[] fingerprint) throws SQLException {
    Claimed claimed = new Claimed();
    try (PreparedStatement s = c.prepareStatement(CLAIM)) {
      s.setString(1, claim.getScope());
      s.setString(2, claim.getKey());
      s.setBytes(3, fingerprint);
      s.setString(4, interval(ttl));
      s.setString(5, interval(lease));
      s.setString(6, interval(wait));
      try (ResultSet r = s.executeQuery()) {
        r.next();
        String outcome = r.getString(1);
        switch (outcome) {
          case "replay":
            claimed.answer = stored(r.getString(2));
            break;
          case "in_progress":
            claimed.answer = busy(r.getInt(6));
            break;
          case "claimed":
            claim.attempt = r.getInt(3);
            claim.checkpoint = r.getString(4);
            claim.checkpointData = r.getString(5);
            claimed.limit = r.getLong(7);
            break;
          default:
            throw new IllegalStateException("idem_claim answered " + outcome + " to a fresh transaction");
        }
      }
    }
    return claimed;
  }

  /** Runs the rest of the chain with the response held back; a handler's exception is its failure: 500. */
  private Answer run(HttpServletRequest request, HttpServletResponse response, FilterChain chain, Claim claim,
      long limit) {
    Recorder recorder = new Recorder(response, limit);
    request.setAttribute(ATTRIBUTE, claim);
    try {
      chain.doFilter(request, recorder);
      if (request.isAsyncStarted()) {
        recorder.streamed(); // an async response goes on after this filter returns
      }
      recorder.flushWriter();
    } catch (IOException | ServletException | RuntimeException e) {
      LOG.log(Level.SEVERE, "idempotency: the handler failed", e);
      return problem(500, "internal", "Internal Server Error", "the handler failed");
    } finally {
      request.removeAttribute(ATTRIBUTE);
    }
    Answer answer = new Answer(recorder.status, recorder.body.toByteArray(), true);
    answer.notStored = recorder.notStored;
    answer.limit = limit;
    answer.headers = new java.util.HashMap<>();
    for (String name : storedHeaders) {
      String value = name.equals("content-type") ? response.getContentType() : response.getHeader(name);
      if (value != null) {
        answer.headers.put(name, value);
      }
    }
    return answer;
  }

  /** Stores the response; false if it is not to be kept (roll back). */
  private boolean finish(Connection c, Claim claim, Answer a, Integer attempt) throws SQLException {
    if (a.notStored != null) {
      return false;
    }
    if (claim.getKey() == null) {
      return a.status < 500;
    }
    String fn = "idem_complete";
    if (a.status >= 400) {
      if (!a.captured || !isFinal.test(a.status)) {
        return false;
      }
      fn = "idem_fail";
    }
    ObjectNode stored = JSON.createObjectNode();
    stored.put("status", a.status);
    ObjectNode headers = stored.putObject("headers");
    for (String name : storedHeaders) {
      String value = a.headers.get(name);
      if (value != null) {
        headers.put(name, value);
      }
    }
    String text = utf8OrNull(a.body);
    // jsonb holds valid UTF-8 without U+0000; anything else is stored as base64.
    if (text != null && text.indexOf('\0') < 0) {
      stored.put("body", text);
    } else {
      stored.put("body_base64", Base64.getEncoder().encodeToString(a.body));
    }
    try (PreparedStatement s = c.prepareStatement("SELECT " + fn + "(?, ?::idem_key, ?::jsonb, ?)")) {
      s.setString(1, claim.getScope());
      s.setString(2, claim.getKey());
      s.setString(3, JSON.writeValueAsString(stored));
      s.setObject(4, attempt, java.sql.Types.INTEGER);
      s.execute();
    } catch (SQLException e) {
      // The stored document (the body escaped or in base64, the headers) over the
      // server's limit: the same rule as a body over it. The caller rolls back.
      if (!"54000".equals(e.getSQLState())) {
        throw e;
      }
      a.notStored = "stored-too-large";
      return false;
    } catch (IOException e) { // Jackson writing a tree: not to be
      throw new IllegalStateException(e);
    }
    return true;
  }

  /** An answer: the handler's (captured: its headers are on the real response) or the filter's own. */
  private static final class Answer {
    final int status;
    final byte[] body;
    final boolean captured;
    Map<String, String> headers; // captured: the stored headers, read when stored
    String notStored;
    long limit;

    Answer(int status, byte[] body, boolean captured) {
      this.status = status;
      this.body = body;
      this.captured = captured;
    }
  }

  private Answer stored(String text) throws SQLException {
    try {
      JsonNode s = JSON.readTree(text);
      byte[] body = s.has("body")
          ? s.get("body").asText().getBytes(StandardCharsets.UTF_8)
          : Base64.getDecoder().decode(s.path("body_base64").asText(""));
      Answer a = new Answer(s.get("status").asInt(), body, false);
      a.headers = new java.util.LinkedHashMap<>();
      for (Iterator<Map.Entry<String, JsonNode>> i = s.path("headers").fields(); i.hasNext();) {
        Map.Entry<String, JsonNode> h = i.next();
        a.headers.put(h.getKey(), h.getValue().asText());
      }
      a.headers.put("idempotent-replayed", "true");
      return a;
    } catch (IOException e) {
      throw new SQLException("idempotency: a stored response that is not one", e);
    }
  }

  private static Answer busy(int seconds) {
    Answer a = problem(409, "in-progress", "A request is outstanding for this Idempotency-Key",
        "a request with this key is being processed; retry after Retry-After seconds");
    a.headers.put("retry-after", Integer.toString(Math.max(1, seconds)));
    return a;
  }

  private static Answer databaseError(SQLException e) {
    String state = e.getSQLState() == null ? "" : e.getSQLState();
    if (BUSY.contains(state)) {
      return busy(1);
    }
    if (state.equals("IK001")) {
      return problem(422, "key-reused", "Idempotency-Key is already used",
          "this key was used for another request; use a new key for a new request");
    }
    Integer status = STATUS.get(state);
    if (status == null) {
      LOG.log(Level.SEVERE, "idempotency: " + state, e);
      return problem(500, "database", "The request could not be served", "internal error");
    }
    return problem(status, "database", "The request could not be served", e.getMessage());
  }

  /**
   * The rule for a response too large to store, or streamed: not stored, its work rolled
   * back, 500 with Idempotent-Not-Stored saying why.
   */
  private static Answer notStored(String reason, long limit) {
    String detail;
    switch (reason) {
      case "too-large":
        detail = "the response is larger than idempotency.max_response_size (" + limit + " bytes)";
        break;
      case "stored-too-large":
        detail = "the response as stored (its body escaped or in base64, and its headers)"
            + " is larger than idempotency.max_response_size";
        break;
      default:
        detail = "the response was streamed, and a response is held back until its transaction commits";
    }
    Answer a = problem(500, "response-not-stored", "The response could not be stored",
        detail + ": it was not stored, and the request's work was rolled back");
    a.headers.put("idempotent-not-stored", reason.replaceFirst("^stored-", ""));
    return a;
  }

  /** A JSON error (RFC 9457 shape). */
  private static Answer problem(int status, String kind, String title, String detail) {
    ObjectNode p = JSON.createObjectNode();
    p.put("type", "about:blank#" + kind);
    p.put("title", title);
    p.put("status", status);
    p.put("detail", detail);
    Answer a = new Answer(status, p.toString().getBytes(StandardCharsets.UTF_8), false);
    a.headers = new java.util.LinkedHashMap<>();
    a.headers.put("content-type", "application/problem+json");
    return a;
  }

  private static void send(HttpServletResponse response, Answer a) throws IOException {
    response.setStatus(a.status);
    if (!a.captured) {
      for (Map.Entry<String, String> h : a.headers.entrySet()) {
        response.setHeader(h.getKey(), h.getValue());
      }
    }
    response.setContentLength(a.body.length);
    ServletOutputStream out = response.getOutputStream();
    out.write(a.body);
    out.flush();
  }

  private static void rollback(Connection c) {
    try {
      if (!c.getAutoCommit()) {
        c.rollback();
      }
    } catch (SQLException e) {
      LOG.log(Level.WARNING, "idempotency: rollback failed: " + e.getMessage());
    }
  }

  private static String interval(Duration d) {
    return d == null || d.isZero() || d.isNegative() ? null : d.toMillis() + " milliseconds";
  }

  private static String utf8OrNull(byte[] bytes) {
    try {
      return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(bytes)).toString();
    } catch (CharacterCodingException e) {
      return null;
    }
  }

  /** The request with its body, already read for the fingerprint, to read again. */
  private static final class BufferedRequest extends HttpServletRequestWrapper {
    private final byte[] body;

    BufferedRequest(HttpServletRequest request, byte[] body) {
      super(request);
      this.body = body;
    }

    @Override
    public ServletInputStream getInputStream() {
      ByteArrayInputStream in = new ByteArrayInputStream(body);
      return new ServletInputStream() {
        @Override
        public int read() {
          return in.read();
        }

        @Override
        public int read(byte[] b, int off, int len) {
          return in.read(b, off, len);
        }

        @Override
        public boolean isFinished() {
          return in.available() == 0;
        }

        @Override
        public boolean isReady() {
          return true;
        }

        @Override
        public void setReadListener(ReadListener listener) {
          throw new IllegalStateException("idempotency: the body is already read");
        }
      };
    }

    @Override
    public BufferedReader getReader() {
      String encoding = getCharacterEncoding();
      Charset charset = encoding == null ? StandardCharsets.UTF_8 : Charset.forName(encoding);
      return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body), charset));
    }
  }

  /**
   * Holds the handler's response back until the transaction commits: its status and body
   * here, its headers on the real response (not yet committed). A body over the limit, or
   * a flushed one (flushBuffer, an async response: streamed), is not kept: its bytes are
   * dropped as they come, and notStored says why.
   */
  private final class Recorder extends HttpServletResponseWrapper {
    int status = 200;
    final ByteArrayOutputStream body = new ByteArrayOutputStream();
    final long limit;
    String notStored;
    private PrintWriter writer;
    private final ServletOutputStream stream = new ServletOutputStream() {
      @Override
      public void write(int b) {
        write(new byte[] {(byte) b}, 0, 1);
      }

      @Override
      public void write(byte[] b, int off, int len) {
        if (notStored != null) {
          return;
        }
        if ((long) body.size() + len > limit) {
          notStored = "too-large";
          body.reset();
          return;
        }
        body.write(b, off, len);
      }

      @Override
      public boolean isReady() {
        return true;
      }

      @Override
      public void setWriteListener(WriteListener listener) {
        throw new IllegalStateException("idempotency: a response held back cannot be written asynchronously");
      }
    };

    Recorder(HttpServletResponse response, long limit) {
      super(response);
      this.limit = limit;
    }

    void streamed() {
      if (notStored == null) {
        notStored = "streamed";
      }
      body.reset();
    }

    void flushWriter() {
      if (writer != null) {
        writer.flush();
      }
    }

    @Override
    public void setStatus(int sc) {
      status = sc;
    }

    @Override
    public int getStatus() {
      return status;
    }

    @Override
    public void sendError(int sc) throws IOException {
      sendError(sc, null);
    }

    @Override
    public void sendError(int sc, String msg) throws IOException {
      status = sc;
      body.reset();
      if (msg != null) {
        byte[] text = msg.getBytes(StandardCharsets.UTF_8);
        stream.write(text, 0, text.length);
      }
    }

    @Override
    public void sendRedirect(String location) {
      status = 302;
      setHeader("Location", location);
    }

    @Override
    public ServletOutputStream getOutputStream() {
      return stream;
    }

    @Override
    public PrintWriter getWriter() {
      if (writer == null) {
        writer = new PrintWriter(new OutputStreamWriter(stream, Charset.forName(getCharacterEncoding())));
      }
      return writer;
    }

    @Override
    public void flushBuffer() {
      streamed();
    }

    @Override
    public boolean isCommitted() {
      return false;
    }

    @Override
    public void reset() {
      super.reset();
      status = 200;
      body.reset();
    }

    @Override
    public void resetBuffer() {
      body.reset();
    }

    @Override
    public void setContentLength(int len) {}

    @Override
    public void setContentLengthLong(long len) {}

    @Override
    public void setBufferSize(int size) {}
  }
}
