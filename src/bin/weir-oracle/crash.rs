//! `weir-oracle crash`: exactly-once results across crashes (`docs/design/0004-recovery.md`).
//!
//! Runs the `weir` binary as a child process with checkpoints every few hundred milliseconds,
//! two writers changing two tables, and views over them; kills the server again and again,
//! alternately with `SIGKILL` at a random moment and by arming one failpoint
//! (`WEIR_FAILPOINTS`, debug builds) of the checkpoint, table and recovery paths, so that the
//! process aborts exactly there, or one I/O error of the change log (a full disk, a failed
//! fsync), which the statements that meet it must be refused for, leaving nothing behind.
//! Every acknowledged statement is applied to PostgreSQL too.
//! A statement the kill interrupted is in doubt: after the restart, Weir's table says whether
//! it was applied (all of it or none: anything else is a failure), and PostgreSQL follows.
//! After every restart and at the end, every view and table is compared with PostgreSQL:
//! a missing or a duplicated change fails the run.
//!
//! Usage: `weir-oracle crash [--kills N] [--seed S] [--pg CONN] [--weir PATH] [--keep DIR]`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use weir::rng::Rng;

use crate::replay::{connect, describe, difference, exec, float_columns, rows};

/// The failpoints armed in turn, every other kill.
const FAILPOINTS: &[&str] = &[
    "checkpoint.before_upload",
    "checkpoint.between_uploads",
    "checkpoint.before_manifest",
    "checkpoint.after_manifest",
    "checkpoint.during_expiry",
    "table.after_append",
    "table.log_truncated",
    "recovery.during_download",
    "recovery.before_swap",
    "recovery.between_renames",
    "recovery.after_swap",
    // I/O errors, injected rather than fatal: the writers' statements that meet them are
    // refused (53100, 53000, 58030) and must leave nothing behind, before a kill at random.
    "changelog.write:enospc",
    "changelog.sync:eio",
    "changelog.sync:emfile",
    "changelog.write:enospc+cut_back",
    // The state store's writes (a RocksDB flush or write on a full disk): every actor stops,
    // tables refuse writes (53100) until the restart.
    "state.write:enospc",
    // Checkpoint uploads: the checkpoint fails, nothing else does.
    "checkpoint.put:eio",
    // Catalog saves: the round's DDL is refused (53100) and leaves nothing behind.
    "catalog.save:enospc",
];

/// The `WEIR_FAILPOINTS` value that injects the I/O error named `fault` (an entry of
/// `FAILPOINTS` with a `:`) from its `at`-th hit on, for a few hits.
fn io_fault_spec(fault: &str, at: u64) -> String {
    let (point, kind) = fault.split_once(':').unwrap_or((fault, "eio"));
    let until = at + 3;
    match kind.split_once('+') {
        // A failed write whose cut-back fails too: the next append cuts back first.
        Some((kind, "cut_back")) => {
            format!("{point}@{at}..{until}:{kind},changelog.cut_back@1:eio")
        }
        _ => format!("{point}@{at}..{until}:{kind}"),
    }
}

/// Whether a statement Weir refused met an injected I/O error (and so was not applied).
fn io_refusal(code: &str) -> bool {
    matches!(code, "53100" | "53000" | "58030")
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE t1 (id bigint PRIMARY KEY, g int NOT NULL, v bigint, n numeric(12,2), s text)",
    "CREATE TABLE t2 (id bigint, k bigint, w bigint)",
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
];

/// Rows a writer's table grows to before its deletes outpace its inserts.
const ROWS_SOFT_MAX: usize = 2000;

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

/// One statement a writer sent, and how to tell afterwards whether Weir applied it.
#[derive(Debug, Clone)]
struct Statement {
    sql: String,
    table: &'static str,
    change: Change,
}

#[derive(Debug, Clone)]
enum Change {
    Insert(Vec<Row>),
    Delete(Vec<i64>),
    /// Row `id` gets the never-used value `to` in its value column (`v` or `w`).
    Update {
        id: i64,
        to: i64,
    },
}

#[derive(Debug, Clone)]
struct Row {
    id: i64,
    value: i64,
}

/// What one writer believes its table holds: the id and value column of every row. Its rows
/// are the acknowledged ones, and the in-doubt ones once resolved.
struct Model {
    table: &'static str,
    rows: BTreeMap<i64, i64>,
    rng: Rng,
    /// Ids and values are never reused, so a row's presence and an update's value tell
    /// whether a statement was applied.
    next_id: i64,
    next_value: i64,
    /// The largest id the other table has issued: `t2.k` points into `t1`'s ids.
    foreign_ids: i64,
}

