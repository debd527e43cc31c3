"""psycopg2 against a running Weir server, through a connection pool: psycopg2 opens a
transaction block before the first statement of each (autocommit off, its default), so this
is what every psycopg2 and SQLAlchemy application sends. A block's writes are its own until
commit; rollback undoes them; an error fails the block until rollback; a write committed on
one pooled connection is read at once on another; the second of two conflicting blocks gets
40001. DDL is part of the block: a migration (a table, its rows and a view, as Alembic runs
each one in a block) commits whole, and a failing one rolls back leaving nothing.

Usage: python3 tests/drivers/psycopg2_test.py "host=127.0.0.1 port=4466 dbname=weir user=weir"
"""
import sys

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.pool


def main(dsn):
    checks = 0
    pool = psycopg2.pool.ThreadedConnectionPool(2, 2, dsn)
    a, b = pool.getconn(), pool.getconn()
    status = psycopg2.extensions
    with a.cursor() as cur:
        cur.execute("CREATE TABLE pg2 (id int PRIMARY KEY, v int)")
    a.commit()

    with a.cursor() as cur:
        cur.execute("INSERT INTO pg2 VALUES (%s, %s)", (1, 10))
        assert a.get_transaction_status() == status.TRANSACTION_STATUS_INTRANS
        cur.execute("SELECT count(*) FROM pg2")
        assert cur.fetchone() == (1,)
    with b.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg2")
        assert cur.fetchone() == (0,), "another connection saw an uncommitted write"
    b.commit()
    a.rollback()
    with b.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg2")
        assert cur.fetchone() == (0,), "a rolled-back write stayed"
    b.commit()
    checks += 1

    # Committed on one pooled connection, read on another at once.
    with a.cursor() as cur:
        cur.execute("INSERT INTO pg2 VALUES (%s, %s)", (2, 20))
        cur.execute("UPDATE pg2 SET v = v + 1 WHERE id = %s", (2,))
    a.commit()
    pool.putconn(a)
    pool.putconn(b)
    c = pool.getconn()
    with c.cursor() as cur:
        cur.execute("SELECT v FROM pg2 WHERE id = %s", (2,))
        assert cur.fetchone() == (21,)
    c.commit()
    pool.putconn(c)
    checks += 1

    a, b = pool.getconn(), pool.getconn()
    # An error fails the block until rollback, which leaves nothing of it.
    with a.cursor() as cur:
        cur.execute("INSERT INTO pg2 VALUES (3, 30)")
        try:
            cur.execute("INSERT INTO pg2 VALUES (2, 0)")
            raise AssertionError("duplicate key accepted")
        except psycopg2.errors.UniqueViolation:
            pass
        assert a.get_transaction_status() == status.TRANSACTION_STATUS_INERROR
        try:
            cur.execute("SELECT 1")
            raise AssertionError("a statement ran in a failed block")
        except psycopg2.errors.InFailedSqlTransaction:
            pass
    a.rollback()
    with a.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg2")
        assert cur.fetchone() == (1,)
    a.commit()
    checks += 1

    # First committer wins.
    with a.cursor() as cur:
        cur.execute("UPDATE pg2 SET v = 100 WHERE id = 2")
    with b.cursor() as cur:
        cur.execute("UPDATE pg2 SET v = 200 WHERE id = 2")
    b.commit()
    try:
        a.commit()
        raise AssertionError("a lost update was committed")
    except psycopg2.errors.SerializationFailure:
        pass
    with a.cursor() as cur:
        cur.execute("SELECT v FROM pg2 WHERE id = 2")
        assert cur.fetchone() == (200,)
    a.commit()
    checks += 1

    # A migration in one block: nobody sees its table before commit, everyone after.
    with a.cursor() as cur:
        cur.execute("CREATE TABLE pg2_plans (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO pg2_plans VALUES (1, 'free'), (2, 'pro')")
        cur.execute(
            "CREATE MATERIALIZED VIEW pg2_plan_count AS SELECT count(*) AS n FROM pg2_plans"
        )
    with b.cursor() as cur:
        try:
            cur.execute("SELECT * FROM pg2_plans")
            raise AssertionError("another connection saw an uncommitted table")
        except psycopg2.errors.UndefinedTable:
            pass
    b.rollback()
    a.commit()
    with b.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg2_plans")
        assert cur.fetchone() == (2,)
        cur.execute("FLUSH")
        cur.execute("SELECT n FROM pg2_plan_count")
        assert cur.fetchone() == (2,)
    b.commit()
    # A migration that fails half-way rolls back whole: its table, rows and drop.
    with a.cursor() as cur:
        cur.execute("CREATE TABLE pg2_half (id int PRIMARY KEY)")
        cur.execute("INSERT INTO pg2_half VALUES (1)")
        cur.execute("DROP MATERIALIZED VIEW pg2_plan_count")
        try:
            cur.execute("INSERT INTO pg2_half VALUES (1)")
            raise AssertionError("duplicate key accepted")
        except psycopg2.errors.UniqueViolation:
            pass
    a.rollback()
    with a.cursor() as cur:
        try:
            cur.execute("SELECT * FROM pg2_half")
            raise AssertionError("a rolled-back CREATE TABLE stayed")
        except psycopg2.errors.UndefinedTable:
            pass
    a.rollback()
    with a.cursor() as cur:
        cur.execute("SELECT n FROM pg2_plan_count")
        assert cur.fetchone() == (2,), "a rolled-back DROP took effect"
    a.commit()
    checks += 1
    pool.closeall()
    print(f"psycopg2: {checks} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1])
