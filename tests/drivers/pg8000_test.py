"""pg8000 (pure Python, text format, its own protocol code) against a running Weir server:
a table of every supported type and a view over it, inserts with named parameters of every
type, the view read back, a prepared statement run many times, and an error the connection
goes on after.

Usage: python3 tests/drivers/pg8000_test.py 127.0.0.1 4466
"""
import datetime
import decimal
import sys

import pg8000.native


def main(host, port):
    checks = 0
    conn = pg8000.native.Connection("weir", host=host, port=int(port), database="weir")
    conn.run(
        "CREATE TABLE p8 (id int PRIMARY KEY, small smallint, big bigint, flag boolean,"
        " r real, d double precision, amount numeric(12,3), name text, code varchar(8),"
        " day date, at timestamp, atz timestamptz, span interval)")
    conn.run(
        "CREATE MATERIALIZED VIEW p8_by_flag AS"
        " SELECT flag, count(*) AS n, sum(amount) AS total FROM p8 GROUP BY flag")
    row = (1, 7, 9_000_000_000, True, 0.5, 1.25, decimal.Decimal("12.345"), "ünï", "abc",
           datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4, 5, 250000),
           datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
           datetime.timedelta(days=1, seconds=5))
    names = ["id", "small", "big", "flag", "r", "d", "amount", "name", "code", "day", "at",
             "atz", "span"]
    conn.run(
        "INSERT INTO p8 VALUES (" + ", ".join(":" + n for n in names) + ")",
        **dict(zip(names, row)))
    got = conn.run("SELECT " + ", ".join(names) + " FROM p8 WHERE id = :id", id=1)
    assert tuple(got[0]) == row, got
    checks += 1

    # A prepared statement, run many times.
    insert = conn.prepare("INSERT INTO p8 (id, flag, amount) VALUES (:id, :flag, :amount)")
    for i in range(2, 102):
        insert.run(id=i, flag=i % 2 == 0, amount=decimal.Decimal(i) / 10)
    insert.close()
    conn.run("FLUSH")
    got = conn.run("SELECT flag, n, total FROM p8_by_flag ORDER BY flag")
    # ids 2..101: 50 even (flag true) and 50 odd; id 1 is true too.
    evens = sum(decimal.Decimal(i) / 10 for i in range(2, 102, 2)) + decimal.Decimal("12.345")
    odds = sum(decimal.Decimal(i) / 10 for i in range(3, 102, 2))
    assert [tuple(r) for r in got] == [(False, 50, odds), (True, 51, evens)], got
    checks += 1

    # An error, and the connection goes on.
    try:
        conn.run("INSERT INTO p8 (id) VALUES (1)")
        raise AssertionError("a duplicate key was accepted")
    except pg8000.native.DatabaseError as e:
        assert e.args[0]["C"] == "23505", e.args
    assert conn.run("SELECT count(*) FROM p8") == [[101]]
    checks += 1
    conn.close()
    print(f"pg8000: {checks} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
