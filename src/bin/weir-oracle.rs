//! `weir-oracle`: differential testing of Weir's views against PostgreSQL.
//!
//! For each seed it generates a schema, views and a stream of INSERT/UPDATE/DELETE batches,
//! applies the same statements to a Weir server (in this process) and to PostgreSQL (the
//! oracle), and after every few batches compares each view with the same view in PostgreSQL,
//! where a plain view is always its query over the current data. Rows are compared as
//! multisets: exactly for integers, numerics and text, within a relative 1e-9 for floats.
//!
//! Usage: `weir-oracle --pg "host=... port=... user=..." [--seeds N] [--first-seed S]
//! [--minutes M] [--batches B]`. Prints `oracle: N passed, M failed` and exits non-zero on any
//! mismatch; each mismatch's statements are written to `oracle-failures/seed-S.sql`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use weir::config::Config;
use weir::db::Database;
use weir::rng::Rng;

struct Args {
    pg: String,
    seeds: u64,
    first_seed: u64,
    minutes: Option<f64>,
    batches: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        pg: std::env::var("PG_CONN").unwrap_or_default(),
        seeds: 5,
        first_seed: 1,
        minutes: None,
        batches: 12,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--pg" => args.pg = value()?,
            "--seeds" => args.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?,
            "--first-seed" => {
                args.first_seed = value()?.parse().map_err(|e| format!("--first-seed: {e}"))?
            }
            "--minutes" => {
                args.minutes = Some(value()?.parse().map_err(|e| format!("--minutes: {e}"))?)
            }
            "--batches" => {
                args.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.pg.is_empty() {
        return Err("give PostgreSQL's connection string with --pg or PG_CONN".into());
    }
    Ok(args)
}

/// The columns every generated table has; small domains so that groups collide and NULLs occur.
const COLUMNS: &str = "k int, g int, v bigint, d double precision, n numeric(10,2), s text, b boolean, dt date, ts timestamp";

fn value(rng: &mut Rng, column: &str) -> String {
    if column != "k" && rng.chance(12) {
        return "NULL".into();
    }
    match column {
        "k" => rng.below(40).to_string(),
        "g" => rng.below(5).to_string(),
        "v" => (rng.below(21) as i64 - 10).to_string(),
        "d" => format!("{}.{}", rng.below(20) as i64 - 10, rng.below(4) * 25),
        "n" => format!("{}.{:02}", rng.below(200) as i64 - 100, rng.below(100)),
        "s" => format!("'{}'", rng.pick(&["a", "b", "ab", "ba", "z", ""])),
        "b" => rng.pick(&["true", "false"]).to_string(),
        "dt" => format!("'2024-01-{:02}'", 1 + rng.below(5)),
        "ts" => format!("'2024-01-01 {:02}:{:02}:00'", rng.below(3), rng.below(60)),
        _ => unreachable!("unknown column {column}"),
    }
}

const NAMES: [&str; 9] = ["k", "g", "v", "d", "n", "s", "b", "dt", "ts"];

fn row(rng: &mut Rng) -> String {
    let values: Vec<String> = NAMES.iter().map(|c| value(rng, c)).collect();
    format!("({})", values.join(", "))
}

fn predicate(rng: &mut Rng) -> String {
    match rng.below(7) {
        0 => format!("g = {}", rng.below(5)),
        1 => format!("v > {}", rng.below(11) as i64 - 5),
        2 => "s IS NULL".into(),
        3 => format!("n < {}", rng.below(100) as i64 - 50),
        4 => format!("k % 3 = {}", rng.below(3)),
        5 => "b".into(),
        _ => format!(
            "(g IS NULL OR v BETWEEN {} AND {})",
            -(rng.below(5) as i64),
            rng.below(5)
        ),
    }
}

/// One view definition over `t` (or over an earlier view), from the families Weir maintains.
fn view_query(rng: &mut Rng, table: &str, earlier: &[(String, Family)]) -> (String, Family) {
    let filter = if rng.chance(50) {
        format!(" WHERE {}", predicate(rng))
    } else {
        String::new()
    };
    match rng.below(6) {
        0 => (
            format!(
                "SELECT k, g, v * 2 + 1 AS v2, coalesce(s, 'none') AS s, CASE WHEN v > 0 THEN 'pos' WHEN v < 0 THEN 'neg' ELSE 'zero' END AS sign, nullif(g, 0) AS g0, n * 2 AS n2, d FROM {table}{filter}"
            ),
            Family::Project,
        ),
        1 | 2 => {
            let having = if rng.chance(30) {
                " HAVING count(*) > 1"
            } else {
                ""
            };
            (
                format!(
                    "SELECT g, count(*) AS c, count(v) AS cv, sum(v) AS sv, min(v) AS lo, max(v) AS hi, sum(n) AS sn, min(s) AS smin, max(dt) AS dmax, avg(v)::double precision AS av, sum(d) AS sd FROM {table}{filter} GROUP BY g{having}"
                ),
                Family::GroupBy,
            )
        }
        3 => (
            format!(
                "SELECT count(*) AS c, sum(v) AS sv, min(n) AS lo, max(n) AS hi, max(ts) AS last FROM {table}{filter}"
            ),
            Family::Global,
        ),
        4 => (
            format!(
                "SELECT g % 2 AS parity, b, count(*) AS c, sum(v * 10) AS s FROM {table}{filter} GROUP BY g % 2, b"
            ),
            Family::GroupByExpression,
        ),
        _ => match earlier.iter().find(|(_, f)| *f == Family::GroupBy) {
            Some((name, _)) => (
                format!("SELECT g, c * 2 AS c2, sv FROM {name} WHERE c > 1"),
                Family::OnView,
            ),
            None => view_query(rng, table, earlier),
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Project,
    GroupBy,
    GroupByExpression,
    Global,
    OnView,
}

fn dml(rng: &mut Rng, table: &str) -> String {
    match rng.below(10) {
        0..=4 => {
            let rows: Vec<String> = (0..1 + rng.below(6)).map(|_| row(rng)).collect();
            format!("INSERT INTO {table} VALUES {}", rows.join(", "))
        }
        5 | 6 => format!(
            "UPDATE {table} SET g = {}, v = v + {} WHERE {}",
            value(rng, "g"),
            rng.below(5),
            predicate(rng)
        ),
        7 => format!(
            "UPDATE {table} SET s = NULL, n = n * 2 WHERE {}",
            predicate(rng)
        ),
        8 => format!("DELETE FROM {table} WHERE {}", predicate(rng)),
        _ => {
            if rng.chance(30) {
                format!("DELETE FROM {table}")
            } else {
                format!(
                    "INSERT INTO {table} SELECT * FROM {table} WHERE {}",
                    predicate(rng)
                )
            }
        }
    }
}

async fn rows(client: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    let messages = client.simple_query(sql).await.map_err(describe)?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

fn describe(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Two cells agree: exactly, or as floating-point numbers within a relative 1e-9.
fn same_cell(a: &Option<String>, b: &Option<String>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) if x == y => true,
        (Some(x), Some(y)) => match (x.parse::<f64>(), y.parse::<f64>()) {
            // Only values that print as floats get a tolerance; exact types must match exactly.
            (Ok(p), Ok(q)) if x.contains(['.', 'e']) || y.contains(['.', 'e']) => {
                let scale = p.abs().max(q.abs()).max(1e-300);
                (p - q).abs() / scale < 1e-9 || (p - q).abs() < 1e-12
            }
            _ => false,
        },
        _ => false,
    }
}

/// Compares two multisets of rows; returns the rows only one side has.
fn compare(
    weir: &[Vec<Option<String>>],
    pg: &[Vec<Option<String>>],
) -> Option<(Vec<String>, Vec<String>)> {
    let key = |r: &Vec<Option<String>>| {
        r.iter()
            .map(|c| c.clone().unwrap_or_else(|| "NULL".into()))
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut w: Vec<&Vec<Option<String>>> = weir.iter().collect();
    let mut p: Vec<&Vec<Option<String>>> = pg.iter().collect();
    w.sort_by_key(|r| key(r));
    p.sort_by_key(|r| key(r));
    let mut only_weir = Vec::new();
    let mut unmatched: Vec<&Vec<Option<String>>> = p.clone();
    for row in &w {
        match unmatched.iter().position(|q| {
            q.len() == row.len() && q.iter().zip(row.iter()).all(|(a, b)| same_cell(a, b))
        }) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => only_weir.push(key(row)),
        }
    }
    let only_pg: Vec<String> = unmatched.iter().map(|r| key(r)).collect();
    if only_weir.is_empty() && only_pg.is_empty() {
        None
    } else {
        Some((only_weir, only_pg))
    }
}

struct Outcome {
    passed: u64,
    failed: u64,
}

async fn run_seed(args: &Args, seed: u64) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed);
    let mut log: Vec<String> = Vec::new();
    // PostgreSQL: a fresh database for the seed.
    let (admin, conn) = tokio_postgres::connect(&args.pg, NoTls)
        .await
        .map_err(describe)?;
    tokio::spawn(conn);
    let db_name = format!("oracle_{seed}");
    admin
        .simple_query(&format!("DROP DATABASE IF EXISTS {db_name}"))
        .await
        .map_err(describe)?;
    admin
        .simple_query(&format!("CREATE DATABASE {db_name}"))
        .await
        .map_err(describe)?;
    let (pg, conn) = tokio_postgres::connect(&format!("{} dbname={db_name}", args.pg), NoTls)
        .await
        .map_err(describe)?;
    tokio::spawn(conn);
    // Weir: a server in this process with its own data directory.
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let config = Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        data_dir: dir.path().to_path_buf(),
        barrier_interval_ms: 50,
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let db = Database::open(config).await.map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(weir::server::serve(db, listener, async {
        let _ = stop_rx.await;
    }));
    let (weir, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=oracle dbname=weir",
            addr.port()
        ),
        NoTls,
    )
    .await
    .map_err(describe)?;
    tokio::spawn(conn);

