// The payments app of test/t/029_middleware.pl: embedded Tomcat 10 with the servlet
// filter of middleware/java and the PostgreSQL JDBC driver (Debian's jars).
//
//   POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
//                   amount over 1000: final, stored with idem_fail)
//   POST /tips      the same, key optional, responses held back up to 32768 bytes
//   POST /orders    lease mode: a checkpoint, then the payment
//
// Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
// handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
// throw after its insert; X-Test-Size: N pads the payment's answer to N bytes, and
// X-Test-Stream: 1 streams it (the response-size rule). The PG* variables and PORT come
// from the environment. "fingerprint", "vectors" and "keys" as arguments: the test's
// checks of the fingerprint and the key, as in the other apps. POST /manual: the same
// payment with idem_claim and idem_complete by hand, without the filter (the benchmark
// of test/bench/middleware).
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import idempotency.servlet.Claim;
import idempotency.servlet.Fingerprint;
import idempotency.servlet.IdempotencyFilter;
import idempotency.servlet.IdempotencyKey;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Objects;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.postgresql.ds.PGSimpleDataSource;

public final class PaymentsApp {
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws Exception {
    if (args.length > 0) {
      checks(args);
      return;
    }
    PGSimpleDataSource dataSource = new PGSimpleDataSource();
    dataSource.setServerNames(new String[] {System.getenv("PGHOST")});
    dataSource.setPortNumbers(new int[] {Integer.parseInt(System.getenv("PGPORT"))});
    dataSource.setDatabaseName(System.getenv("PGDATABASE"));
    dataSource.setUser(System.getenv("PGUSER"));
    dataSource.setApplicationName(System.getenv("PGAPPNAME"));

    Tomcat tomcat = new Tomcat();
    tomcat.setBaseDir(Files.createTempDirectory("tomcat").toString());
    Connector connector = new Connector();
    connector.setPort(Integer.parseInt(System.getenv("PORT")));
    connector.setProperty("address", "127.0.0.1");
    connector.setProperty("maxThreads", "8"); // at most 8 connections at once
    tomcat.setConnector(connector);
    Context context = tomcat.addContext("", new File(".").getAbsolutePath());
    route(context, "/payments", new Pay(), new IdempotencyFilter(dataSource));
    route(context, "/tips", new Pay(), new IdempotencyFilter(dataSource).required(false).maxResponseSize(32768));
    route(context, "/orders", new Order(), new IdempotencyFilter(dataSource).lease(Duration.ofSeconds(60)));
    Tomcat.addServlet(context, "manual", new Manual(dataSource));
    context.addServletMappingDecoded("/manual", "manual");
    tomcat.start();
    tomcat.getServer().await();
  }

  private static void route(Context context, String path, HttpServlet servlet, Filter filter) {
    String name = path.substring(1);
    Tomcat.addServlet(context, name, servlet);
    context.addServletMappingDecoded(path, name);
    FilterDef def = new FilterDef();
    def.setFilterName(name + "-idempotency");
    def.setFilter(filter);
    context.addFilterDef(def);
    FilterMap map = new FilterMap();
    map.setFilterName(def.getFilterName());
    map.addURLPattern(path);
    context.addFilterMap(map);
  }

  static final class Pay extends HttpServlet {
    private static final long serialVersionUID = 1L;

