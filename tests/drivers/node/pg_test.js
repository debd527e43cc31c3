// node-postgres (`pg`, npm) against a running Weir server: parameters of every type (`pg` sends
// them as untyped text, so the server types each from its context), a view read back in text
// and in binary, a named prepared statement run many times, an error and the connection going
// on, a transaction through a pool, and bulk loading with `pg-copy-streams` (COPY FROM STDIN):
// all of it, or none of it when a line is bad.
//
// Usage: TZ=UTC NODE_PATH=<node_modules> node tests/drivers/node_pg_test.js <connection string>
'use strict';
const assert = require('node:assert/strict');
const { pipeline } = require('node:stream/promises');
const { Readable } = require('node:stream');
const pg = require('pg');
const copyFrom = require('pg-copy-streams').from;

async function typesAndParameters(url) {
  let checks = 0;
  const client = new pg.Client({ connectionString: url, application_name: 'node-pg-test' });
  await client.connect();
  await client.query(
    'CREATE TABLE npt (id int PRIMARY KEY, small smallint, big bigint, flag boolean,' +
      ' r real, d double precision, amount numeric(12,3), name text, code varchar(8),' +
      ' day date, at timestamp, atz timestamptz, span interval)');
  await client.query(
    'CREATE MATERIALIZED VIEW npt_by_flag AS SELECT flag, count(*) AS n,' +
      ' sum(amount) AS total, max(at) AS latest FROM npt GROUP BY flag');
  const at = new Date(Date.UTC(2024, 0, 2, 3, 4, 5, 250));
  const atz = new Date(Date.UTC(2024, 0, 2, 3, 4, 5));
  await client.query(
    'INSERT INTO npt VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)',
    [1, 7, '9000000000', true, 0.5, 1.25, '12.345', 'ünï', 'abc', '2024-01-02', at, atz,
      '1 day 00:00:05']);
  const { rows, fields } = await client.query('SELECT * FROM npt WHERE id = $1', [1]);
  assert.equal(rows.length, 1);
  const got = rows[0];
  assert.deepEqual(
    [got.id, got.small, got.big, got.flag, got.r, got.d, got.amount, got.name, got.code],
    [1, 7, '9000000000', true, 0.5, 1.25, '12.345', 'ünï', 'abc']);
  assert.equal(got.day.toISOString(), '2024-01-02T00:00:00.000Z');
  assert.equal(got.at.getTime(), at.getTime());
  assert.equal(got.atz.getTime(), atz.getTime());
  assert.deepEqual([got.span.days, got.span.seconds], [1, 5]);
  // Each column described with its type's OID (varchar is 1043, numeric 1700).
  assert.deepEqual(
    fields.map((f) => f.dataTypeID),
    [23, 21, 20, 16, 700, 701, 1700, 25, 1043, 1082, 1114, 1184, 1186]);
  checks += 1;

  // Parameters typed by a cast, by LIMIT and by the column they are compared with.
  assert.equal((await client.query('SELECT $1::int + 1 AS v', [41])).rows[0].v, 42);
  assert.equal((await client.query('SELECT CAST($1 AS bigint) AS v', [2 ** 40])).rows[0].v,
    String(2 ** 40));
  assert.equal(
    (await client.query('SELECT count(*) AS n FROM (SELECT id FROM npt LIMIT $1) s', [1]))
      .rows[0].n, '1');
  assert.equal(
    (await client.query('SELECT count(*) AS n FROM npt WHERE day = $1 AND flag = $2',
      ['2024-01-02', true])).rows[0].n, '1');
  checks += 1;

  // A named statement: prepared once, then executed many times.
  for (let i = 2; i < 102; i++) {
    await client.query({
      name: 'npt-insert',
      text: 'INSERT INTO npt (id, flag, amount, at) VALUES ($1, $2, $3, $4)',
      values: [i, i % 2 === 0, String(i), new Date(Date.UTC(2024, 0, 1, 0, 0, i % 60))],
    });
  }
  await client.query('FLUSH');
  const evens = 51;
  const evenTotal = '2562.345'; // 2 + 4 + ... + 100 = 2550, and 12.345
  const oddTotal = '2600.000'; // 3 + 5 + ... + 101
  const view = 'SELECT flag, n, total, latest FROM npt_by_flag ORDER BY flag';
  const text = await client.query(view);
  assert.deepEqual(
    text.rows.map((r) => [r.flag, r.n, r.total, r.latest.toISOString()]),
    [[false, '50', oddTotal, '2024-01-01T00:00:59.000Z'],
      [true, String(evens), evenTotal, '2024-01-02T03:04:05.250Z']]);
  // The same rows in binary.
  const binary = await client.query({ text: view, binary: true });
  assert.deepEqual(
    binary.rows.map((r) => [r.flag, String(r.n), String(r.total), r.latest.toISOString()]),
    text.rows.map((r) => [r.flag, r.n, r.total, r.latest.toISOString()]));
  checks += 1;

  // An error, with its SQLSTATE, and the connection goes on.
  await assert.rejects(client.query('INSERT INTO npt (id) VALUES (1)'), { code: '23505' });
  await assert.rejects(client.query('SELECT nope FROM npt'), { code: '42703' });
  assert.equal((await client.query('SELECT count(*) AS n FROM npt')).rows[0].n, '101');
  checks += 1;

  // COPY FROM STDIN, and a bad line failing the whole COPY with its line number.
  const lines = [];
  for (let i = 0; i < 5000; i++) lines.push(`${1000 + i}\t${i % 2 === 0}\t${i / 4}\n`);
  await pipeline(Readable.from(lines),
    client.query(copyFrom('COPY npt (id, flag, amount) FROM STDIN')));
  await assert.rejects(
    pipeline(Readable.from(['9000\tt\t1\n', '9001\tmaybe\t1\n']),
      client.query(copyFrom('COPY npt (id, flag, amount) FROM STDIN'))),
    (e) => e.code === '22P02' && /line 2/.test(e.where));
  const loaded = await client.query(
    'SELECT count(*) AS n, sum(amount) AS s FROM npt WHERE id >= 1000');
  assert.deepEqual([loaded.rows[0].n, loaded.rows[0].s], ['5000', '3124375.000']);
  checks += 1;
  await client.end();
  return checks;
}

async function pooled(url) {
  let checks = 0;
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  await pool.query('CREATE TABLE npg (id int PRIMARY KEY, v int)');
  // A transaction on one pooled client: rolled back, nothing of it stays.
  const a = await pool.connect();
  await a.query('BEGIN');
  await a.query('INSERT INTO npg VALUES ($1, $2)', [1, 10]);
  assert.equal((await a.query('SELECT count(*) AS n FROM npg')).rows[0].n, '1');
  assert.equal((await pool.query('SELECT count(*) AS n FROM npg')).rows[0].n, '0');
  await a.query('ROLLBACK');
  // Committed, and read at once on the other client.
  await a.query('BEGIN');
  await a.query('INSERT INTO npg VALUES ($1, $2)', [2, 20]);
  await a.query('COMMIT');
  a.release();
  assert.equal((await pool.query('SELECT v FROM npg WHERE id = $1', [2])).rows[0].v, 20);
  checks += 1;
  await pool.end();
  return checks;
}

async function main(url) {
  const checks = (await typesAndParameters(url)) + (await pooled(url));
  console.log(`node pg: ${checks} passed, 0 failed`);
}

main(process.argv[2]).catch((e) => {
  console.error(e);
  process.exit(1);
});
