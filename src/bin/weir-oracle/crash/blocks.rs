//! The third writer of the crash test: transaction blocks over both tables, some committed,
//! some rolled back, some cut off by the kill (before their COMMIT, or during it).
//!
//! Its rows are its own (ids from `IDS_FROM`), so its blocks never conflict with the other
//! writers, and within a block each statement touches rows no other statement of the block
//! touches, so that whether a block was applied can be told from each of its statements
//! alone: every one applied, or none. A committed block goes to PostgreSQL in one
//! transaction too.

use std::time::Duration;

use tokio_postgres::Client;

use super::io_refusal;
use super::model::{Change, Model, Statement};
use super::verify::applied;
use crate::replay::{connect, describe, exec};

/// The first id of the block writer's rows, in each table.
const IDS_FROM: i64 = 1_000_000_000;

/// The block writer: a model of its rows in each table.
pub(super) struct Blocks {
    pub(super) models: [Model; 2],
}

/// A block the kill interrupted: its statements, and whether its COMMIT was sent.
#[derive(Debug, Clone)]
pub(super) struct InDoubt {
    statements: Vec<Statement>,
    committing: bool,
}

/// What the block writer did before the server died under it.
pub(super) struct Outcome {
    pub(super) committed: u64,
    pub(super) rolled_back: u64,
    /// Blocks refused (at a statement or at COMMIT) for an injected I/O error.
    pub(super) refused: u64,
    pub(super) in_doubt: Option<InDoubt>,
}

impl Blocks {
    pub(super) fn new(seed: u64) -> Blocks {
        let model = |table, seed| {
            let mut m = Model::new(table, seed);
            m.next_id = IDS_FROM;
            m
        };
        Blocks {
            models: [model("t1", seed), model("t2", seed.wrapping_add(1))],
        }
    }

    /// The next block: one to four statements over both tables, on rows no earlier statement
    /// of the block touched.
    fn next(&mut self, foreign_ids: i64) -> Vec<Statement> {
        self.models[1].foreign_ids = foreign_ids;
        let n = 1 + self.models[0].rng.below(4);
        let mut touched: Vec<(&'static str, i64)> = Vec::new();
        let mut block = Vec::new();
        for i in 0..n {
            let model = &mut self.models[(i % 2) as usize];
            let statement = model.next();
            let ids = statement.change.ids();
            if ids
                .iter()
                .any(|id| touched.contains(&(statement.table, *id)))
            {
                continue;
            }
            touched.extend(ids.iter().map(|id| (statement.table, *id)));
            block.push(statement);
        }
        block
    }

    fn apply(&mut self, block: &[Statement]) {
        for s in block {
            self.model(s.table).apply(&s.change);
        }
    }

    fn model(&mut self, table: &str) -> &mut Model {
        let i = usize::from(table != "t1");
        &mut self.models[i]
    }
}

impl Change {
    /// The ids of the rows a change touches.
    pub(super) fn ids(&self) -> Vec<i64> {
        match self {
            Change::Insert(rows) => rows.iter().map(|r| r.id).collect(),
            Change::Delete(ids) => ids.clone(),
            Change::Update { id, .. } => vec![*id],
        }
    }
}

/// Sends blocks to Weir at `conn` until its connection breaks: BEGIN, the block's
/// statements, then COMMIT (three in four) or ROLLBACK. A committed block goes to
/// PostgreSQL in one transaction.
pub(super) async fn transact_until_failure(
    conn: String,
    pg: Client,
    mut blocks: Blocks,
    foreign_ids: i64,
) -> (Blocks, Result<Outcome, String>) {
    let mut outcome = Outcome {
        committed: 0,
        rolled_back: 0,
        refused: 0,
        in_doubt: None,
    };
    let Ok(weir) = connect(&conn).await else {
        return (blocks, Ok(outcome));
    };
    loop {
        let block = blocks.next(foreign_ids);
        let commit = blocks.models[1].rng.below(4) != 0;
        let mut statements = vec!["BEGIN".to_string()];
        statements.extend(block.iter().map(|s| s.sql.clone()));
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        let mut in_doubt = InDoubt {
            statements: block.clone(),
            committing: false,
        };
        let mut failed = None;
        for sql in statements.iter().map(String::as_str).chain([end]) {
            in_doubt.committing = sql == "COMMIT";
            let answer =
                tokio::time::timeout(Duration::from_secs(60), weir.simple_query(sql)).await;
            match answer {
                Err(_) => return (blocks, Err(format!("weir: no answer within 60 s to {sql}"))),
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.as_db_error().is_none() => {
                    // The connection broke: the server died during the block.
                    outcome.in_doubt = Some(in_doubt);
                    return (blocks, Ok(outcome));
                }
                Ok(Err(e)) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None if commit => {
                if let Err(e) = apply_to_postgres(&pg, &block).await {
                    return (blocks, Err(e));
                }
                blocks.apply(&block);
                outcome.committed += 1;
            }
            None => outcome.rolled_back += 1,
            // An injected I/O error at a statement or at COMMIT: nothing of the block is
            // applied. A commit in doubt (08007: committed, not yet in every table's log) is
            // applied by the next start.
            Some(e) if e.code().is_some_and(|c| c.code() == "08007") => {
                in_doubt.committing = true;
                outcome.in_doubt = Some(in_doubt);
                // Its tables take no writes until the restart: wait for the kill.
                let _ = weir.simple_query("ROLLBACK").await;
                super::until_death(&weir).await;
                return (blocks, Ok(outcome));
            }
            Some(e) if e.code().is_some_and(|c| io_refusal(c.code())) => {
                outcome.refused += 1;
                if weir.simple_query("ROLLBACK").await.is_err() {
                    return (blocks, Ok(outcome));
                }
            }
            Some(e) => {
                let e = format!("weir refused a block's statement: {}", describe(e));
                return (blocks, Err(e));
            }
        }
    }
}

async fn apply_to_postgres(pg: &Client, block: &[Statement]) -> Result<(), String> {
    let mut sql = String::from("BEGIN;");
    for s in block {
        sql.push_str(&s.sql);
        sql.push(';');
    }
    sql.push_str("COMMIT");
    exec(pg, &sql)
        .await
        .map_err(|e| format!("postgres: {sql}: {e}"))
}

/// Decides a block the kill interrupted from what Weir's tables hold after the restart:
/// applied whole (then PostgreSQL and the model apply it too) or not at all, and never
/// applied when its COMMIT was not sent. Returns whether it was applied.
pub(super) async fn resolve(
    weir: &Client,
    pg: &Client,
    blocks: &mut Blocks,
    block: &InDoubt,
) -> Result<bool, String> {
    let mut seen = Vec::new();
    for s in &block.statements {
        seen.push(applied(weir, s, blocks.model(s.table)).await?);
    }
    let all = seen.iter().all(|a| *a);
    if !all && seen.iter().any(|a| *a) {
        return Err(format!(
            "a transaction block was applied in part: {:?}",
            block.statements.iter().map(|s| &s.sql).collect::<Vec<_>>()
        ));
    }
    let applied = all && !seen.is_empty();
    if applied && !block.committing {
        return Err(format!(
            "a transaction block whose COMMIT was never sent is visible: {:?}",
            block.statements.iter().map(|s| &s.sql).collect::<Vec<_>>()
        ));
    }
    if applied {
        apply_to_postgres(pg, &block.statements).await?;
        blocks.apply(&block.statements);
    }
    Ok(applied)
}
