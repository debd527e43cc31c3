//! `weir-oracle crash`: exactly-once results across crashes (`docs/design/0004-recovery.md`).
//!
//! Runs the `weir` binary as a child process with checkpoints every few hundred milliseconds,
//! two writers changing two tables, a third sending transaction blocks over both (`blocks`:
//! committed, rolled back, cut off by the kill), a fourth sending statements too large to
//! hold in memory (`large`), sessions whose blocks conflict over a few hot rows (`hot`: 40001
//! for all but the first committer), and views over them; kills the server again and again,
//! alternately with `SIGKILL` at a random moment and by arming one failpoint
//! (`WEIR_FAILPOINTS`, debug builds) of the checkpoint, table and recovery paths, so that the
//! process aborts exactly there, or one I/O error of the change log (a full disk, a failed
//! fsync), which the statements that meet it must be refused for, leaving nothing behind.
//! Every acknowledged statement is applied to PostgreSQL too.
//! A statement the kill interrupted is in doubt: after the restart, Weir's table says whether
//! it was applied (all of it or none: anything else is a failure), and PostgreSQL follows.
//! After every restart and at the end, every view and table is compared with PostgreSQL:
//! a missing or a duplicated change fails the run. Two inputs come from upstream systems
//! (`upstreams`): a table of the oracle's PostgreSQL read through CDC, and a Kafka topic, both
//! written to while Weir runs and dies; after every restart Weir must catch up with them.
//! Three sinks (`sinks`) send a view and the Kafka input to a PostgreSQL table and a Kafka
//! topic; after every restart each target must come to hold exactly what it should, with a
//! failpoint armed now and then between a delivery's writes and its commit.
//!
//! Usage: `weir-oracle crash [--kills N] [--seed S] [--pg CONN] [--weir PATH] [--keep DIR]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use weir::rng::Rng;

mod armed;
mod blocks;
mod hot;
mod large;
mod model;
mod server;
mod sinks;
mod upstreams;
mod verify;

use self::armed::{fault_point, Armed, Arming};
use self::blocks::{transact_until_failure, Blocks, InDoubt};
use self::hot::Hot;
use self::large::Large;
use self::model::{Model, Statement};
use self::server::{print_log_tail, Death, Launcher, Server};
use self::sinks::Sinks;
use self::upstreams::Upstreams;
use self::verify::{check, resolve};
use crate::replay::{connect, describe, exec, rows};

/// Whether a statement Weir refused met an injected I/O error (and so was not applied).
fn io_refusal(code: &str) -> bool {
    matches!(code, "53100" | "53000" | "58030")
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE t1 (id bigint PRIMARY KEY, g int NOT NULL, v bigint, n numeric(12,2), s text)",
    "CREATE TABLE t2 (id bigint, k bigint, w bigint)",
    large::SCHEMA,
];

/// The views created at the start: (name, query).
const VIEWS: &[(&str, &str)] = &[
    (
        "v_groups",
        "SELECT g, count(*) AS c, sum(v) AS sv, min(v) AS mn, max(v) AS mx, sum(n) AS sn \
         FROM t1 GROUP BY g",
    ),
    (
        "v_total",
        "SELECT count(*) AS c, sum(v) AS sv, sum(n) AS sn FROM t1",
    ),
    (
        "v_join",
        "SELECT t1.id, t1.g, t2.id AS id2, t2.w FROM t1 JOIN t2 ON t1.id = t2.k",
    ),
    (
        "v_join_groups",
        "SELECT t1.g, count(*) AS c, sum(t2.w) AS sw FROM t1 JOIN t2 ON t1.id = t2.k GROUP BY t1.g",
    ),
    (
        "v_left",
        "SELECT t2.id, t2.k, t1.g FROM t2 LEFT JOIN t1 ON t2.k = t1.id",
    ),
    ("v_distinct", "SELECT DISTINCT s FROM t1"),
    ("v_top", "SELECT id, v FROM t1 ORDER BY v DESC, id LIMIT 5"),
    (
        "v_on_view",
        "SELECT sum(c) AS c, max(mx) AS mx FROM v_groups",
    ),
    ("v_filter", "SELECT id, k, w FROM t2 WHERE w % 3 = 0"),
    large::VIEW,
];