    let mut outcome = Outcome {
        passed: 0,
        failed: 0,
    };
    let table = "t";
    let pk = if rng.chance(50) {
        ", PRIMARY KEY (k)"
    } else {
        ""
    };
    let ddl = format!("CREATE TABLE {table} ({COLUMNS}{pk})");
    let mut views: Vec<(String, Family)> = Vec::new();
    let statements_before = 1 + rng.below(3);
    let logged = |log: &mut Vec<String>, sql: String| {
        log.push(format!("{sql};"));
        sql
    };
    let sql = logged(&mut log, ddl);
    exec_both(&weir, &pg, &sql).await?;
    let view_count = 3 + rng.below(4);
    for batch in 0..args.batches {
        // Views are created before any data and between batches (backfill).
        if (batch as u64 == 0 || batch as u64 == statements_before || rng.chance(25))
            && (views.len() as u64) < view_count
        {
            let (query, family) = view_query(&mut rng, table, &views);
            let name = format!("v{}", views.len());
            let weir_sql = logged(
                &mut log,
                format!("CREATE MATERIALIZED VIEW {name} AS {query}"),
            );
            let pg_sql = format!("CREATE VIEW {name} AS {query}");
            exec(&weir, &weir_sql)
                .await
                .map_err(|e| format!("weir: {weir_sql}: {e}"))?;
            exec(&pg, &pg_sql)
                .await
                .map_err(|e| format!("postgres: {pg_sql}: {e}"))?;
            views.push((name, family));
        }
        for _ in 0..1 + rng.below(4) {
            let sql = logged(&mut log, dml(&mut rng, table));
            exec_both(&weir, &pg, &sql).await?;
        }
        if batch % 3 == 2 || batch + 1 == args.batches {
            exec(&weir, "FLUSH").await?;
            for (name, family) in &views {
                let sql = format!("SELECT * FROM {name}");
                let w = rows(&weir, &sql)
                    .await
                    .map_err(|e| format!("weir: {sql}: {e}"))?;
                let p = rows(&pg, &sql)
                    .await
                    .map_err(|e| format!("postgres: {sql}: {e}"))?;
                match compare(&w, &p) {
                    None => outcome.passed += 1,
                    Some((only_weir, only_pg)) => {
                        outcome.failed += 1;
                        let report = format!(
                            "-- seed {seed}, view {name} ({family:?}), after batch {batch}\n{}\n-- rows only in Weir:\n{}\n-- rows only in PostgreSQL:\n{}\n",
                            log.join("\n"),
                            only_weir.iter().map(|r| format!("--   {r}")).collect::<Vec<_>>().join("\n"),
                            only_pg.iter().map(|r| format!("--   {r}")).collect::<Vec<_>>().join("\n"),
                        );
                        let _ = std::fs::create_dir_all("oracle-failures");
                        let path = format!("oracle-failures/seed-{seed}.sql");
                        let _ = std::fs::write(&path, &report);
                        eprintln!(
                            "oracle: seed {seed}: view {name} differs; reproduction in {path}"
                        );
                    }
                }
            }
        }
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    drop(pg);
    admin
        .simple_query(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))
        .await
        .map_err(describe)?;
    Ok(outcome)
}