impl Model {
    fn new(table: &'static str, seed: u64) -> Model {
        Model {
            table,
            rows: BTreeMap::new(),
            rng: Rng::new(seed),
            next_id: 1,
            next_value: 1000,
            foreign_ids: 1,
        }
    }

    fn fresh_value(&mut self) -> i64 {
        self.next_value += 1 + self.rng.below(3) as i64;
        self.next_value
    }

    fn existing(&mut self) -> Option<i64> {
        if self.rows.is_empty() {
            return None;
        }
        let i = self.rng.below(self.rows.len() as u64) as usize;
        self.rows.keys().nth(i).copied()
    }

    fn next(&mut self) -> Statement {
        let roll = self.rng.below(100);
        let table = self.table;
        // A bounded table keeps every round about as fast as the first, however long the run:
        // past ROWS_SOFT_MAX rows, fewer inserts and longer deletes shrink it.
        let large = self.rows.len() > ROWS_SOFT_MAX;
        let (insert_below, update_below) = if large { (25, 60) } else { (55, 80) };
        if roll < insert_below || self.rows.len() < 5 {
            let n = 1 + self.rng.below(4) as usize;
            let mut rows = Vec::new();
            let mut values = Vec::new();
            for _ in 0..n {
                let id = self.next_id;
                self.next_id += 1;
                let (value, text) = if table == "t1" {
                    let value = self.fresh_value();
                    let g = self.rng.below(7);
                    let n = format!("{}.{:02}", self.rng.below(1000), self.rng.below(100));
                    let s = ["'a'", "'b'", "'c'", "'dd'", "NULL"][self.rng.below(5) as usize];
                    (value, format!("({id}, {g}, {value}, {n}, {s})"))
                } else {
                    let value = self.rng.below(100) as i64;
                    let k = 1 + self.rng.below(self.foreign_ids.max(1) as u64 + 3) as i64;
                    (value, format!("({id}, {k}, {value})"))
                };
                rows.push(Row { id, value });
                values.push(text);
            }
            return Statement {
                sql: format!("INSERT INTO {table} VALUES {}", values.join(", ")),
                table,
                change: Change::Insert(rows),
            };
        }
        let column = if table == "t1" { "v" } else { "w" };
        let id = self.existing().unwrap_or(0);
        if roll < update_below {
            let to = self.fresh_value();
            let also = if table == "t1" && self.rng.chance(50) {
                format!(", g = {}", self.rng.below(7))
            } else {
                String::new()
            };
            return Statement {
                sql: format!("UPDATE {table} SET {column} = {to}{also} WHERE id = {id}"),
                table,
                change: Change::Update { id, to },
            };
        }
        let mut ids = vec![id];
        let more = if large {
            1 + self.rng.below(4)
        } else {
            u64::from(self.rng.chance(30))
        };
        for _ in 0..more {
            if let Some(other) = self.existing().filter(|o| !ids.contains(o)) {
                ids.push(other);
            }
        }
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        Statement {
            sql: format!("DELETE FROM {table} WHERE id IN ({})", list.join(", ")),
            table,
            change: Change::Delete(ids),
        }
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Insert(rows) => {
                for r in rows {
                    self.rows.insert(r.id, r.value);
                }
            }
            Change::Delete(ids) => {
                for id in ids {
                    self.rows.remove(id);
                }
            }
            Change::Update { id, to } => {
                self.rows.insert(*id, *to);
            }
        }
    }
}

