"""asyncpg against a running Weir server, through its connection pool: transactions as
asyncpg runs them (`async with conn.transaction()`, rolled back when the block raises), an
error failing the block until rollback, a write committed on one pooled connection read at
once on another, and 40001 for the second of two conflicting blocks.

Usage: python3 tests/drivers/asyncpg_test.py "postgresql://weir@127.0.0.1:4466/weir"
"""
import asyncio
import sys

import asyncpg


class Rollback(Exception):
    pass


async def main(dsn):
    checks = 0
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
