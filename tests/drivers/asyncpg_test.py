"""asyncpg against a running Weir server: parameters of every type (asyncpg encodes each in
binary by the type the server describes, so `$1::int`, `CAST($1 AS bigint)` and `LIMIT $1`
must be described as PostgreSQL does), a view read back in binary, a prepared statement run
many times; and, through its connection pool, transactions as
asyncpg runs them (`async with conn.transaction()`, rolled back when the block raises), an
error failing the block until rollback, a write committed on one pooled connection read at
once on another, and 40001 for the second of two conflicting blocks; bulk loading with
`copy_records_to_table` (binary COPY), all of it or none.

Usage: python3 tests/drivers/asyncpg_test.py "postgresql://weir@127.0.0.1:4466/weir"
"""
import asyncio
import datetime
import decimal
import sys

import asyncpg


class Rollback(Exception):
    pass


async def types_and_parameters(dsn):
    checks = 0
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        "CREATE TABLE apt (id int PRIMARY KEY, small smallint, big bigint, flag boolean,"
        " r real, d double precision, amount numeric(12,3), name text, code varchar(8),"
        " day date, at timestamp, atz timestamptz, span interval)")
    await conn.execute(
        "CREATE MATERIALIZED VIEW apt_by_flag AS"
        " SELECT flag, count(*) AS n, sum(amount) AS total, max(at) AS latest FROM apt GROUP BY flag")
    row = (1, 7, 9_000_000_000, True, 0.5, 1.25, decimal.Decimal("12.345"), "ünï", "abc",
           datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 3, 4, 5, 250000),
           datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
           datetime.timedelta(days=1, seconds=5))
    await conn.execute("INSERT INTO apt VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
                       " $12, $13)", *row)
    got = await conn.fetchrow("SELECT * FROM apt WHERE id = $1", 1)
    assert tuple(got) == row, got
    checks += 1

    # Parameters typed by a cast or by LIMIT, as PostgreSQL types them.
    assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
    assert await conn.fetchval("SELECT $1::smallint", 7) == 7
    assert await conn.fetchval("SELECT CAST($1 AS bigint)", 2**40) == 2**40
    assert await conn.fetchval("SELECT count(*) FROM (SELECT id FROM apt LIMIT $1) s", 1) == 1
    assert await conn.fetchval("SELECT $1::date", datetime.date(2024, 5, 6)) == \
        datetime.date(2024, 5, 6)
    checks += 1

    # A prepared statement run many times; the view read in binary.
    insert = await conn.prepare("INSERT INTO apt (id, flag, amount, at) VALUES ($1, $2, $3, $4)")
    for i in range(2, 102):
        await insert.fetch(i, i % 2 == 0, decimal.Decimal(i), datetime.datetime(2024, 1, 1, 0, 0, i % 60))
    await conn.execute("FLUSH")
    rows = await conn.fetch("SELECT flag, n, total, latest FROM apt_by_flag ORDER BY flag")
    assert [tuple(r) for r in rows] == [
        (False, 50, sum(decimal.Decimal(i) for i in range(3, 102, 2)),
         datetime.datetime(2024, 1, 1, 0, 0, 59)),
        (True, 51, sum(decimal.Decimal(i) for i in range(2, 102, 2)) + decimal.Decimal("12.345"),
         datetime.datetime(2024, 1, 2, 3, 4, 5, 250000)),
    ], rows
    checks += 1

    # An error, and the connection goes on.
    try:
        await conn.execute("INSERT INTO apt (id) VALUES (1)")
        raise AssertionError("a duplicate key was accepted")
    except asyncpg.UniqueViolationError:
        pass
    assert await conn.fetchval("SELECT count(*) FROM apt") == 101
    checks += 1

    # Bulk loading in binary COPY (asyncpg reads the columns' types from pg_catalog first);
    # a bad record fails the whole COPY, and nothing of it is applied.
    records = [(1000 + i, i % 2 == 0, decimal.Decimal(i) / 4, f"r{i}", datetime.date(2024, 1, 1))
               for i in range(5000)]
    copied = await conn.copy_records_to_table(
        "apt", records=records, columns=["id", "flag", "amount", "name", "day"])
    assert copied == "COPY 5000", copied
    try:
        await conn.copy_records_to_table("apt", records=[(9000,), (1000,)], columns=["id"])
        raise AssertionError("a COPY with a duplicate key was accepted")
    except asyncpg.UniqueViolationError:
        pass
    assert await conn.fetchval("SELECT count(*) FROM apt") == 5101
    assert await conn.fetchval("SELECT sum(amount) FROM apt WHERE id >= 1000") == \
        sum(decimal.Decimal(i) / 4 for i in range(5000))
    checks += 1
    await conn.close()
    return checks


async def main(dsn):
    checks = await types_and_parameters(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
    async with pool.acquire() as a:
        await a.execute("CREATE TABLE apg (id int PRIMARY KEY, v int)")

    # A block rolled back by an exception leaves nothing; its own statements saw its write.
    async with pool.acquire() as a, pool.acquire() as b:
        try:
            async with a.transaction():
                await a.execute("INSERT INTO apg VALUES (1, 10)")
                assert await a.fetchval("SELECT count(*) FROM apg") == 1
                assert await b.fetchval("SELECT count(*) FROM apg") == 0
                raise Rollback()
        except Rollback:
            pass
        assert await b.fetchval("SELECT count(*) FROM apg") == 0
    checks += 1

    # Committed on one pooled connection, read on another at once.
    async with pool.acquire() as a, pool.acquire() as b:
        async with a.transaction():
            await a.execute("INSERT INTO apg VALUES (2, 20)")
            await a.execute("UPDATE apg SET v = v + 1 WHERE id = 2")
        assert await b.fetchval("SELECT v FROM apg WHERE id = 2") == 21
    checks += 1

    # An error fails the block: the next statement gets 25P02; the block rolls back.
    async with pool.acquire() as a:
        try:
            async with a.transaction():
                await a.execute("INSERT INTO apg VALUES (3, 30)")
                try:
                    await a.execute("INSERT INTO apg VALUES (2, 0)")
                    raise AssertionError("duplicate key accepted")
                except asyncpg.UniqueViolationError:
                    pass
                await a.execute("SELECT 1")
                raise AssertionError("a statement ran in a failed block")
        except asyncpg.InFailedSQLTransactionError:
            pass
        assert await a.fetchval("SELECT count(*) FROM apg") == 1
    checks += 1

    # First committer wins.
    async with pool.acquire() as a, pool.acquire() as b:
        first = a.transaction()
        await first.start()
        await a.execute("UPDATE apg SET v = 100 WHERE id = 2")
        async with b.transaction():
            await b.execute("UPDATE apg SET v = 200 WHERE id = 2")
        try:
            await first.commit()
            raise AssertionError("a lost update was committed")
        except asyncpg.SerializationError:
            pass
        assert await a.fetchval("SELECT v FROM apg WHERE id = 2") == 200
    checks += 1
    await pool.close()
    print(f"asyncpg: {checks} passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
