// pgJDBC against a running Weir server, with autocommit off (pgJDBC then opens a transaction
// block before the first statement, as every JDBC application and pool with autocommit off
// does): a block's writes are its own until commit, rollback undoes them, an error fails the
// block (25P02) until rollback, a committed write is read at once on another connection, and
// the second of two conflicting blocks gets 40001 at commit.
//
// Usage: java -cp postgresql.jar:. JdbcTest jdbc:postgresql://127.0.0.1:4466/weir?user=weir
import java.sql.Connection;
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

    public static void main(String[] args) throws Exception {
        int checks = 0;
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
        System.out.println("pgjdbc: " + checks + " passed, 0 failed");
    }
}
