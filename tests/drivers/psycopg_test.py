"""psycopg 3 against a running Weir server: connection, implicit transactions, server-side
parameters (with types), text and binary results, prepared statements.

Usage: python3 tests/drivers/psycopg_test.py "host=127.0.0.1 port=4466 dbname=weir user=weir"
"""
import datetime
import decimal
import sys

import psycopg


def main(dsn):
    checks = 0
    with psycopg.connect(dsn) as conn:
        assert conn.info.server_version == 150018, conn.info.server_version
        # psycopg opens a transaction implicitly (BEGIN) and commits on leaving the block.
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE py (id int PRIMARY KEY, name text, amount numeric(10,2),"
                " day date, at timestamp, ok boolean, score double precision)")
            cur.execute(
                "INSERT INTO py VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (1, "one", decimal.Decimal("12.34"), datetime.date(2024, 1, 2),
                 datetime.datetime(2024, 1, 2, 3, 4, 5, 250000), True, 1.5))
            cur.executemany(
                "INSERT INTO py (id, name) VALUES (%s, %s)",
                [(i, f"n{i}") for i in range(2, 8)])
            cur.execute("CREATE MATERIALIZED VIEW py_count AS SELECT count(*) AS n FROM py")
            cur.execute("FLUSH")
        conn.commit()
        checks += 1

        with conn.cursor() as cur:
            cur.execute("SELECT id, name, amount, day, at, ok, score FROM py WHERE id = %s", (1,))
            row = cur.fetchone()
            assert row == (1, "one", decimal.Decimal("12.34"), datetime.date(2024, 1, 2),
                           datetime.datetime(2024, 1, 2, 3, 4, 5, 250000), True, 1.5), row
            checks += 1

        # Binary results.
        with conn.cursor(binary=True) as cur:
            cur.execute("SELECT id, amount, day, at, ok FROM py WHERE id = %s", (1,))
            row = cur.fetchone()
            assert row == (1, decimal.Decimal("12.34"), datetime.date(2024, 1, 2),
                           datetime.datetime(2024, 1, 2, 3, 4, 5, 250000), True), row
            checks += 1

        # The same statement run often enough is prepared server-side (a named statement).
        with conn.cursor() as cur:
            for i in range(2, 8):
                cur.execute("SELECT name FROM py WHERE id = %s", (i,), prepare=True)
                assert cur.fetchone() == (f"n{i}",)
            checks += 1

        with conn.cursor() as cur:
            cur.execute("SELECT n FROM py_count")
            assert cur.fetchone() == (7,)
            checks += 1

        # Errors carry their SQLSTATE, and the connection recovers after a rollback.
        with conn.cursor() as cur:
            try:
                cur.execute("INSERT INTO py (id, name) VALUES (%s, %s)", (1, "dup"))
                raise AssertionError("duplicate key accepted")
            except psycopg.errors.UniqueViolation:
                conn.rollback()
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
            checks += 1

        with conn.cursor() as cur:
            cur.execute("SHOW transaction isolation level")
            assert cur.fetchone() == ("read committed",)
            cur.execute("SELECT version()")
            assert cur.fetchone()[0].startswith("PostgreSQL 15.18 (Weir ")
            checks += 1

    checks += transactions(dsn)
    checks += subscriptions(dsn)
    checks += copy_from(dsn)
    print(f"psycopg: {checks} passed, 0 failed")


def transactions(dsn):
    """Transaction blocks as psycopg opens them (implicitly, before the first statement), on
    two connections as a pool hands them out: a block's writes are its own until commit,
    rollback undoes them, an error fails the block until rollback, and a committed write is
    read at once on the other connection."""
    checks = 0
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        a.execute("CREATE TABLE py_tx (id int PRIMARY KEY, v int)")
        a.commit()
        a.execute("INSERT INTO py_tx VALUES (1, 1)")
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert a.execute("SELECT count(*) FROM py_tx").fetchone() == (1,)
        assert b.execute("SELECT count(*) FROM py_tx").fetchone() == (0,)
        b.commit()
        a.rollback()
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert b.execute("SELECT count(*) FROM py_tx").fetchone() == (0,)
        b.commit()
        checks += 1

        # Committed on one connection, read on the other at once (no FLUSH).
        a.execute("INSERT INTO py_tx VALUES (2, 20)")
        a.execute("UPDATE py_tx SET v = v + 1 WHERE id = 2")
        a.commit()
        assert b.execute("SELECT v FROM py_tx WHERE id = 2").fetchone() == (21,)
        b.commit()
        checks += 1

        # An error fails the block: every statement is refused until rollback, which
        # leaves nothing of it.
        a.execute("INSERT INTO py_tx VALUES (3, 30)")
        try:
            a.execute("INSERT INTO py_tx VALUES (2, 0)")
            raise AssertionError("duplicate key accepted")
        except psycopg.errors.UniqueViolation:
            pass
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        try:
            a.execute("SELECT 1")
            raise AssertionError("a statement ran in a failed block")
        except psycopg.errors.InFailedSqlTransaction:
            pass
        a.rollback()
        assert a.execute("SELECT count(*) FROM py_tx").fetchone() == (1,)
        a.commit()
        checks += 1

        # First committer wins: the second block to change a row cannot commit.
        a.execute("UPDATE py_tx SET v = 100 WHERE id = 2")
        b.execute("UPDATE py_tx SET v = 200 WHERE id = 2")
        b.commit()
        try:
            a.commit()
            raise AssertionError("a lost update was committed")
        except psycopg.errors.SerializationFailure:
            pass
        assert a.execute("SELECT v FROM py_tx WHERE id = 2").fetchone() == (200,)
        a.commit()
        checks += 1

        # A read-only connection's blocks (BEGIN READ ONLY) read and refuse writes.
        a.read_only = True
        assert a.execute("SELECT count(*) FROM py_tx").fetchone() == (1,)
        try:
            a.execute("INSERT INTO py_tx VALUES (9, 9)")
            raise AssertionError("a read-only block wrote")
        except psycopg.errors.ReadOnlySqlTransaction:
            pass
        a.rollback()
        a.read_only = False
        checks += 1
    return checks