/// The counts the run reports.
#[derive(Default)]
struct Tally {
    kills_random: u64,
    /// Failpoints that aborted the server, by name.
    fired: BTreeMap<&'static str, u64>,
    /// Armed failpoints the server never reached before it was killed at random instead.
    not_reached: u64,
    /// Rounds with an I/O error injected, by fault.
    injected: BTreeMap<&'static str, u64>,
    /// Statements refused because of an injected I/O error (not applied).
    refused: u64,
    acknowledged: u64,
    in_doubt_applied: u64,
    in_doubt_not_applied: u64,
    checks: u64,
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
        "crash: {} kills in {:.0} s ({} at random, at failpoints: {}; {} armed but not reached), \
         {} statements acknowledged, in doubt: {} applied, {} not; {} checks of every view and \
         table against PostgreSQL; I/O errors injected in {} rounds ({}), {} statements refused \
         for them",
        tally.kills_random + tally.fired.values().sum::<u64>(),
        started.elapsed().as_secs_f64(),
        tally.kills_random,
        if fired.is_empty() {
            "none".into()
        } else {
            fired.join(", ")
        },
        tally.not_reached,
        tally.acknowledged,
        tally.in_doubt_applied,
        tally.in_doubt_not_applied,
        tally.checks,
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

async fn run(args: &Args, conn: &str, work: &Path, tally: &mut Tally) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| e.to_string())?;
    let config = work.join("weir.toml");
    std::fs::write(
        &config,
        "barrier_interval_ms = 100\n\
         [checkpoint]\ninterval_ms = 300\nmin_pause_ms = 0\nretained = 2\nmax_deltas = 4\n",
    )
    .map_err(|e| e.to_string())?;
    let admin = connect(conn).await?;
    let db_name = format!("crash_{}", args.seed);
    let pg_conn = format!("{conn} dbname={db_name}");
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
    let mut models = vec![
        Model::new("t1", args.seed.wrapping_mul(31) + 1),
        Model::new("t2", args.seed.wrapping_mul(31) + 2),
    ];
    let mut views: Vec<String> = VIEWS.iter().map(|(n, _)| n.to_string()).collect();
    let mut later: Vec<String> = Vec::new();
    let mut in_doubt: Vec<Statement> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    let mut kills = 0;
    let mut round: u64 = 0;
    while kills < args.kills {
        // Every other round arms the next failpoint, at one of its first few hits.
        let armed = (round % 2 == 1).then(|| FAILPOINTS[(round as usize / 2) % FAILPOINTS.len()]);
        let io_fault = armed.filter(|name| name.contains(':'));
        let armed = armed.filter(|name| !name.contains(':'));
        let spec = match (armed, io_fault) {
            // A catalog is saved only by DDL: from its first save on.
            (_, Some(fault)) if fault.starts_with("catalog.") => Some(io_fault_spec(fault, 1)),
            (_, Some(fault)) => Some(io_fault_spec(fault, 1 + rng.below(20))),
            (Some(name), None) => {
                let at = if name.starts_with("recovery.") {
                    1
                } else {
                    1 + rng.below(3)
                };
                Some(format!("{name}@{at}"))
            }
            (None, None) => None,
        };
        if let Some(fault) = io_fault {
            *tally.injected.entry(fault).or_default() += 1;
        }
        if armed == Some("recovery.during_download") {
            // A lost state directory: the restore downloads every file.
            let state = launcher.data.join("state");
            if state.exists() {
                std::fs::remove_dir_all(&state).map_err(|e| e.to_string())?;
            }
        }
        if armed.is_none() && round % 4 == 2 {
            // A kill at a random moment of the restart itself.
            launcher
                .start_and_kill(Duration::from_millis(rng.below(400)))
                .await?;
            tally.kills_random += 1;
            kills += 1;
        }
        let mut server = match launcher.start(spec.as_deref()).await? {
            Some(server) => server,
            None => {
                // A recovery failpoint aborted the start: a crash during recovery. Recover
                // again.
                *tally.fired.entry(armed.unwrap_or_default()).or_default() += 1;
                kills += 1;
                launcher
                    .start(None)
                    .await?
                    .ok_or("the server aborted at a start with no failpoint armed")?
            }
        };
        let armed_later = armed.filter(|n| !n.starts_with("recovery."));
        // With a checkpoint failpoint armed, the server may die at any moment from here on:
        // while the last round's statements are resolved and the views checked, too.
        let ready = async {
            let weir = server.connect().await?;
            if round == 0 {
                for sql in SCHEMA {
                    exec_both(&weir, &pg, sql, sql).await?;
                }
                for (name, query) in VIEWS {
                    exec_both(
                        &weir,
                        &pg,
                        &format!("CREATE MATERIALIZED VIEW {name} AS {query}"),
                        &format!("CREATE VIEW {name} AS {query}"),
                    )
                    .await?;
                }
            }
            resolve(&weir, &pg, &mut models, &mut in_doubt, tally).await?;
            check(&weir, &pg, &views, tally).await?;
            // DDL only where the server cannot die during it, so that it is never in doubt.
            if armed_later.is_none() && io_fault.is_none() && round % 4 == 2 {
                change_views(&weir, &pg, round, &mut views, &mut later).await?;
            }
            if io_fault.is_some_and(|f| f.starts_with("catalog.")) {
                refuse_view(&weir, round, &mut refused).await?;
            }
            // A refused view never came to be, in this run or any later one.
            for name in &refused {
                let sql = format!("SELECT count(*) FROM weir_catalog.views WHERE name = '{name}'");
                let found = rows(&weir, &sql).await?;
                if found != [vec![Some("0".to_string())]] {
                    return Err(format!("view {name}, refused, exists"));
                }
            }
            Ok::<(), String>(())
        }
        .await;
        if let Err(e) = ready {
            match (server.exited().await?, armed_later) {
                (Some(Death::Aborted), Some(name)) => {
                    *tally.fired.entry(name).or_default() += 1;
                    kills += 1;
                    round += 1;
                    continue;
                }
                // The state store's fault came during the check: its views refuse reads as a
                // full disk (53100) until the restart, after which the next round checks them.
                (None, None)
                    if io_fault.is_some_and(|f| f.starts_with("state."))
                        && e.contains(": 53100: ") =>
                {
                    server.wait_or_kill(Duration::ZERO).await?;
                    tally.kills_random += 1;
                    kills += 1;
                    round += 1;
                    continue;
                }
                _ => return Err(e),
            }
        }

        // The writers run until the server dies under them: at the armed failpoint, or
        // killed at a random moment (also when the failpoint is not reached in time).
        let foreign_ids = models[0].next_id;
        let mut writers = Vec::new();
        for mut model in models.drain(..) {
            model.foreign_ids = foreign_ids;
            let pg = connect(&pg_conn).await?;
            let weir = format!("host=127.0.0.1 port={} user=crash dbname=weir", server.port);
            writers.push(tokio::spawn(write_until_failure(weir, pg, model)));
        }
        let wait = match armed_later {
            Some(_) => Duration::from_secs(10),
            None => Duration::from_millis(rng.below(2500)),
        };
        let death = server.wait_or_kill(wait).await?;
        match (death, armed_later) {
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
        kills += 1;
        for writer in writers {
            let (model, outcome) = writer.await.map_err(|e| format!("writer: {e}"))?;
            models.push(model);
            let outcome = outcome?;
            tally.acknowledged += outcome.acknowledged;
            tally.refused += outcome.refused;
            in_doubt.extend(outcome.in_doubt);
        }
        models.sort_by_key(|m| m.table);
        round += 1;
    }
    let mut server = launcher
        .start(None)
        .await?
        .ok_or("the server aborted at a start with no failpoint armed")?;
    let weir = server.connect().await?;
    resolve(&weir, &pg, &mut models, &mut in_doubt, tally).await?;
    check(&weir, &pg, &views, tally).await?;
    drop(weir);
    server.stop().await?;
    drop(pg);
    exec(
        &admin,
        &format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"),
    )
    .await?;
    Ok(())
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
    exec_both(
        weir,
        pg,
        &format!("CREATE MATERIALIZED VIEW {name} AS {query}"),
        &format!("CREATE VIEW {name} AS {query}"),
    )
    .await?;
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

/// What a writer did before the server died under it.
struct Outcome {
    acknowledged: u64,
    /// Statements refused because of an injected I/O error.
    refused: u64,
    /// The statement the death interrupted, if it was sending one.
    in_doubt: Option<Statement>,
}

/// Connects to Weir at `conn` and sends the model's statements one at a time, each
/// acknowledged one to PostgreSQL too, until Weir's connection breaks. A server that died
/// before the connection was made (an early kill or failpoint) got no statement.
async fn write_until_failure(
    conn: String,
    pg: Client,
    mut model: Model,
) -> (Model, Result<Outcome, String>) {
    let Ok(weir) = connect(&conn).await else {
        let outcome = Outcome {
            acknowledged: 0,
            refused: 0,
            in_doubt: None,
        };
        return (model, Ok(outcome));
    };
    let (mut acknowledged, mut refused) = (0, 0);
    loop {
        let statement = model.next();
        let answer =
            tokio::time::timeout(Duration::from_secs(60), weir.simple_query(&statement.sql)).await;
        match answer {
            Err(_) => {
                let e = format!("weir: no answer within 60 s to {}", statement.sql);
                return (model, Err(e));
            }
            Ok(Ok(_)) => {
                if let Err(e) = exec(&pg, &statement.sql).await {
                    return (model, Err(format!("postgres: {}: {e}", statement.sql)));
                }
                model.apply(&statement.change);
                acknowledged += 1;
            }
            // An injected I/O error: refused, so not applied anywhere.
            Ok(Err(e)) if e.code().is_some_and(|c| io_refusal(c.code())) => refused += 1,
            // Refused by the server: the writer never sends what should be refused.
            Ok(Err(e)) if e.as_db_error().is_some() => {
                let e = format!("weir refused {}: {}", statement.sql, describe(e));
                return (model, Err(e));
            }
            // The connection broke: the server died with the statement in doubt.
            Ok(Err(_)) => {
                let outcome = Outcome {
                    acknowledged,
                    refused,
                    in_doubt: Some(statement),
                };
                return (model, Ok(outcome));
            }
        }
    }
}

/// Decides each in-doubt statement from what Weir's table holds after the restart: applied
/// whole (PostgreSQL and the model apply it too) or not at all.
async fn resolve(
    weir: &Client,
    pg: &Client,
    models: &mut [Model],
    in_doubt: &mut Vec<Statement>,
    tally: &mut Tally,
) -> Result<(), String> {
    exec(weir, "FLUSH").await?;
    // One at a time, so that those not yet decided stay in doubt if the server dies now.
    while let Some(statement) = in_doubt.first().cloned() {
        let Some(model) = models.iter_mut().find(|m| m.table == statement.table) else {
            return Err(format!("no writer for table {}", statement.table));
        };
        let column = if statement.table == "t1" { "v" } else { "w" };
        let ids: Vec<i64> = match &statement.change {
            Change::Insert(rows) => rows.iter().map(|r| r.id).collect(),
            Change::Delete(ids) => ids.clone(),
            Change::Update { id, .. } => vec![*id],
        };
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        let query = format!(
            "SELECT id, {column} FROM {} WHERE id IN ({})",
            statement.table,
            list.join(", ")
        );
        let found: BTreeMap<i64, Option<i64>> = rows(weir, &query)
            .await
            .map_err(|e| format!("weir: {query}: {e}"))?
            .into_iter()
            .map(|r| {
                let num = |i: usize| r.get(i).cloned().flatten().and_then(|t| t.parse().ok());
                (num(0).unwrap_or(-1), num(1))
            })
            .collect();
        let applied = match &statement.change {
            Change::Insert(rows) if found.is_empty() => {
                let _ = rows;
                false
            }
            Change::Insert(rows)
                if rows.len() == found.len()
                    && rows
                        .iter()
                        .all(|r| found.get(&r.id) == Some(&Some(r.value))) =>
            {
                true
            }
            Change::Delete(ids) if found.len() == ids.len() => false,
            Change::Delete(_) if found.is_empty() => true,
            Change::Update { id, to } if found.get(id) == Some(&Some(*to)) => true,
            Change::Update { id, .. } if found.get(id) == Some(&model.rows.get(id).copied()) => {
                false
            }
            _ => {
                return Err(format!(
                    "statement in doubt applied in part or wrongly: {}; weir holds {found:?}",
                    statement.sql
                ))
            }
        };
        if applied {
            exec(pg, &statement.sql)
                .await
                .map_err(|e| format!("postgres: {}: {e}", statement.sql))?;
            model.apply(&statement.change);
            tally.in_doubt_applied += 1;
        } else {
            tally.in_doubt_not_applied += 1;
        }
        in_doubt.remove(0);
    }
    Ok(())
}

/// Compares every view and both tables with PostgreSQL.
async fn check(
    weir: &Client,
    pg: &Client,
    views: &[String],
    tally: &mut Tally,
) -> Result<(), String> {
    exec(weir, "FLUSH").await?;
    for name in views.iter().map(String::as_str).chain(["t1", "t2"]) {
        let query = format!("SELECT * FROM {name}");
        let actual = rows(weir, &query)
            .await
            .map_err(|e| format!("weir: {query}: {e}"))?;
        let expected = rows(pg, &query)
            .await
            .map_err(|e| format!("postgres: {query}: {e}"))?;
        let floats = float_columns(pg, &query).await?;
        let (extra, missing) = difference(&actual, &expected, &floats);
        if !extra.is_empty() || !missing.is_empty() {
            let show = |rows: Vec<&crate::replay::Row>| -> String {
                let n = rows.len();
                let mut shown: Vec<String> = rows
                    .into_iter()
                    .take(10)
                    .map(|r| format!("{r:?}"))
                    .collect();
                if n > 10 {
                    shown.push(format!("... {} more", n - 10));
                }
                shown.join("\n    ")
            };
            return Err(format!(
                "{name} differs from PostgreSQL after a restart: {} rows only in weir, {} only \
                 in PostgreSQL\n  only in weir:\n    {}\n  only in PostgreSQL:\n    {}",
                extra.len(),
                missing.len(),
                show(extra),
                show(missing),
            ));
        }
        tally.checks += 1;
    }
    Ok(())
}

/// Starts the `weir` binary on one data directory, again and again.
struct Launcher {
    weir: PathBuf,
    data: PathBuf,
    config: PathBuf,
    /// Every start's output, appended.
    log: PathBuf,
}

enum Death {
    /// Ended by an armed failpoint (SIGABRT).
    Aborted,
    /// Killed with SIGKILL.
    Killed,
}

struct Server {
    child: Child,
    port: u16,
}

impl Launcher {
    /// Starts the server with `failpoints` armed and waits until it listens; `None` if it
    /// aborted at a failpoint first. Any other exit is an error.
    async fn start(&self, failpoints: Option<&str>) -> Result<Option<Server>, String> {
        let (mut child, port) = self.spawn(failpoints)?;
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return match aborted(status) {
                    true if failpoints.is_some() => Ok(None),
                    _ => Err(format!("the server exited while starting: {status}")),
                };
            }
            // The port is bound before recovery, which may still abort: ready means a
            // session that answers.
            if answers(port).await {
                return Ok(Some(Server { child, port }));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("the server did not listen within 300 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the server and kills it `after` later, whatever it is doing (restoring,
    /// replaying, or serving already).
    async fn start_and_kill(&self, after: Duration) -> Result<(), String> {
        let (mut child, _) = self.spawn(None)?;
        tokio::time::sleep(after).await;
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("the server exited while starting: {status}"));
        }
        child.kill().map_err(|e| format!("kill: {e}"))?;
        child.wait().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn spawn(&self, failpoints: Option<&str>) -> Result<(Child, u16), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let _ = writeln!(
            log,
            "=== start, WEIR_FAILPOINTS={}",
            failpoints.unwrap_or("")
        );
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.weir)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(["--streaming-parallelism", "2"])
            .env("WEIR_FAILPOINTS", failpoints.unwrap_or(""))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.weir.display()))?;
        Ok((child, port))
    }
}

