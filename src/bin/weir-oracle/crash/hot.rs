//! The fifth writer of the crash test: sessions whose transaction blocks conflict. Each
//! session sends blocks that move amounts between a few hot rows of `hot` and record the
//! block's number in the session's row of `hot_done`, so that blocks of different sessions
//! change the same rows and many are refused with 40001 (first committer wins). A block Weir
//! commits goes to PostgreSQL as increments, in whatever order the sessions acknowledge
//! them: increments commute, so PostgreSQL ends where Weir does only if no committed block
//! lost another's update and none was applied twice or in part. After a kill, the session's
//! `hot_done` row tells whether a block whose COMMIT went unanswered was applied.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::Client;
use weir::rng::Rng;

use super::io_refusal;
use crate::replay::{connect, describe, exec, rows};

/// Rows of `hot`: few, so that the sessions' blocks conflict often.
const ROWS: u64 = 4;
const SESSIONS: i64 = 3;

pub(super) const SCHEMA: &[&str] = &[
    "CREATE TABLE hot (id bigint PRIMARY KEY, v bigint NOT NULL)",
    "CREATE TABLE hot_done (session bigint PRIMARY KEY, block bigint NOT NULL)",
    "INSERT INTO hot VALUES (1, 1000), (2, 1000), (3, 1000), (4, 1000)",
    "INSERT INTO hot_done VALUES (1, 0), (2, 0), (3, 0)",
];

/// The tables compared with PostgreSQL after every restart, besides the views.
pub(super) const TABLES: &[&str] = &["hot", "hot_done"];

/// The views over them: the transfers keep the total; the join reads both tables of every
/// block.
pub(super) const VIEWS: &[(&str, &str)] = &[
    (
        "v_hot",
        "SELECT sum(v) AS total, count(*) AS c, min(v) AS mn, max(v) AS mx FROM hot",
    ),
    (
        "v_hot_done",
        "SELECT d.session, d.block, h.v FROM hot_done d JOIN hot h ON h.id = d.session",
    ),
];

/// One block: amounts moved between hot rows, then the session's `hot_done` row set to
/// `number`.
#[derive(Debug, Clone)]
struct Block {
    number: i64,
    /// (from, to, amount)
    moves: Vec<(i64, i64, i64)>,
}

/// A block the kill interrupted, and whether its COMMIT was sent.
#[derive(Debug, Clone)]
struct InDoubt {
    block: Block,
    committing: bool,
}

struct Session {
    id: i64,
    rng: Rng,
    next_block: i64,
    /// The number of its last block known to be applied (`hot_done`'s value for it).
    committed: i64,
    in_doubt: Option<InDoubt>,
}

/// What the sessions did, over the whole run.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) committed: u64,
    /// Refused at COMMIT (or a statement) with 40001.
    pub(super) conflicts: u64,
    pub(super) rolled_back: u64,
    pub(super) in_doubt_applied: u64,
    pub(super) in_doubt_not_applied: u64,
}

/// What one session did in one round.
#[derive(Default)]
struct Sent {
    committed: u64,
    conflicts: u64,
    rolled_back: u64,
    /// Refused for an injected I/O error.
    refused: u64,
}

/// The conflicting writer's sessions, between rounds.
pub(super) struct Hot {
    sessions: Vec<Session>,
}

/// The sessions while the server runs.
pub(super) struct Running {
    handles: Vec<JoinHandle<(Session, Result<Sent, String>)>>,
}

impl Hot {
    pub(super) fn new(seed: u64) -> Hot {
        let sessions = (1..=SESSIONS)
            .map(|id| Session {
                id,
                rng: Rng::new(seed.wrapping_add(id as u64)),
                next_block: 1,
                committed: 0,
                in_doubt: None,
            })
            .collect();
        Hot { sessions }
    }

