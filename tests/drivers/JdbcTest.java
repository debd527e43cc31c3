// pgJDBC against a running Weir server: types, batches and metadata (typesAndMetadata);
// then, with autocommit off (pgJDBC then opens a transaction
// block before the first statement, as every JDBC application and pool with autocommit off
// does): a block's writes are its own until commit, rollback undoes them, an error fails the
// block (25P02) until rollback, a committed write is read at once on another connection, and
// the second of two conflicting blocks gets 40001 at commit; bulk loading with CopyManager.
//
// Usage: java -cp postgresql.jar:. JdbcTest jdbc:postgresql://127.0.0.1:4466/weir?user=weir
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.PreparedStatement;
import java.sql.Types;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

public class JdbcTest {
    static long one(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
            check(r.next(), "no row for " + sql);
            return r.getLong(1);
        }
    }

    static void run(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    interface Sql {
        void run() throws SQLException;
    }

    static String stateOf(Sql sql) {
        try {
            sql.run();
            return "none";
        } catch (SQLException e) {
            return e.getSQLState();
        }
    }

    // Types, batches and metadata with autocommit on: setDate (sent untyped, as
    // '2024-03-01 +00'), executeBatch's update counts (a prepared INSERT is described with
    // NoData), a server-prepared SELECT run many times, and DatabaseMetaData's tables and
    // columns, read from pg_catalog.
    static int typesAndMetadata(Connection c) throws SQLException {
        int checks = 0;
        run(c, "CREATE TABLE jtypes (id int PRIMARY KEY, day date, at timestamp, name varchar(20),"
            + " amount numeric(10,2), big bigint, ok boolean, score double precision)");
        run(c, "CREATE MATERIALIZED VIEW jtypes_total AS SELECT count(*) AS n, sum(amount) AS total"
            + " FROM jtypes");
        try (PreparedStatement p = c.prepareStatement(
                "INSERT INTO jtypes VALUES (?, ?, ?, ?, ?, ?, ?, ?)")) {
            for (int i = 1; i <= 10; i++) {
                p.setInt(1, i);
                p.setDate(2, java.sql.Date.valueOf("2024-03-0" + (i % 9 + 1)));
                p.setTimestamp(3, java.sql.Timestamp.valueOf("2024-03-01 12:00:0" + (i % 10)));
                p.setString(4, "n" + i);
                p.setBigDecimal(5, new java.math.BigDecimal(i + ".25"));
                p.setLong(6, 10_000_000_000L + i);
                p.setBoolean(7, i % 2 == 0);
                p.setDouble(8, i / 4.0);
                p.addBatch();
            }
            int[] counts = p.executeBatch();
            check(counts.length == 10, "executeBatch gave " + counts.length + " counts");
            for (int n : counts) {
                check(n == 1, "executeBatch counted " + java.util.Arrays.toString(counts));
            }
            p.setInt(1, 11);
            p.setDate(2, java.sql.Date.valueOf("2024-04-01"));
            p.setNull(3, Types.TIMESTAMP);
            p.setString(4, "eleven");
            p.setNull(5, Types.NUMERIC);
            p.setNull(6, Types.BIGINT);
            p.setNull(7, Types.BOOLEAN);
            p.setNull(8, Types.DOUBLE);
            check(p.executeUpdate() == 1, "executeUpdate after a batch");
        }
        checks++;

        try (PreparedStatement q = c.prepareStatement("SELECT day, name FROM jtypes WHERE id = ?")) {
            for (int i = 1; i <= 100; i++) {
                q.setInt(1, i % 10 + 1);
                try (ResultSet r = q.executeQuery()) {
                    check(r.next(), "no row for id " + (i % 10 + 1));
                    check(r.getString(2).equals("n" + (i % 10 + 1)), "a wrong name");
                }
            }
            q.setInt(1, 11);
            try (ResultSet r = q.executeQuery()) {
                check(r.next() && r.getDate(1).toString().equals("2024-04-01"), "setDate's day");
                check(r.getMetaData().getColumnTypeName(2).equals("varchar"),
                    "varchar described as " + r.getMetaData().getColumnTypeName(2));
            }
        }
        run(c, "FLUSH");
        check(one(c, "SELECT n FROM jtypes_total") == 11, "the view's count");
        checks++;

        DatabaseMetaData meta = c.getMetaData();
        java.util.Set<String> tables = new java.util.TreeSet<>();
        try (ResultSet r = meta.getTables(null, "public", "jtypes%",
                new String[] {"TABLE", "MATERIALIZED VIEW"})) {
            while (r.next()) {
                tables.add(r.getString("TABLE_NAME") + ":" + r.getString("TABLE_TYPE"));
            }
        }
        check(tables.toString().equals("[jtypes:TABLE, jtypes_total:MATERIALIZED VIEW]"),
            "getTables gave " + tables);
        java.util.List<String> columns = new java.util.ArrayList<>();
        try (ResultSet r = meta.getColumns(null, "public", "jtypes", null)) {
            while (r.next()) {
                columns.add(r.getString("COLUMN_NAME") + " " + r.getString("TYPE_NAME")
                    + "(" + r.getInt("COLUMN_SIZE") + ")");
            }
        }
        check(columns.get(3).equals("name varchar(20)"), "getColumns gave " + columns);
        check(columns.size() == 8, "getColumns gave " + columns);
        // The primary key and its index, through information_schema._pg_expandarray.
        java.util.List<String> keys = new java.util.ArrayList<>();
        try (ResultSet r = meta.getPrimaryKeys(null, "public", "jtypes")) {
            while (r.next()) {
                keys.add(r.getString("COLUMN_NAME") + ":" + r.getInt("KEY_SEQ") + ":"
                    + r.getString("PK_NAME"));
            }
        }
        check(keys.toString().equals("[id:1:jtypes_pkey]"), "getPrimaryKeys gave " + keys);
        java.util.List<String> index = new java.util.ArrayList<>();
        try (ResultSet r = meta.getIndexInfo(null, "public", "jtypes", true, true)) {
            while (r.next()) {
                index.add(r.getString("INDEX_NAME") + ":" + r.getString("COLUMN_NAME") + ":"
                    + r.getInt("ORDINAL_POSITION") + ":" + r.getBoolean("NON_UNIQUE"));
            }
        }
        check(index.toString().equals("[jtypes_pkey:id:1:false]"), "getIndexInfo gave " + index);
        checks++;
        return checks;
    }

    public static void main(String[] args) throws Exception {
        int checks = 0;
        try (Connection c = DriverManager.getConnection(args[0])) {
            checks += typesAndMetadata(c);
        }
        try (Connection a = DriverManager.getConnection(args[0]);
             Connection b = DriverManager.getConnection(args[0])) {
            run(a, "CREATE TABLE jdbc (id int PRIMARY KEY, v int)");
            a.setAutoCommit(false);
            b.setAutoCommit(false);

            run(a, "INSERT INTO jdbc VALUES (1, 10)");
            check(one(a, "SELECT count(*) FROM jdbc") == 1, "a block does not see its own write");
            check(one(b, "SELECT count(*) FROM jdbc") == 0, "an uncommitted write is visible");
            b.commit();
            a.rollback();
            check(one(b, "SELECT count(*) FROM jdbc") == 0, "a rolled-back write stayed");
            b.commit();
            checks++;

            run(a, "INSERT INTO jdbc VALUES (2, 20)");
            run(a, "UPDATE jdbc SET v = v + 1 WHERE id = 2");
            a.commit();
            check(one(b, "SELECT v FROM jdbc WHERE id = 2") == 21, "a committed write is not read");
            b.commit();
            checks++;

            run(a, "INSERT INTO jdbc VALUES (3, 30)");
            String dup = stateOf(() -> run(a, "INSERT INTO jdbc VALUES (2, 0)"));
            check(dup.equals("23505"), "a duplicate key gave " + dup);
            String failed = stateOf(() -> one(a, "SELECT 1"));
            check(failed.equals("25P02"), "a statement in a failed block gave " + failed);
            a.rollback();
            check(one(a, "SELECT count(*) FROM jdbc") == 1, "a failed block left rows");
            a.commit();
            checks++;

            run(a, "UPDATE jdbc SET v = 100 WHERE id = 2");
            run(b, "UPDATE jdbc SET v = 200 WHERE id = 2");
            b.commit();
            String lost = stateOf(a::commit);
            check(lost.equals("40001"), "the second committer gave " + lost);
            check(one(a, "SELECT v FROM jdbc WHERE id = 2") == 200, "the first commit was lost");
            a.commit();
            checks++;

            // A read-only connection's blocks (BEGIN READ ONLY) read and refuse writes.
            a.setReadOnly(true);
            check(one(a, "SELECT count(*) FROM jdbc") == 1, "a read-only block cannot read");
            String readOnly = stateOf(() -> run(a, "INSERT INTO jdbc VALUES (9, 9)"));
            check(readOnly.equals("25006"), "a write in a read-only block gave " + readOnly);
            a.rollback();
            a.setReadOnly(false);
            checks++;
        }
        // Bulk loading with pgJDBC's CopyManager, and a malformed line that fails it whole.
        try (Connection c = DriverManager.getConnection(args[0])) {
            run(c, "CREATE TABLE jdbc_copy (id bigint NOT NULL, name text)");
            org.postgresql.copy.CopyManager copy =
                c.unwrap(org.postgresql.PGConnection.class).getCopyAPI();
            StringBuilder csv = new StringBuilder("id,name\n");
            for (int i = 0; i < 2000; i++) {
                csv.append(i).append(",\"name, ").append(i).append("\"\n");
            }
            long copied = copy.copyIn("COPY jdbc_copy FROM STDIN WITH (FORMAT csv, HEADER)",
                new java.io.StringReader(csv.toString()));
            check(copied == 2000, "CopyManager copied " + copied);
            String bad = stateOf(() -> {
                try {
                    copy.copyIn("COPY jdbc_copy FROM STDIN", new java.io.StringReader("1\tx\ny\tz\n"));
                } catch (java.io.IOException e) {
                    throw new SQLException(e);
                }
            });
            check(bad.equals("22P02"), "a malformed COPY gave " + bad);
            check(one(c, "SELECT count(*) FROM jdbc_copy") == 2000, "a failed COPY applied rows");
            checks++;
        }
        System.out.println("pgjdbc: " + checks + " passed, 0 failed");
    }
}