/// Views created (and later dropped) between kills, so that restarts meet views created and
/// dropped since the checkpoint they restore.
const LATER_VIEWS: &[&str] = &[
    "SELECT s, count(*) AS c, sum(v) AS sv FROM t1 GROUP BY s",
    "SELECT t2.k, count(*) AS c, max(t2.w) AS mw FROM t2 JOIN t1 ON t1.id = t2.k GROUP BY t2.k",
    "SELECT g, max(v) AS mx FROM t1 WHERE v % 2 = 0 GROUP BY g",
];

struct Args {
    kills: u64,
    seed: u64,
    pg: Option<String>,
    weir: PathBuf,
    keep: Option<PathBuf>,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let weir = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("weir");
    let mut out = Args {
        kills: 20,
        seed: 1,
        pg: std::env::var("PG_CONN").ok().filter(|c| !c.is_empty()),
        weir,
        keep: None,
    };
    let mut it = args;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--kills" => out.kills = value()?.parse().map_err(|e| format!("--kills: {e}"))?,
            "--seed" => out.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--pg" => out.pg = Some(value()?),
            "--weir" => out.weir = PathBuf::from(value()?),
            "--keep" => out.keep = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(out)
}

/// The counts the run reports.
#[derive(Default)]
struct Tally {
    kills_random: u64,
    /// Failpoints that aborted the server, by name.
    fired: BTreeMap<&'static str, u64>,
    /// Armed failpoints the server never reached before it was killed at random instead.
    not_reached: u64,
    /// Failpoints that must be reached and never were, however often they were armed.
    unreached: Vec<String>,
    /// Rounds with an I/O error injected, by fault.
    injected: BTreeMap<&'static str, u64>,
    /// Statements refused because of an injected I/O error (not applied).
    refused: u64,
    acknowledged: u64,
    in_doubt_applied: u64,
    in_doubt_not_applied: u64,
    blocks_committed: u64,
    blocks_rolled_back: u64,
    blocks_in_doubt_applied: u64,
    blocks_in_doubt_not_applied: u64,
    large_acknowledged: u64,
    large_in_doubt_applied: u64,
    large_in_doubt_not_applied: u64,
    hot: hot::Counts,
    checks: u64,
    /// Transactions and messages written to the upstreams.
    upstream_changes: u64,
}