    /// Starts every session against Weir at `weir` (a connection string), each with its own
    /// connection to PostgreSQL at `pg_conn`.
    pub(super) async fn start(self, weir: &str, pg_conn: &str) -> Result<Running, String> {
        let mut handles = Vec::new();
        for session in self.sessions {
            let pg = connect(pg_conn).await?;
            handles.push(tokio::spawn(blocks_until_failure(
                weir.to_string(),
                pg,
                session,
            )));
        }
        Ok(Running { handles })
    }

    /// Decides each block the kill left in doubt from its session's `hot_done` row: its own
    /// number (applied: PostgreSQL applies it too) or the number of the session's last
    /// applied block (not applied); never applied when its COMMIT was not sent.
    pub(super) async fn resolve(
        &mut self,
        weir: &Client,
        pg: &Client,
        counts: &mut Counts,
    ) -> Result<(), String> {
        for session in &mut self.sessions {
            let Some(doubt) = session.in_doubt.clone() else {
                continue;
            };
            let sql = format!("SELECT block FROM hot_done WHERE session = {}", session.id);
            let found = rows(weir, &sql)
                .await
                .map_err(|e| format!("weir: {sql}: {e}"))?;
            let marker = found
                .first()
                .and_then(|r| r.first())
                .cloned()
                .flatten()
                .and_then(|v| v.parse::<i64>().ok());
            if marker == Some(doubt.block.number) {
                if !doubt.committing {
                    return Err(format!(
                        "a conflicting block whose COMMIT was never sent is visible: {:?}",
                        doubt.block
                    ));
                }
                apply_to_postgres(pg, session.id, &doubt.block).await?;
                session.committed = doubt.block.number;
                counts.in_doubt_applied += 1;
            } else if marker == Some(session.committed) {
                counts.in_doubt_not_applied += 1;
            } else {
                return Err(format!(
                    "hot_done holds {marker:?} for session {}: neither its block in doubt {} \
                     nor its last applied one {}",
                    session.id, doubt.block.number, session.committed
                ));
            }
            session.in_doubt = None;
        }
        Ok(())
    }
}

