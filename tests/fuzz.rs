//! No input may panic the server: random and truncated SQL, through the parser directly and
//! through a live connection. Seeded, bounded, and repeatable.

mod common;

use common::TestServer;
use weir::rng::Rng;

/// A value in `0..n`.
fn upto(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

const CORPUS: &[&str] = &[
    "CREATE TABLE f (a int PRIMARY KEY, b text, c numeric(10,2), d double precision)",
    "INSERT INTO f VALUES (1, 'x', 1.5, 2.5), (2, NULL, NULL, NULL)",
    "UPDATE f SET b = b || 'y', c = c * 2 WHERE a > 0",
    "DELETE FROM f WHERE a = 2",
    "CREATE MATERIALIZED VIEW fv AS SELECT b, count(*), sum(c), min(d) FROM f GROUP BY b HAVING count(*) > 0",
    "SELECT a, CASE WHEN a > 1 THEN 'x' ELSE NULL END, coalesce(b, 'n') FROM f WHERE a IN (1, 2) ORDER BY a LIMIT 3",
    "SELECT count(*) FROM fv",
    "DROP MATERIALIZED VIEW IF EXISTS fv CASCADE",
    "FLUSH",
    "SHOW MATERIALIZED VIEWS",
    "SHOW CREATE MATERIALIZED VIEW fv",
    "SET extra_float_digits = 3",
    "BEGIN; SELECT 1; COMMIT",
    "SELECT 'unterminated",
    "SELECT 1 / 0",
    "INSERT INTO f VALUES ('x', 1)",
    "SELECT CAST('2024-13-45' AS date)",
    "SELECT 99999999999999999999999999999999999999999::numeric",
];

const TOKENS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "(",
    ")",
    ",",
    ";",
    "'",
    "\"",
    "--",
    "/*",
    "*/",
    "$1",
    "::",
    "NULL",
    "f",
    "fv",
    "a",
    "GROUP BY",
    "HAVING",
    "JOIN",
    "ON",
    "1e999",
    "-",
    "*",
    "/",
    "CREATE",
    "MATERIALIZED VIEW",
    "AS",
    "DROP",
    "TABLE",
    "INSERT INTO",
    "VALUES",
    "é",
    "\\",
    "count(",
    "sum(",
    "min(",
    "CAST(",
    "INTERVAL",
    "'1 day'",
    "9223372036854775808",
];

/// One random statement: a truncated, spliced or token-mutated corpus entry, or garbage.
fn statement(rng: &mut Rng) -> String {
    let base = *rng.pick(CORPUS);
    match upto(rng, 4) {
        0 => {
            let cut = upto(rng, base.len() + 1);
            base.char_indices()
                .take_while(|(i, _)| *i < cut)
                .map(|(_, c)| c)
                .collect()
        }
        1 => {
            let mut words: Vec<String> = base.split(' ').map(str::to_string).collect();
            for _ in 0..=upto(rng, 3) {
                let i = upto(rng, words.len());
                words[i] = rng.pick(TOKENS).to_string();
            }
            words.join(" ")
        }
        2 => {
            let other = *rng.pick(CORPUS);
            let a = upto(rng, base.len() + 1);
            let b = upto(rng, other.len() + 1);
            let head: String = base.chars().take(a).collect();
            let tail: String = other.chars().skip(b).collect();
            head + &tail
        }
        _ => (0..upto(rng, 40))
            .map(|_| *rng.pick(TOKENS))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[test]
fn parser_never_panics_on_random_input() {
    let mut rng = Rng::new(0x5eed_1234_abcd_0001);
    for _ in 0..20_000 {
        let s = statement(&mut rng);
        let _ = weir::sql::parse(&s);
    }
    // Arbitrary bytes too (as UTF-8 where valid).
    for _ in 0..5_000 {
        let bytes: Vec<u8> = (0..upto(&mut rng, 64))
            .map(|_| rng.next_u64() as u8)
            .collect();
        let s = String::from_utf8_lossy(&bytes);
        let _ = weir::sql::parse(&s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_survives_random_and_truncated_sql() {
    let server = TestServer::start().await;
    let client = server.connect().await;
    let mut rng = Rng::new(0x0bad_5eed_0000_0042);
    let mut errors = 0;
    for i in 0..1500 {
        let s = statement(&mut rng);
        if let Err(e) = client.simple_query(&s).await {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("statement {i} broke the connection: {s:?}: {e}"));
            assert_ne!(
                db.code().code(),
                "XX000",
                "statement {i} hit an internal error: {s:?}: {}",
                db.message()
            );
            errors += 1;
        }
    }
    assert!(
        errors > 0,
        "the generator should produce invalid statements"
    );
    // Still serving, on this connection (out of any transaction block a truncated `BEGIN;
    // ...` left open, or failed) and on a new one.
    client.simple_query("ROLLBACK").await.unwrap();
    let rows = client.simple_query("SELECT 1").await.unwrap();
    assert!(!rows.is_empty());
    let other = server.connect().await;
    other.simple_query("SELECT 1").await.unwrap();
}