pub async fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("weir-oracle crash: {e}");
            return ExitCode::from(2);
        }
    };
    let mut own_server = None;
    let conn = match &args.pg {
        Some(conn) => conn.clone(),
        None => match crate::postgres::Postgres::start() {
            Ok(pg) => own_server.insert(pg).conn.clone(),
            Err(e) => {
                eprintln!("weir-oracle crash: starting PostgreSQL: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("weir-oracle crash: temporary directory: {e}");
            return ExitCode::from(2);
        }
    };
    let work = args
        .keep
        .clone()
        .unwrap_or_else(|| dir.path().to_path_buf());
    let started = Instant::now();
    let mut tally = Tally::default();
    let result = run(&args, &conn, &work, &mut tally).await;
    let fired: Vec<String> = tally
        .fired
        .iter()
        .map(|(f, n)| format!("{f} {n}"))
        .collect();
    let injected: Vec<String> = tally
        .injected
        .iter()
        .map(|(f, n)| format!("{f} {n}"))
        .collect();
    println!(
        "crash: {} kills in {:.0} s ({} at random, at failpoints: {}; {} armed but not reached \
         in their round, {} never), \
         {} statements acknowledged, in doubt: {} applied, {} not; transaction blocks: {} \
         committed, {} rolled back, in doubt: {} applied, {} not; large statements: {} \
         acknowledged, in doubt: {} applied, {} not; conflicting blocks: {} committed, {} \
         refused with 40001, {} rolled back, in doubt: {} applied, {} not; {} checks of every \
         view, sink target and \
         table against PostgreSQL; {} changes to the CDC and Kafka upstreams; I/O errors \
         injected in {} rounds ({}), {} statements refused for them",
        tally.kills_random + tally.fired.values().sum::<u64>(),
        started.elapsed().as_secs_f64(),
        tally.kills_random,
        if fired.is_empty() {
            "none".into()
        } else {
            fired.join(", ")
        },
        tally.not_reached,
        tally.unreached.len(),
        tally.acknowledged,
        tally.in_doubt_applied,
        tally.in_doubt_not_applied,
        tally.blocks_committed,
        tally.blocks_rolled_back,
        tally.blocks_in_doubt_applied,
        tally.blocks_in_doubt_not_applied,
        tally.large_acknowledged,
        tally.large_in_doubt_applied,
        tally.large_in_doubt_not_applied,
        tally.hot.committed,
        tally.hot.conflicts,
        tally.hot.rolled_back,
        tally.hot.in_doubt_applied,
        tally.hot.in_doubt_not_applied,
        tally.checks,
        tally.upstream_changes,
        tally.injected.values().sum::<u64>(),
        injected.join(", "),
        tally.refused,
    );
    drop(own_server);
    match result {
        Ok(()) => {
            println!("crash: passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crash: FAILED: {e}");
            print_log_tail(&work.join("weir.log"));
            if args.keep.is_none() {
                let kept = dir.keep();
                eprintln!(
                    "crash: the data directory and log are kept in {}",
                    kept.display()
                );
            }
            ExitCode::FAILURE
        }
    }
}

/// What a run carries from round to round.
struct Run {
    models: Vec<Model>,
    /// The block writer, between rounds.
    blocks: Option<Blocks>,
    blocks_in_doubt: Vec<InDoubt>,
    /// The large writer, between rounds.
    large: Option<Large>,
    large_in_doubt: Option<large::Statement>,
    /// The conflicting writer's sessions, between rounds.
    hot: Option<Hot>,
    /// The views compared with PostgreSQL after every restart.
    views: Vec<String>,
    /// Views created by a round, dropped by a later one.
    later: Vec<String>,
    in_doubt: Vec<Statement>,
    /// Views whose creation met an injected catalog fault: they must never exist.
    refused: Vec<String>,
    upstreams: Upstreams,
    sinks: Sinks,
    database: String,
    kills: u64,
    round: u64,
}

async fn run(args: &Args, conn: &str, work: &Path, tally: &mut Tally) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    let config = work.join("weir.toml");
    std::fs::write(
        &config,
        "barrier_interval_ms = 100\n\
         [checkpoint]\ninterval_ms = 300\nmin_pause_ms = 0\nretained = 2\nmax_deltas = 4\n\
         delta_part_bytes = 4096\n",
    )
    .map_err(|e| e.to_string())?;
    let admin = connect(conn).await?;
    let db_name = format!("crash_{}", args.seed);
    let pg_conn = format!("{conn} dbname={db_name}");
    let upstreams = Upstreams::start(args.seed).await?;
    let sinks = Sinks::start(upstreams.broker(), work).await?;
    // A logical slot holds its database: a slot an earlier run left goes first.
    drop_slot(&admin, upstreams.slot()).await?;
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"),
    )
    .await?;
    exec(&admin, &format!("CREATE DATABASE {db_name}")).await?;
    let pg = connect(&pg_conn).await?;
    let launcher = Launcher {
        weir: args.weir.clone(),
        data: work.join("data"),
        config,
        log: work.join("weir.log"),
    };

    let mut rng = Rng::new(args.seed);
    let mut run = Run {
        models: vec![
            Model::new("t1", args.seed.wrapping_mul(31) + 1),
            Model::new("t2", args.seed.wrapping_mul(31) + 2),
        ],
        blocks: Some(Blocks::new(args.seed.wrapping_mul(31) + 3)),
        blocks_in_doubt: Vec::new(),
        large: Some(Large::new(args.seed.wrapping_mul(31) + 4)),
        large_in_doubt: None,
        hot: Some(Hot::new(args.seed.wrapping_mul(31) + 5)),
        views: VIEWS
            .iter()
            .chain(hot::VIEWS)
            .map(|(n, _)| n.to_string())
            .collect(),
        later: Vec::new(),
        in_doubt: Vec::new(),
        refused: Vec::new(),
        upstreams,
        sinks,
        database: db_name.clone(),
        kills: 0,
        round: 0,
    };
    // Past its kills, a run goes on until every failpoint has been armed (and retried when
    // it was not reached).
    let mut arming = Arming::default();
    while run.kills < args.kills || !arming.settled() {
        let armed = Armed::for_round(run.round, &mut rng, &mut arming);
        let log_from = launcher.log_len();
        if round(&launcher, &pg, &pg_conn, &armed, &mut run, &mut rng, tally).await? {
            run.kills += 1;
        }
        if let Some(fault) = armed.io_fault {
            let met = format!("failpoint {}: failing with errno", fault_point(fault));
            if launcher.logged_since(log_from, &met)? {
                arming.reached(fault);
            }
        }
        for name in tally.fired.keys() {
            arming.reached(name);
        }
        run.round += 1;
    }
    tally.unreached = arming.unreached();
    let mut server = launcher
        .start(None)
        .await?
        .ok_or("the server aborted at a start with no failpoint armed")?;
    let weir = server.connect().await?;
    resolve(&weir, &pg, &mut run, tally).await?;
    check(&weir, &pg, &run.views, tally).await?;
    tally.checks += run.upstreams.converge(&weir, &pg).await?;
    tally.checks += run.sinks.converge(&weir, &pg).await?;
    tally.upstream_changes = run.upstreams.changes();
    drop(weir);
    server.stop().await?;
    drop(pg);
    drop_slot(&admin, run.upstreams.slot()).await?;
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"),
    )
    .await?;
    match tally.unreached.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "failpoints armed and never reached (list one in armed.rs's CONDITIONAL, with \
             why, only if the crash test cannot reach it): {}",
            tally.unreached.join(", ")
        )),
    }
}

