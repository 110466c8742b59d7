package idempotency.servlet;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import javax.sql.DataSource;

/**
 * What the handler gets, as the request attribute {@link IdempotencyFilter#ATTRIBUTE}:
 * the claim's connection, inside the claim's transaction (its writes commit with the
 * stored response: the handler must not commit, roll back or close it), and the key.
 */
public final class Claim {
  private final Connection connection;
  private final DataSource dataSource;
  private final String scope;
  private final String key;
  private final boolean lease;
  int attempt;
  String checkpoint;
  String checkpointData;
  boolean checkpointed;

  Claim(Connection connection, DataSource dataSource, String scope, String key, boolean lease) {
    this.connection = connection;
    this.dataSource = dataSource;
    this.scope = scope;
    this.key = key;
    this.lease = lease;
  }

  /** The claim's connection, in its transaction. */
  public Connection getConnection() {
    return connection;
  }

  public String getScope() {
    return scope;
  }

  /** The key; null on an optional route called without one. */
  public String getKey() {
    return key;
  }

  /** The claim's attempt (lease mode: 1, then one more on each takeover). */
  public int getAttempt() {
    return attempt;
  }

  /** On a takeover in lease mode: the last recovery point, else null. */
  public String getCheckpoint() {
    return checkpoint;
  }

  /** The last recovery point's data as JSON text, or null. */
  public String getCheckpointData() {
    return checkpointData;
  }

  /**
   * Records a recovery point (idem_checkpoint) a takeover sees; dataJson is JSON text or
   * null. In lease mode it commits at once, on another connection of the DataSource, and
   * renews the lease (the handler's own transaction commits only at the end).
   */
  public void saveCheckpoint(String point, String dataJson) throws SQLException {
    String sql = "SELECT idem_checkpoint(?, ?::idem_key, ?, ?::jsonb, ?)";
    if (!lease) {
      checkpoint(connection, sql, point, dataJson, null);
      return;
    }
    try (Connection other = dataSource.getConnection()) {
      other.setAutoCommit(true);
      checkpoint(other, sql, point, dataJson, attempt);
    }
    checkpointed = true;
  }

  private void checkpoint(Connection c, String sql, String point, String data, Integer attempt)
      throws SQLException {
    try (PreparedStatement s = c.prepareStatement(sql)) {
      s.setString(1, scope);
      s.setString(2, key);
      s.setString(3, point);
      s.setString(4, data);
      s.setObject(5, attempt, java.sql.Types.INTEGER);
      s.execute();
    }
  }
}