async fn exec(client: &Client, sql: &str) -> Result<(), String> {
    client.simple_query(sql).await.map(|_| ()).map_err(describe)
}

/// Runs a statement on both servers; they must agree on whether it fails (and with which
/// SQLSTATE class).
async fn exec_both(weir: &Client, pg: &Client, sql: &str) -> Result<(), String> {
    let w = exec(weir, sql).await;
    let p = exec(pg, sql).await;
    match (&w, &p) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(a), Err(b)) if a.get(..2) == b.get(..2) => Ok(()),
        _ => Err(format!(
            "the servers disagree on {sql}\n  weir: {w:?}\n  postgres: {p:?}"
        )),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("weir-oracle: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let deadline = args.minutes.map(|m| Duration::from_secs_f64(m * 60.0));
    let mut passed = 0;
    let mut failed = 0;
    let mut per_family: BTreeMap<String, u64> = BTreeMap::new();
    for seed in args.first_seed..args.first_seed + args.seeds {
        if deadline.is_some_and(|d| started.elapsed() > d) {
            break;
        }
        match run_seed(&args, seed).await {
            Ok(o) => {
                passed += o.passed;
                failed += o.failed;
            }
            Err(e) => {
                failed += 1;
                eprintln!("oracle: seed {seed} failed: {e}");
            }
        }
        *per_family.entry("seeds".into()).or_default() += 1;
    }
    println!(
        "oracle: {} seeds in {:.0} s",
        per_family.get("seeds").copied().unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    println!("oracle: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
