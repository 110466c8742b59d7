// A payment made once, from Java with JDBC (Debian: apt-get install default-jdk-headless
// libpostgresql-jdbc-java; javac -cp /usr/share/java/postgresql.jar Payments.java).
//
// pay(connection, key, account, amount) claims the key, inserts the payment and completes
// the key in one transaction, and answers as an HTTP service would (docs/clients.md): 201
// (a retry gets the same body with Idempotent-Replayed: true), 409 with Retry-After
// (in_progress), 422 (IK001), 400 (22P02), 503 (40001/40P01 still there after the
// retries, other transient errors), the rest as docs/reference.md's error table says,
// 500 for anything else (IK002 included).
//
// It needs the table and scope of examples/create_payment.sql. Connection settings come
// from the PG* environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER).
//   java -cp .:/usr/share/java/postgresql.jar Payments pay KEY ACCOUNT AMOUNT
//   java -cp .:/usr/share/java/postgresql.jar Payments race PREFIX WORKERS KEYS ACCOUNT_BASE
import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;

public final class Payments {
  // The key is bound as text and cast to idem_key; the fingerprint covers the request.
  static final String CLAIM =
      "SELECT outcome, response, ceil(extract(epoch FROM retry_after))::int AS retry_after"
          + " FROM idem_claim('payments', ?::idem_key, idem_fingerprint(jsonb_build_object("
          + "'account', ?::bigint, 'amount', ?::numeric)))";
  static final String INSERT =
      "INSERT INTO payments(account, amount) VALUES (?, ?)"
          + " RETURNING jsonb_build_object('payment_id', id, 'amount', amount)";
  static final String COMPLETE = "SELECT idem_complete('payments', ?::idem_key, ?::jsonb)";

  static final Set<String> RETRIED = Set.of("IK005", "40001", "40P01"); // after a backoff
  static final int ATTEMPTS = 5;
  // The HTTP column of docs/reference.md's error table; anything else is 500.
  static final Map<String, Integer> STATUS = Map.ofEntries(Map.entry("IK001", 422),
      Map.entry("IK003", 409), Map.entry("IK005", 409), Map.entry("22P02", 400),
      Map.entry("22004", 400), Map.entry("22023", 400), Map.entry("54000", 413),
      Map.entry("40001", 503), Map.entry("40P01", 503), Map.entry("55P03", 503),
      Map.entry("57014", 503), Map.entry("IK006", 503), Map.entry("25006", 503));

  record Response(int status, Map<String, String> headers, String body) {}

  static Response payOnce(Connection c, String key, long account, BigDecimal amount)
      throws SQLException {
    c.setAutoCommit(false);
    try {
      try (PreparedStatement claim = c.prepareStatement(CLAIM)) {
        claim.setString(1, key);
        claim.setLong(2, account);
        claim.setBigDecimal(3, amount);
        try (ResultSet r = claim.executeQuery()) {
          r.next();
          switch (r.getString("outcome")) {
            case "replay":
              c.commit();
              return new Response(201, Map.of("Idempotent-Replayed", "true"), r.getString("response"));
            case "in_progress":
              c.rollback();
              return new Response(409,
                  Map.of("Retry-After", String.valueOf(Math.max(1, r.getInt("retry_after")))),
                  "{\"title\": \"in progress\"}");
            default: // claimed ("duplicate" only comes to a transaction that claimed it already)
          }
        }
      }
      String payment;
      try (PreparedStatement insert = c.prepareStatement(INSERT)) {
        insert.setLong(1, account);
        insert.setBigDecimal(2, amount);
        try (ResultSet r = insert.executeQuery()) {
          r.next();
          payment = r.getString(1);
        }
      }
      try (PreparedStatement complete = c.prepareStatement(COMPLETE)) {
        complete.setString(1, key);
        complete.setString(2, payment);
        complete.executeQuery().close();
      }
      c.commit(); // IK002 would come from here
      return new Response(201, Map.of(), payment);
    } catch (SQLException e) {
      c.rollback();
      throw e;
    }
  }

  static Response pay(Connection c, String key, long account, BigDecimal amount)
      throws InterruptedException {
    for (int attempt = 1; ; attempt++) {
      try {
        return payOnce(c, key, account, amount);
      } catch (SQLException e) {
        String state = String.valueOf(e.getSQLState());
        if (RETRIED.contains(state) && attempt < ATTEMPTS) {
          System.err.printf("%s: retrying after %s (attempt %d)%n", key, state, attempt);
          Thread.sleep((long) (50 * (1 << attempt) * ThreadLocalRandom.current().nextDouble(0.5, 1.5)));
          continue;
        }
        int status = STATUS.getOrDefault(state, 500);
        return new Response(status,
            status == 409 || status == 503 ? Map.of("Retry-After", "1") : Map.of(),
            "{\"sqlstate\": " + jsonString(state) + ", \"title\": "
                + jsonString(message(e)) + "}");
      }
    }
  }

  // The server's message (without JDBC's "ERROR: " and its detail lines), else the driver's.
  static String message(SQLException e) {
    if (e instanceof org.postgresql.util.PSQLException p && p.getServerErrorMessage() != null) {
      return p.getServerErrorMessage().getMessage();
    }
    return String.valueOf(e.getMessage()).lines().findFirst().orElse("");
  }

  // A JSON string: the message may hold quotes, backslashes and control characters.
  static String jsonString(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char ch : s.toCharArray()) {
      if (ch == '"' || ch == '\\') out.append('\\').append(ch);
      else if (ch < 0x20) out.append(String.format("\\u%04x", (int) ch));
      else out.append(ch);
    }
    return out.append('"').toString();
  }

  static Connection connect() throws SQLException {
    String url = "jdbc:postgresql://" + System.getenv().getOrDefault("PGHOST", "localhost") + ":" + System.getenv().getOrDefault("PGPORT", "5432")
        + "/" + System.getenv().getOrDefault("PGDATABASE", "postgres");
    return DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"));
  }

  static synchronized void report(String key, Response r) {
    System.out.println(key + " " + r.status() + " "
        + (r.headers().containsKey("Idempotent-Replayed") ? "replayed" : "new") + " "
        + r.headers().getOrDefault("Retry-After", "-") + " " + r.body());
  }

  public static void main(String[] args) throws Exception {
    if (args[0].equals("pay")) {
      try (Connection c = connect()) {
        report(args[1], pay(c, args[1], Long.parseLong(args[2]), new BigDecimal(args[3])));
      }
    } else if (args[0].equals("race")) {
      String prefix = args[1];
      int workers = Integer.parseInt(args[2]), keys = Integer.parseInt(args[3]);
      long base = Long.parseLong(args[4]);
      List<Thread> threads = new ArrayList<>();
      for (int w = 0; w < workers; w++) {
        Thread thread = new Thread(() -> {
          try (Connection c = connect()) {
            for (int i = 1; i <= keys; i++) {
              String key = prefix + "-" + i;
              Response r;
              while ((r = pay(c, key, base + i, new BigDecimal(i + ".5"))).status() == 409) {
                // as an HTTP client would
                Thread.sleep(1000L * Integer.parseInt(r.headers().get("Retry-After")));
              }
              report(key, r);
            }
          } catch (SQLException | InterruptedException e) {
            throw new RuntimeException(e);
          }
        });
        thread.start();
        threads.add(thread);
      }
      for (Thread thread : threads) thread.join();
    }
  }
}