/// Drops replication slot `slot` if it exists (its walsender may take a moment to let go).
async fn drop_slot(admin: &Client, slot: &str) -> Result<(), String> {
    for _ in 0..100 {
        let active = rows(
            admin,
            &format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"),
        )
        .await?;
        match active
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .as_deref()
        {
            None => return Ok(()),
            Some("f") => {
                return exec(admin, &format!("SELECT pg_drop_replication_slot('{slot}')")).await
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Err(format!("replication slot {slot} stays active"))
}

/// One round: a start (killed at random during it, or aborted by a recovery failpoint, now
/// and then), the last round's statements resolved and the views checked, and writers until
/// the server dies. Returns whether the round ended in a death that counts as a kill (the
/// extra kills during a start are counted in `run.kills` here).
async fn round(
    launcher: &Launcher,
    pg: &Client,
    pg_conn: &str,
    armed: &Armed,
    run: &mut Run,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<bool, String> {
    if let Some(fault) = armed.io_fault {
        *tally.injected.entry(fault).or_default() += 1;
    }
    if armed.failpoint == Some("recovery.during_download") {
        // A lost state directory: the restore downloads every file.
        let state = launcher.data.join("state");
        if state.exists() {
            std::fs::remove_dir_all(&state).map_err(|e| e.to_string())?;
        }
    }
    if armed.failpoint.is_none() && run.round % 4 == 2 {
        // A kill at a random moment of the restart itself.
        launcher
            .start_and_kill(Duration::from_millis(rng.below(400)))
            .await?;
        tally.kills_random += 1;
        run.kills += 1;
    }
    let mut server = match launcher.start(armed.spec.as_deref()).await? {
        Some(server) => server,
        None => {
            // A recovery failpoint aborted the start: a crash during recovery. Recover again.
            *tally
                .fired
                .entry(armed.failpoint.unwrap_or_default())
                .or_default() += 1;
            run.kills += 1;
            launcher
                .start(None)
                .await?
                .ok_or("the server aborted at a start with no failpoint armed")?
        }
    };
    // With a checkpoint failpoint armed, the server may die at any moment from here on:
    // while the last round's statements are resolved and the views checked, too.
    let ready = async {
        let weir = server.connect().await?;
        ready(&weir, pg, pg_conn, armed, run, tally).await
    }
    .await;
    if let Err(e) = ready {
        return match (server.exited().await?, armed.after_start()) {
            (Some(Death::Aborted), Some(name)) => {
                *tally.fired.entry(name).or_default() += 1;
                Ok(true)
            }
            // The state store's fault came during the check: its views refuse reads as a
            // full disk (53100) until the restart, after which the next round checks them.
            (None, None)
                if armed.io_fault.is_some_and(|f| f.starts_with("state."))
                    && e.contains(": 53100: ") =>
            {
                server.wait_or_kill(Duration::ZERO).await?;
                tally.kills_random += 1;
                Ok(true)
            }
            _ => Err(e),
        };
    }
    write_until_death(&mut server, pg_conn, armed, run, rng, tally).await?;
    Ok(true)
}

/// After a start: the schema and views at the first round, the last round's statements in
/// doubt resolved, every view checked, and the round's DDL.
async fn ready(
    weir: &Client,
    pg: &Client,
    pg_conn: &str,
    armed: &Armed,
    run: &mut Run,
    tally: &mut Tally,
) -> Result<(), String> {
    if run.round == 0 {
        for sql in SCHEMA.iter().chain(hot::SCHEMA) {
            exec_both(weir, pg, sql, sql).await?;
        }
        for (name, query) in VIEWS.iter().chain(hot::VIEWS) {
            create_view(weir, pg, name, query).await?;
        }
        let database = run.database.clone();
        run.upstreams.create(weir, pg, pg_conn, &database).await?;
        run.sinks.create(weir, pg_conn, &database).await?;
    }
    resolve(weir, pg, run, tally).await?;
    check(weir, pg, &run.views, tally).await?;
    tally.checks += run.upstreams.converge(weir, pg).await?;
    tally.checks += run.sinks.converge(weir, pg).await?;
    // DDL only where the server cannot die during it, so that it is never in doubt.
    if armed.after_start().is_none() && armed.io_fault.is_none() && run.round % 4 == 2 {
        change_views(weir, pg, run.round, &mut run.views, &mut run.later).await?;
    }
    if armed.io_fault.is_some_and(|f| f.starts_with("catalog.")) {
        refuse_view(weir, run.round, &mut run.refused).await?;
    }
    // A refused view never came to be, in this run or any later one.
    for name in &run.refused {
        let sql = format!("SELECT count(*) FROM weir_catalog.views WHERE name = '{name}'");
        let found = rows(weir, &sql).await?;
        if found != [vec![Some("0".to_string())]] {
            return Err(format!("view {name}, refused, exists"));
        }
    }
    Ok(())
}

/// The writers run until the server dies under them: at the armed failpoint, or killed at a
/// random moment (also when the failpoint is not reached in time).
async fn write_until_death(
    server: &mut Server,
    pg_conn: &str,
    armed: &Armed,
    run: &mut Run,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<(), String> {
    let foreign_ids = run.models[0].next_id;
    let weir = server.conn_string();
    let mut writers = Vec::new();
    for mut model in run.models.drain(..) {
        model.foreign_ids = foreign_ids;
        let pg = connect(pg_conn).await?;
        writers.push(tokio::spawn(write_until_failure(weir.clone(), pg, model)));
    }
    let blocks = run.blocks.take().ok_or("the block writer is missing")?;
    let transactor = {
        let pg = connect(pg_conn).await?;
        tokio::spawn(transact_until_failure(
            weir.clone(),
            pg,
            blocks,
            foreign_ids,
        ))
    };
    let large = run.large.take().ok_or("the large writer is missing")?;
    let large = {
        let pg = connect(pg_conn).await?;
        tokio::spawn(write_until_failure(weir.clone(), pg, large))
    };
    let hot = run.hot.take().ok_or("the conflicting writer is missing")?;
    let hot = hot.start(&weir, pg_conn).await?;
    let upstream = run.upstreams.write(pg_conn).await?;
    let wait = match armed.after_start() {
        Some(_) => Duration::from_secs(10),
        None => Duration::from_millis(rng.below(2500)),
    };
    let death = server.wait_or_kill(wait).await?;
    run.upstreams.stop(upstream).await?;
    match (death, armed.after_start()) {
        (Death::Aborted, Some(name)) => *tally.fired.entry(name).or_default() += 1,
        (Death::Killed, Some(_)) => {
            tally.not_reached += 1;
            tally.kills_random += 1;
        }
        (Death::Killed, None) => tally.kills_random += 1,
        (Death::Aborted, None) => {
            return Err("the server aborted with no failpoint armed".into());
        }
    }
    for writer in writers {
        let (model, outcome) = writer.await.map_err(|e| format!("writer: {e}"))?;
        run.models.push(model);
        let outcome = outcome?;
        tally.acknowledged += outcome.acknowledged;
        tally.refused += outcome.refused;
        run.in_doubt.extend(outcome.in_doubt);
    }
    let (blocks, outcome) = transactor.await.map_err(|e| format!("block writer: {e}"))?;
    run.blocks = Some(blocks);
    let outcome = outcome?;
    tally.blocks_committed += outcome.committed;
    tally.blocks_rolled_back += outcome.rolled_back;
    tally.refused += outcome.refused;
    run.blocks_in_doubt.extend(outcome.in_doubt);
    let (large, outcome) = large.await.map_err(|e| format!("large writer: {e}"))?;
    run.large = Some(large);
    let outcome = outcome?;
    tally.large_acknowledged += outcome.acknowledged;
    tally.refused += outcome.refused;
    run.large_in_doubt = outcome.in_doubt;
    run.hot = Some(hot.finish(&mut tally.hot, &mut tally.refused).await?);
    run.models.sort_by_key(|m| m.table);
    Ok(())
}

/// Creates view `name` over `query` in both: a materialized view in Weir, the plain view it
/// must equal in PostgreSQL.
async fn create_view(weir: &Client, pg: &Client, name: &str, query: &str) -> Result<(), String> {
    exec_both(
        weir,
        pg,
        &format!("CREATE MATERIALIZED VIEW {name} AS {query}"),
        &format!("CREATE VIEW {name} AS {query}"),
    )
    .await
}

async fn exec_both(weir: &Client, pg: &Client, weir_sql: &str, pg_sql: &str) -> Result<(), String> {
    exec(weir, weir_sql)
        .await
        .map_err(|e| format!("weir: {weir_sql}: {e}"))?;
    exec(pg, pg_sql)
        .await
        .map_err(|e| format!("postgres: {pg_sql}: {e}"))
}

/// Creates a view while catalog saves fail: the statement must be refused with an I/O error's
/// code, and the view must not exist.
async fn refuse_view(weir: &Client, round: u64, refused: &mut Vec<String>) -> Result<(), String> {
    let name = format!("refused_{round}");
    let sql = format!("CREATE MATERIALIZED VIEW {name} AS {}", LATER_VIEWS[0]);
    match weir.batch_execute(&sql).await {
        Ok(()) => Err(format!("{sql}: accepted while catalog saves fail")),
        Err(e) => match e.code().map(|c| c.code()) {
            Some(code) if io_refusal(code) => {
                refused.push(name);
                Ok(())
            }
            _ => Err(format!("{sql}: {e}")),
        },
    }
}

/// Creates the next of the later views, and drops the oldest once more than two exist.
async fn change_views(
    weir: &Client,
    pg: &Client,
    round: u64,
    views: &mut Vec<String>,
    later: &mut Vec<String>,
) -> Result<(), String> {
    let name = format!("later_{round}");
    let query = LATER_VIEWS[(round as usize / 3) % LATER_VIEWS.len()];
    create_view(weir, pg, &name, query).await?;
    views.push(name.clone());
    later.push(name);
    if later.len() > 2 {
        let old = later.remove(0);
        exec_both(
            weir,
            pg,
            &format!("DROP MATERIALIZED VIEW {old}"),
            &format!("DROP VIEW {old}"),
        )
        .await?;
        views.retain(|v| *v != old);
    }
    Ok(())
}

/// A writer of single statements (`Model`, `Large`): what it sends next, and what it does
/// once Weir has acknowledged one.
trait Writer: Send + 'static {
    type Statement: Send;
    /// How long a statement may go unanswered before the run fails.
    const ANSWER_WITHIN: Duration;
    /// What the writer's session sets before its first statement, if anything.
    const SETTINGS: Option<&'static str> = None;
    fn next_statement(&mut self) -> Self::Statement;
    fn sql(statement: &Self::Statement) -> &str;
    fn acknowledged(&mut self, statement: &Self::Statement);
}

impl Writer for Model {
    type Statement = Statement;
    const ANSWER_WITHIN: Duration = Duration::from_secs(60);

    fn next_statement(&mut self) -> Statement {
        self.next()
    }

    fn sql(statement: &Statement) -> &str {
        &statement.sql
    }

    fn acknowledged(&mut self, statement: &Statement) {
        self.apply(&statement.change);
    }
}

/// What a writer did before the server died under it.
struct Outcome<S> {
    acknowledged: u64,
    /// Statements refused because of an injected I/O error.
    refused: u64,
    /// The statement the death interrupted, if it was sending one.
    in_doubt: Option<S>,
}

/// Connects to Weir at `conn` and sends the writer's statements one at a time, each
/// acknowledged one to PostgreSQL too, until Weir's connection breaks. A server that died
/// before the connection was made (an early kill or failpoint) got no statement.
async fn write_until_failure<W: Writer>(
    conn: String,
    pg: Client,
    mut writer: W,
) -> (W, Result<Outcome<W::Statement>, String>) {
    let mut outcome = Outcome {
        acknowledged: 0,
        refused: 0,
        in_doubt: None,
    };
    let Ok(weir) = connect(&conn).await else {
        return (writer, Ok(outcome));
    };
    if let Some(settings) = W::SETTINGS {
        if weir.batch_execute(settings).await.is_err() {
            return (writer, Ok(outcome)); // the server is gone already
        }
    }
    loop {
        let statement = writer.next_statement();
        let sql = W::sql(&statement);
        let answer = tokio::time::timeout(W::ANSWER_WITHIN, weir.simple_query(sql)).await;
        match answer {
            Err(_) => {
                let within = W::ANSWER_WITHIN.as_secs();
                let e = format!("weir: no answer within {within} s to {sql}");
                return (writer, Err(e));
            }
            Ok(Ok(_)) => {
                if let Err(e) = exec(&pg, sql).await {
                    return (writer, Err(format!("postgres: {sql}: {e}")));
                }
                writer.acknowledged(&statement);
                outcome.acknowledged += 1;
            }
            // An injected I/O error: refused, so not applied anywhere.
            Ok(Err(e)) if e.code().is_some_and(|c| io_refusal(c.code())) => outcome.refused += 1,
            // A transaction block's commit met the injected error between its tables' logs:
            // they refuse writes (not applied) until the restart applies it. Wait for the kill.
            Ok(Err(e)) if e.code().is_some_and(|c| c.code() == "08007") => {
                outcome.refused += 1;
                until_death(&weir).await;
                return (writer, Ok(outcome));
            }
            // Refused by the server: the writer never sends what should be refused.
            Ok(Err(e)) if e.as_db_error().is_some() => {
                let e = format!("weir refused {sql}: {}", describe(e));
                return (writer, Err(e));
            }
            // The connection broke: the server died with the statement in doubt.
            Ok(Err(_)) => {
                outcome.in_doubt = Some(statement);
                return (writer, Ok(outcome));
            }
        }
    }
}

/// Returns once the server behind `weir` no longer answers.
async fn until_death(weir: &Client) {
    while weir.simple_query("SELECT 1").await.is_ok() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