    @Override
    protected void doPost(HttpServletRequest request, HttpServletResponse response) throws IOException {
      Claim claim = (Claim) request.getAttribute(IdempotencyFilter.ATTRIBUTE);
      Connection db = claim.getConnection();
      JsonNode body = JSON.readTree(request.getInputStream());
      try {
        execute(db, "SELECT pg_advisory_xact_lock_shared(43)");
        long account = body.get("account").asLong();
        if (body.get("amount").asDouble() > 1000) {
          try (PreparedStatement s = db.prepareStatement("INSERT INTO declines(account) VALUES (?)")) {
            s.setLong(1, account);
            s.execute();
          }
          reply(response, 402, JSON.createObjectNode().put("error", "declined"));
          return;
        }
        long id = pay(db, account, body.get("amount"));
        if (request.getHeader("X-Test-Fail") != null) {
          throw new IllegalStateException("the handler failed after its insert");
        }
        if (request.getHeader("X-Test-Stream") != null) {
          response.setStatus(201);
          response.setContentType("application/json");
          response.getOutputStream().write(("{\"payment_id\": " + id + ", ").getBytes(StandardCharsets.UTF_8));
          response.flushBuffer();
          response.getOutputStream().write("\"streamed\": true}".getBytes(StandardCharsets.UTF_8));
          return;
        }
        if (request.getHeader("X-Test-Size") != null) {
          String head = "{\"payment_id\": " + id + ", \"pad\": \"";
          int size = Integer.parseInt(request.getHeader("X-Test-Size"));
          response.setStatus(201);
          response.setContentType("application/json");
          response.getOutputStream().write(
              (head + "x".repeat(size - head.length() - 2) + "\"}").getBytes(StandardCharsets.UTF_8));
          return;
        }
        response.setHeader("Location", "/payments/" + id);
        reply(response, 201, JSON.createObjectNode().put("payment_id", id).set("amount", body.get("amount")));
      } catch (SQLException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  static final class Order extends HttpServlet {
    private static final long serialVersionUID = 1L;

    @Override
    protected void doPost(HttpServletRequest request, HttpServletResponse response) throws IOException {
      Claim claim = (Claim) request.getAttribute(IdempotencyFilter.ATTRIBUTE);
      Connection db = claim.getConnection();
      JsonNode body = JSON.readTree(request.getInputStream());
      try {
        execute(db, "SELECT pg_advisory_xact_lock_shared(43)");
        // Here a payment provider would be called with a key derived from ours.
        claim.saveCheckpoint("charged", "{\"attempt\": " + claim.getAttempt() + "}");
        long id = pay(db, body.get("account").asLong(), body.get("amount"));
        reply(response, 201, JSON.createObjectNode().put("payment_id", id).set("amount", body.get("amount")));
      } catch (SQLException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  static final class Manual extends HttpServlet {
    private static final long serialVersionUID = 1L;
    private final transient javax.sql.DataSource dataSource;

    Manual(javax.sql.DataSource dataSource) {
      this.dataSource = dataSource;
    }

    @Override
    protected void doPost(HttpServletRequest request, HttpServletResponse response) throws IOException {
      String key = request.getHeader("Idempotency-Key");
      byte[] raw = request.getInputStream().readAllBytes();
      JsonNode body = JSON.readTree(raw);
      try (Connection db = dataSource.getConnection()) {
        db.setAutoCommit(false);
        try (PreparedStatement claim = db.prepareStatement(
            "SELECT outcome, response::text FROM idem_claim('POST /manual', ?::idem_key, ?)")) {
          claim.setString(1, key);
          claim.setBytes(2, Fingerprint.of("POST", "/manual", raw));
          try (ResultSet r = claim.executeQuery()) {
            r.next();
            if (r.getString(1).equals("replay")) {
              db.commit();
              JsonNode stored = JSON.readTree(r.getString(2));
              response.setStatus(stored.get("status").asInt());
              stored.get("headers").fields().forEachRemaining(h -> response.setHeader(h.getKey(), h.getValue().asText()));
              response.setHeader("Idempotent-Replayed", "true");
              response.getOutputStream().write(stored.get("body").asText().getBytes(StandardCharsets.UTF_8));
              return;
            }
            if (!r.getString(1).equals("claimed")) {
              db.rollback();
              response.setHeader("Retry-After", "1");
              response.sendError(409);
              return;
            }
          }
        }
        execute(db, "SELECT pg_advisory_xact_lock_shared(43)");
        long id = pay(db, body.get("account").asLong(), body.get("amount"));
        String text = JSON.writeValueAsString(JSON.createObjectNode().put("payment_id", id).set("amount", body.get("amount")));
        ObjectNode stored = JSON.createObjectNode().put("status", 201);
        stored.putObject("headers").put("content-type", "application/json").put("location", "/payments/" + id);
        stored.put("body", text);
        try (PreparedStatement complete = db.prepareStatement(
            "SELECT idem_complete('POST /manual', ?::idem_key, ?::jsonb)")) {
          complete.setString(1, key);
          complete.setString(2, JSON.writeValueAsString(stored));
          complete.execute();
        }
        db.commit();
        response.setStatus(201);
        response.setContentType("application/json");
        response.setHeader("Location", "/payments/" + id);
        response.getOutputStream().write(text.getBytes(StandardCharsets.UTF_8));
      } catch (SQLException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  static long pay(Connection db, long account, JsonNode amount) throws SQLException {
    try (PreparedStatement s =
        db.prepareStatement("INSERT INTO payments(account, amount) VALUES (?, ?::numeric) RETURNING id")) {
      s.setLong(1, account);
      s.setString(2, amount.asText());
      try (ResultSet r = s.executeQuery()) {
        r.next();
        return r.getLong(1);
      }
    }
  }

  static void execute(Connection db, String sql) throws SQLException {
    try (PreparedStatement s = db.prepareStatement(sql)) {
      s.execute();
    }
  }

  static void reply(HttpServletResponse response, int status, JsonNode body) throws IOException {
    response.setStatus(status);
    response.setContentType("application/json");
    response.getOutputStream().write(JSON.writeValueAsBytes(body));
  }

  // "fingerprint METHOD PATH BODY" prints it in hex; "vectors FILE" prints the names of
  // the vectors of test/fingerprint_vectors.json whose canonical text it gets wrong;
  // "keys FILE" those of test/middleware/key_vectors.json that it parses otherwise.
  static void checks(String[] args) throws IOException {
    switch (args[0]) {
      case "fingerprint":
        System.out.println(HexFormat.of().formatHex(
            Fingerprint.of(args[1], args[2], args[3].getBytes(StandardCharsets.UTF_8))));
        break;
      case "vectors":
        for (JsonNode v : JSON.readTree(Files.readString(Path.of(args[1])))) {
          String got = Fingerprint.canonicalJsonOrNull(v.get("input").asText().getBytes(StandardCharsets.UTF_8));
          if (!Objects.equals(got, v.get("canonical").asText())) {
            System.out.println(v.get("name").asText());
          }
        }
        break;
      case "keys":
        for (JsonNode v : JSON.readTree(Files.readString(Path.of(args[1])))) {
          List<String> fields = new ArrayList<>();
          v.get("fields").forEach(f -> fields.add(f.asText()));
          String key = null;
          String error = null;
          try {
            key = IdempotencyKey.parse(fields);
          } catch (IdempotencyKey.MalformedKeyException e) {
            error = e.getMessage();
          }
          if (!Objects.equals(key, v.path("key").textValue()) || !Objects.equals(error, v.path("error").textValue())) {
            System.out.println(v.get("name").asText() + ": got " + key + ", " + error);
          }
        }
        break;
      default:
        throw new IllegalArgumentException(args[0]);
    }
  }
}