impl Running {
    /// Waits for every session to stop (the server died under it) and adds up what they did:
    /// blocks refused for an injected I/O error go to `refused`.
    pub(super) async fn finish(
        self,
        counts: &mut Counts,
        refused: &mut u64,
    ) -> Result<Hot, String> {
        let mut sessions = Vec::new();
        let mut failure = None;
        for handle in self.handles {
            let (session, outcome) = handle.await.map_err(|e| format!("hot writer: {e}"))?;
            sessions.push(session);
            match outcome {
                Ok(c) => {
                    counts.committed += c.committed;
                    counts.conflicts += c.conflicts;
                    counts.rolled_back += c.rolled_back;
                    *refused += c.refused;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(Hot { sessions }),
        }
    }
}

impl Session {
    /// The next block: one or two moves of 1 to 50 between hot rows (a row to itself too).
    fn next(&mut self) -> Block {
        let number = self.next_block;
        self.next_block += 1;
        let n = 1 + self.rng.below(2);
        let moves = (0..n)
            .map(|_| {
                let from = 1 + self.rng.below(ROWS) as i64;
                let to = 1 + self.rng.below(ROWS) as i64;
                (from, to, 1 + self.rng.below(50) as i64)
            })
            .collect();
        Block { number, moves }
    }
}

impl Block {
    /// The statements Weir gets, one per row change, in the order the moves name them.
    fn statements(&self, session: i64) -> Vec<String> {
        let mut out = Vec::new();
        for (from, to, amount) in &self.moves {
            out.push(format!("UPDATE hot SET v = v - {amount} WHERE id = {from}"));
            out.push(format!("UPDATE hot SET v = v + {amount} WHERE id = {to}"));
        }
        out.push(format!(
            "UPDATE hot_done SET block = {} WHERE session = {session}",
            self.number
        ));
        out
    }

    /// Each row's net change, by id: PostgreSQL takes them in id order, so that two sessions'
    /// transactions never wait on each other's row locks in a cycle.
    fn net(&self) -> BTreeMap<i64, i64> {
        let mut net = BTreeMap::new();
        for (from, to, amount) in &self.moves {
            *net.entry(*from).or_default() -= amount;
            *net.entry(*to).or_default() += amount;
        }
        net
    }
}

async fn apply_to_postgres(pg: &Client, session: i64, block: &Block) -> Result<(), String> {
    let mut sql = String::from("BEGIN;");
    for (id, delta) in block.net() {
        sql.push_str(&format!("UPDATE hot SET v = v + {delta} WHERE id = {id};"));
    }
    sql.push_str(&format!(
        "UPDATE hot_done SET block = {} WHERE session = {session};COMMIT",
        block.number
    ));
    exec(pg, &sql)
        .await
        .map_err(|e| format!("postgres: {sql}: {e}"))
}

/// How one block ended.
enum End {
    Committed,
    RolledBack,
    /// Refused with this error (the block is over: nothing of it applied).
    Refused(tokio_postgres::Error),
    /// The connection broke: the server died during the block.
    Lost,
}

/// Sends one block: BEGIN, its statements, then COMMIT (four in five) or ROLLBACK.
async fn send(weir: &Client, statements: &[String], commit: bool, doubt: &mut bool) -> End {
    let end = if commit { "COMMIT" } else { "ROLLBACK" };
    let all = ["BEGIN"]
        .into_iter()
        .chain(statements.iter().map(String::as_str))
        .chain([end]);
    for sql in all {
        *doubt = sql == "COMMIT";
        match weir.simple_query(sql).await {
            Ok(_) => {}
            Err(e) if e.as_db_error().is_none() => return End::Lost,
            Err(e) => return End::Refused(e),
        }
    }
    match commit {
        true => End::Committed,
        false => End::RolledBack,
    }
}

/// Sends one session's blocks to Weir at `conn` until its connection breaks; each committed
/// block goes to PostgreSQL. A block refused with 40001 is not retried: the next block is
/// a new one.
async fn blocks_until_failure(
    conn: String,
    pg: Client,
    mut session: Session,
) -> (Session, Result<Sent, String>) {
    let mut counts = Sent::default();
    let Ok(weir) = connect(&conn).await else {
        return (session, Ok(counts));
    };
    loop {
        let block = session.next();
        let commit = session.rng.below(5) != 0;
        let statements = block.statements(session.id);
        let mut committing = false;
        let answer = tokio::time::timeout(
            Duration::from_secs(60),
            send(&weir, &statements, commit, &mut committing),
        )
        .await;
        let Ok(end) = answer else {
            let e = format!("weir: a conflicting block unanswered for 60 s: {statements:?}");
            return (session, Err(e));
        };
        match end {
            End::Committed => {
                if let Err(e) = apply_to_postgres(&pg, session.id, &block).await {
                    return (session, Err(e));
                }
                session.committed = block.number;
                counts.committed += 1;
            }
            End::RolledBack => counts.rolled_back += 1,
            End::Lost => {
                session.in_doubt = Some(InDoubt { block, committing });
                return (session, Ok(counts));
            }
            End::Refused(e) => {
                let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
                if code == "08007" {
                    // Committed, not yet in both tables' logs: the restart applies it. Its
                    // tables take no writes until then: wait for the kill.
                    session.in_doubt = Some(InDoubt {
                        block,
                        committing: true,
                    });
                    let _ = weir.simple_query("ROLLBACK").await;
                    super::until_death(&weir).await;
                    return (session, Ok(counts));
                }
                if code == "40001" {
                    counts.conflicts += 1;
                } else if io_refusal(&code) {
                    counts.refused += 1;
                } else {
                    let e = format!("weir refused a conflicting block: {}", describe(e));
                    return (session, Err(e));
                }
                // Ends the block when a statement, not COMMIT, was refused.
                if weir.simple_query("ROLLBACK").await.is_err() {
                    return (session, Ok(counts));
                }
            }
        }
    }
}
