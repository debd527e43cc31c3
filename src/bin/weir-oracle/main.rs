//! `weir-oracle`: differential testing of Weir's views against PostgreSQL.
//!
//! For each seed it generates a schema, views and a stream of INSERT/UPDATE/DELETE batches
//! (`workload`), applies the same statements to a Weir server in this process and to
//! PostgreSQL, the oracle, and after every few batches compares each view with the same view
//! in PostgreSQL, where a plain view is always its query over the current data (`replay`).
//! Rows are compared as multisets: exactly, except floating-point columns within a relative
//! 1e-9. A failure is shrunk (`shrink`) and written as an slt file (`report`).
//!
//! Usage: `weir-oracle [--pg "host=... port=... user=..."] [--seeds N] [--first-seed S]
//! [--minutes M] [--batches B] [--failures DIR] [--parallelism N]`. Without `--pg` (or `PG_CONN`) it starts a
//! throwaway PostgreSQL (`postgres`). Prints `oracle: N passed, M failed` and exits non-zero
//! on any failure.

mod broker;
mod crash;
mod postgres;
mod replay;
mod report;
mod shrink;
mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use replay::{connect, exec, replay, Checks, Failure};
use shrink::{shrink, Budget};
use workload::Family;

struct Args {
    pg: Option<String>,
    seeds: u64,
    first_seed: u64,
    minutes: Option<f64>,
    batches: usize,
    failures: PathBuf,
    /// Parallel actors per view (the server's `streaming_parallelism`).
    parallelism: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        pg: std::env::var("PG_CONN").ok().filter(|c| !c.is_empty()),
        seeds: 5,
        first_seed: 1,
        minutes: None,
        batches: 12,
        failures: PathBuf::from("oracle-failures"),
        parallelism: 1,
    };
    let mut seeds_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--pg" => args.pg = Some(value()?),
            "--seeds" => {
                args.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?;
                seeds_given = true;
            }
            "--first-seed" => {
                args.first_seed = value()?.parse().map_err(|e| format!("--first-seed: {e}"))?
            }
            "--minutes" => {
                args.minutes = Some(value()?.parse().map_err(|e| format!("--minutes: {e}"))?)
            }
            "--batches" => {
                args.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?
            }
            "--failures" => args.failures = PathBuf::from(value()?),
            "--parallelism" => {
                args.parallelism = weir::db::parse_parallelism(&value()?)
                    .map_err(|e| format!("--parallelism: {}", e.message))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    // A time limit alone runs seeds until the time is up.
    if args.minutes.is_some() && !seeds_given {
        args.seeds = u64::MAX - args.first_seed;
    }
    Ok(args)
}

#[derive(Default)]
struct Totals {
    seeds: u64,
    passed: u64,
    failed: u64,
    /// Views that matched, per family, counted at every check.
    per_family: BTreeMap<Family, u64>,
}

/// Runs one seed in its own PostgreSQL database; a failure is shrunk and written out.
async fn run_seed(args: &Args, conn: &str, seed: u64, totals: &mut Totals) -> Result<(), String> {
    let admin = connect(conn).await?;
    let db_name = format!("oracle_{seed}");
    exec(&admin, &format!("DROP DATABASE IF EXISTS {db_name}")).await?;
    exec(&admin, &format!("CREATE DATABASE {db_name}")).await?;
    let pg = connect(&format!("{conn} dbname={db_name}")).await?;

    let steps = workload::generate(seed, args.batches);
    let run = replay(&pg, &steps, Checks::All, args.parallelism).await?;
    for family in run.passed {
        totals.passed += 1;
        *totals.per_family.entry(family).or_default() += 1;
    }
    if let Some((at, failure)) = run.failure {
        totals.failed += 1;
        match &failure {
            Failure::Mismatch { view, family, .. } => {
                eprintln!("oracle: seed {seed}: view {view} ({family:?}) differs from PostgreSQL")
            }
            Failure::Disagree { sql, weir, postgres } => eprintln!(
                "oracle: seed {seed}: the servers disagree on {sql}\n  weir: {weir:?}\n  postgres: {postgres:?}"
            ),
        }
        let budget = Budget {
            replays: 400,
            time: Duration::from_secs(180),
        };
        let shrunk = shrink(
            &pg,
            steps[..=at].to_vec(),
            failure,
            budget,
            args.parallelism,
        )
        .await?;
        let path = report::write(&args.failures, seed, args.parallelism, at + 1, &shrunk)?;
        eprintln!(
            "oracle: seed {seed}: reproduction in {} ({} steps)",
            path.display(),
            shrunk.steps.len()
        );
    }
    drop(pg);
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"),
    )
    .await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("crash") {
        return crash::main(std::env::args().skip(2)).await;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("weir-oracle: {e}");
            return ExitCode::from(2);
        }
    };
    // Held until the end: dropping it stops the throwaway server.
    let mut own_server = None;
    let conn = match &args.pg {
        Some(conn) => conn.clone(),
        None => match postgres::Postgres::start() {
            Ok(pg) => own_server.insert(pg).conn.clone(),
            Err(e) => {
                eprintln!("weir-oracle: starting PostgreSQL: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let started = Instant::now();
    let deadline = args.minutes.map(|m| Duration::from_secs_f64(m * 60.0));
    let mut totals = Totals::default();
    for seed in args.first_seed..args.first_seed.saturating_add(args.seeds) {
        if deadline.is_some_and(|d| started.elapsed() > d) {
            break;
        }
        if let Err(e) = run_seed(&args, &conn, seed, &mut totals).await {
            totals.failed += 1;
            eprintln!("oracle: seed {seed} failed: {e}");
        }
        totals.seeds += 1;
    }
    let families: Vec<String> = totals
        .per_family
        .iter()
        .map(|(f, n)| format!("{f:?} {n}"))
        .collect();
    println!(
        "oracle: {} seeds in {:.0} s; checks passed per family: {}",
        totals.seeds,
        started.elapsed().as_secs_f64(),
        families.join(", ")
    );
    println!("oracle: {} passed, {} failed", totals.passed, totals.failed);
    drop(own_server);
    if totals.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
