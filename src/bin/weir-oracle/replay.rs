//! Runs a workload on a fresh Weir server and on a clean PostgreSQL schema, stopping at the
//! first difference: a view whose rows differ, or a statement that one server refuses and the
//! other accepts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use weir::config::Config;
use weir::db::Database;

use crate::workload::{Family, Step};

pub type Row = Vec<Option<String>>;

#[derive(Debug, Clone)]
pub enum Failure {
    Mismatch {
        view: String,
        family: Family,
        /// PostgreSQL's rows, then Weir's.
        expected: Vec<Row>,
        actual: Vec<Row>,
    },
    Disagree {
        sql: String,
        weir: Result<(), String>,
        postgres: Result<(), String>,
    },
}

impl Failure {
    /// Whether `other` is the same failure for the shrinker: the same view differs, or again
    /// a statement is refused by one server only.
    pub fn same_kind(&self, other: &Failure) -> bool {
        match (self, other) {
            (Failure::Mismatch { view: a, .. }, Failure::Mismatch { view: b, .. }) => a == b,
            (Failure::Disagree { .. }, Failure::Disagree { .. }) => true,
            _ => false,
        }
    }
}

pub struct Run {
    /// Views that matched PostgreSQL, per family, counted at every check.
    pub passed: Vec<Family>,
    /// The failure and the index of the step it happened at.
    pub failure: Option<(usize, Failure)>,
    /// For every step run: the SQLSTATE with which both servers refused it, if they did.
    pub refused: Vec<Option<String>>,
}

/// A statement taking longer than this is a failure (a hung FLUSH, say), not a wait forever.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Which views a check compares.
#[derive(Debug, Clone, Copy)]
pub enum Checks<'a> {
    All,
    /// The shrinker's target view alone.
    Only(&'a str),
    /// None: the shrinker is after a statement the servers disagree on.
    Skip,
}

impl Checks<'_> {
    fn includes(&self, view: &str) -> bool {
        match self {
            Checks::All => true,
            Checks::Only(name) => *name == view,
            Checks::Skip => false,
        }
    }
}

/// Runs `steps` on a new Weir server and on PostgreSQL's `public` schema, emptied first.
pub async fn replay(
    pg: &Client,
    steps: &[Step],
    checks: Checks<'_>,
    parallelism: usize,
) -> Result<Run, String> {
    exec(
        pg,
        "DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public",
    )
    .await
    .map_err(|e| format!("postgres: resetting the schema: {e}"))?;
    let weir = WeirServer::start(parallelism).await?;
    let result = run_steps(&weir.client, pg, steps, checks).await;
    weir.stop().await;
    result
}

async fn run_steps(
    weir: &Client,
    pg: &Client,
    steps: &[Step],
    checks: Checks<'_>,
) -> Result<Run, String> {
    let mut run = Run {
        passed: Vec::new(),
        failure: None,
        refused: Vec::new(),
    };
    let mut views: Vec<(&str, Family)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let Some(sql) = step.sql(false) else {
            run.refused.push(None);
            exec(weir, "FLUSH")
                .await
                .map_err(|e| format!("weir: FLUSH: {e}"))?;
            for &(view, family) in &views {
                if !checks.includes(view) {
                    continue;
                }
                let query = format!("SELECT * FROM {view}");
                let actual = rows(weir, &query)
                    .await
                    .map_err(|e| format!("weir: {query}: {e}"))?;
                let expected = rows(pg, &query)
                    .await
                    .map_err(|e| format!("postgres: {query}: {e}"))?;
                let floats = float_columns(pg, &query)
                    .await
                    .map_err(|e| format!("postgres: {query}: {e}"))?;
                if same_multiset(&actual, &expected, &floats) {
                    run.passed.push(family);
                } else {
                    let failure = Failure::Mismatch {
                        view: view.to_string(),
                        family,
                        expected,
                        actual,
                    };
                    run.failure = Some((i, failure));
                    return Ok(run);
                }
            }
            continue;
        };
        let pg_sql = step.sql(true).unwrap_or_default();
        let w = exec(weir, &sql).await;
        let p = exec(pg, &pg_sql).await;
        match (&w, &p) {
            (Ok(()), Ok(())) => {
                run.refused.push(None);
                if let Step::CreateView { name, family, .. } = step {
                    views.push((name, *family));
                }
            }
            // Both refuse it, for the same class of reason: a primary-key conflict, or (while
            // shrinking) a view over a column that a dropped step used to provide.
            (Err(a), Err(b)) if a.get(..2) == b.get(..2) => {
                run.refused.push(Some(b.get(..5).unwrap_or(b).to_string()));
            }
            _ => {
                run.refused.push(None);
                let failure = Failure::Disagree {
                    sql,
                    weir: w,
                    postgres: p,
                };
                run.failure = Some((i, failure));
                return Ok(run);
            }
        }
    }
    Ok(run)
}