async fn answers(port: u16) -> bool {
    let conn = format!("host=127.0.0.1 port={port} user=crash dbname=weir");
    let session = async {
        let client = connect(&conn).await.ok()?;
        client.simple_query("SELECT 1").await.ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), session).await,
        Ok(Some(_))
    )
}

fn aborted(status: ExitStatus) -> bool {
    status.signal() == Some(6)
}

impl Server {
    async fn connect(&self) -> Result<Client, String> {
        connect(&format!(
            "host=127.0.0.1 port={} user=crash dbname=weir",
            self.port
        ))
        .await
    }

    /// How the process ended, if it did (waiting a moment for a dying one to finish).
    async fn exited(&mut self) -> Result<Option<Death>, String> {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(aborted(status).then_some(Death::Aborted));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(None)
    }

    /// Waits for the process to end by itself for `wait`, then kills it.
    async fn wait_or_kill(&mut self, wait: Duration) -> Result<Death, String> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return match aborted(status) {
                    true => Ok(Death::Aborted),
                    false => Err(format!("the server exited by itself: {status}")),
                };
            }
            if Instant::now() >= deadline {
                self.child.kill().map_err(|e| format!("kill: {e}"))?;
                self.child.wait().map_err(|e| e.to_string())?;
                return Ok(Death::Killed);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A clean shutdown (SIGTERM), which must end with success.
    async fn stop(&mut self) -> Result<(), String> {
        // SAFETY: kill(2) on our own child process.
        unsafe { kill(self.child.id() as i32, 15) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return match status.success() {
                    true => Ok(()),
                    false => Err(format!("the server's shutdown ended with {status}")),
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("the server did not shut down within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

fn print_log_tail(log: &Path) {
    let Ok(file) = std::fs::File::open(log) else {
        return;
    };
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .collect();
    eprintln!("crash: the last lines of {}:", log.display());
    for line in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("  {line}");
    }
}