def subscriptions(dsn):
    """A view's changes followed with COPY (SUBSCRIBE ...) TO STDOUT, row by row as they come,
    and read through psycopg's server-side cursors (DECLARE, FETCH FORWARD, CLOSE), over a
    query with a parameter and over a subscription."""
    checks = 0
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn) as b:
        a.execute("CREATE TABLE py_sub (id int PRIMARY KEY, g text, v int)")
        a.execute("INSERT INTO py_sub VALUES (1, 'x', 10)")
        a.execute("CREATE MATERIALIZED VIEW py_sub_g AS"
                  " SELECT g, sum(v) AS total FROM py_sub GROUP BY g")
        with b.cursor() as cur:
            try:
                with cur.copy("COPY (SUBSCRIBE TO py_sub_g) TO STDOUT") as copy:
                    rows = copy.rows()
                    g, total, op, epoch = next(rows)
                    assert (g, total, op) == ("x", "10", "insert"), (g, total, op)
                    a.execute("UPDATE py_sub SET v = 15 WHERE id = 1")
                    assert next(rows)[:3] == ("x", "10", "update_delete")
                    assert next(rows)[:3] == ("x", "15", "update_insert")
                    # A subscription ends when it is cancelled (57014).
                    b.cancel_safe()
                    for _ in rows:
                        pass
                raise AssertionError("a cancelled subscription went on")
            except psycopg.errors.QueryCanceled:
                pass
        b.rollback()
        checks += 1

        with b.cursor(name="q") as cur:
            cur.execute("SELECT id FROM py_sub WHERE id >= %s ORDER BY id", (1,))
            assert cur.fetchmany(5) == [(1,)]
            assert cur.fetchall() == []
        with b.cursor(name="live") as cur:
            cur.execute("SUBSCRIBE TO py_sub")
            first = cur.fetchmany(10)
            assert [r[:3] for r in first] == [(1, "x", 15)], first
            a.execute("INSERT INTO py_sub VALUES (2, 'y', 1)")
            change = cur.fetchmany(10)
            assert [r[:4] for r in change] == [(2, "y", 1, "insert")], change
        b.rollback()
        checks += 1
    return checks



def copy_from(dsn):
    """Bulk loading with cursor.copy(): rows psycopg writes (text format), CSV written as is,
    and a malformed line that fails the COPY whole."""
    checks = 0
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE py_copy (id int NOT NULL, name text, amount numeric(10,2),"
                    " day date)")
        with cur.copy("COPY py_copy (id, name, amount, day) FROM STDIN") as copy:
            for i in range(3000):
                copy.write_row((i, f"tab\there {i}" if i % 2 else None,
                                decimal.Decimal(i) / 100, datetime.date(2024, 1, 1 + i % 28)))
        with cur.copy("COPY py_copy (id, name) FROM STDIN WITH (FORMAT csv, HEADER)") as copy:
            copy.write('id,name\n3000,"a, b"\n3001,"two\nlines"\n')
        cur.execute("SELECT count(*), sum(amount), count(name) FROM py_copy")
        assert cur.fetchone() == (3002, sum(decimal.Decimal(i) / 100 for i in range(3000)), 1502)
        cur.execute("SELECT name FROM py_copy WHERE id IN (1, 3001) ORDER BY id")
        assert cur.fetchall() == [("tab\there 1",), ("two\nlines",)]
        checks += 1
        try:
            with cur.copy("COPY py_copy (id) FROM STDIN") as copy:
                copy.write("5000\n5001\nnot a number\n")
            raise AssertionError("a malformed COPY was accepted")
        except psycopg.errors.InvalidTextRepresentation as e:
            assert "line 3" in str(e.diag.context), e.diag.context
        cur.execute("SELECT count(*) FROM py_copy")
        assert cur.fetchone() == (3002,)
        checks += 1
    return checks


if __name__ == "__main__":
    main(sys.argv[1])