/// A Weir server in this process, on a free loopback port, with its own data directory.
struct WeirServer {
    client: Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl WeirServer {
    async fn start(parallelism: usize) -> Result<WeirServer, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config = Config {
            listen: ([127, 0, 0, 1], 0).into(),
            data_dir: dir.path().to_path_buf(),
            barrier_interval_ms: 50,
            streaming_parallelism: parallelism,
            ..Config::default()
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let db: Arc<Database> = Database::open(config).await.map_err(|e| e.to_string())?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(weir::server::serve(db, listener, None, async {
            let _ = stopped.await;
        }));
        let conn = format!("host=127.0.0.1 port={} user=weir dbname=weir", addr.port());
        let (client, connection) = tokio_postgres::connect(&conn, NoTls)
            .await
            .map_err(describe)?;
        tokio::spawn(connection);
        Ok(WeirServer {
            client,
            stop,
            task,
            _dir: dir,
        })
    }

    async fn stop(self) {
        drop(self.client);
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A client of the server at `conn` (PostgreSQL or Weir), its connection driven by a task.
pub async fn connect(conn: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls)
        .await
        .map_err(|e| format!("connecting ({conn}): {}", describe(e)))?;
    tokio::spawn(connection);
    Ok(client)
}

pub async fn exec(client: &Client, sql: &str) -> Result<(), String> {
    match tokio::time::timeout(STATEMENT_TIMEOUT, client.simple_query(sql)).await {
        Ok(result) => result.map(|_| ()).map_err(describe),
        Err(_) => Err(format!("no answer within {STATEMENT_TIMEOUT:?}")),
    }
}

pub async fn rows(client: &Client, sql: &str) -> Result<Vec<Row>, String> {
    let messages = tokio::time::timeout(STATEMENT_TIMEOUT, client.simple_query(sql))
        .await
        .map_err(|_| format!("no answer within {STATEMENT_TIMEOUT:?}"))?
        .map_err(describe)?;
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

/// Which columns of the query's result PostgreSQL types as floating point.
pub async fn float_columns(pg: &Client, sql: &str) -> Result<Vec<bool>, String> {
    let statement = pg.prepare(sql).await.map_err(describe)?;
    Ok(statement
        .columns()
        .iter()
        .map(|c| matches!(*c.type_(), Type::FLOAT4 | Type::FLOAT8))
        .collect())
}

pub fn describe(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Two cells agree: exactly as text, or, in a floating-point column, within a relative 1e-9
/// (sums of floats depend on the order of additions).
fn same_cell(a: &Option<String>, b: &Option<String>, float: bool) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) if x == y => true,
        (Some(x), Some(y)) if float => match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(p), Ok(q)) => {
                let scale = p.abs().max(q.abs()).max(1e-300);
                (p - q).abs() / scale < 1e-9 || (p - q).abs() < 1e-12
            }
            _ => false,
        },
        _ => false,
    }
}

fn same_row(a: &Row, b: &Row, floats: &[bool]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .enumerate()
            .all(|(i, (x, y))| same_cell(x, y, floats.get(i).copied().unwrap_or(false)))
}

/// Whether two results hold the same rows with the same multiplicities; `floats` marks the
/// floating-point columns.
pub fn same_multiset(a: &[Row], b: &[Row], floats: &[bool]) -> bool {
    let (only_a, only_b) = difference(a, b, floats);
    only_a.is_empty() && only_b.is_empty()
}

/// The rows only `a` has and those only `b` has, counting duplicates.
pub fn difference<'a>(a: &'a [Row], b: &'a [Row], floats: &[bool]) -> (Vec<&'a Row>, Vec<&'a Row>) {
    // Rows equal as text pair off first (in linear time); what is left pairs off within the
    // floating-point tolerance.
    let mut counts: HashMap<&Row, i64> = HashMap::new();
    for row in b {
        *counts.entry(row).or_default() += 1;
    }
    let mut rest_a = Vec::new();
    for row in a {
        match counts.get_mut(row) {
            Some(n) if *n > 0 => *n -= 1,
            _ => rest_a.push(row),
        }
    }
    let mut unmatched: Vec<&Row> = Vec::new();
    for row in b {
        if let Some(n) = counts.get_mut(row) {
            if *n > 0 {
                *n -= 1;
                unmatched.push(row);
            }
        }
    }
    let mut only_a = Vec::new();
    for row in rest_a {
        match unmatched.iter().position(|r| same_row(r, row, floats)) {
            Some(i) => {
                unmatched.swap_remove(i);
            }
            None => only_a.push(row),
        }
    }
    (only_a, unmatched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> Row {
        cells.iter().map(|c| c.map(str::to_string)).collect()
    }

    #[test]
    fn multisets_count_duplicates_and_floats_get_a_tolerance() {
        let a = vec![row(&[Some("1"), None]), row(&[Some("1"), None])];
        let b = vec![row(&[Some("1"), None])];
        assert!(!same_multiset(&a, &b, &[false, false]));
        assert!(same_multiset(&a, &a.clone(), &[false, false]));
        let x = vec![row(&[Some("0.30000000000000004")])];
        let y = vec![row(&[Some("0.3")])];
        assert!(same_multiset(&x, &y, &[true]));
        assert!(!same_multiset(&x, &y, &[false]));
        assert!(!same_multiset(&x, &[row(&[Some("0.31")])], &[true]));
        // Integers and numerics compare exactly, scale included.
        let ten = [row(&[Some("10")])];
        assert!(!same_multiset(&ten, &[row(&[Some("10.00")])], &[false]));
        let half = [row(&[Some("2.50")])];
        assert!(!same_multiset(&half, &[row(&[Some("2.5")])], &[false]));
        assert!(!same_multiset(
            &[row(&[None])],
            &[row(&[Some("NULL")])],
            &[false]
        ));
    }
}
