//! After each restart: the statements and blocks the kill left in doubt decided from what
//! Weir holds (applied whole, or not at all), and every view and table compared with
//! PostgreSQL.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use super::model::{Change, Model, Statement};
use super::{blocks, Run, Tally};
use crate::replay::{difference, exec, float_columns, rows};

/// Decides each in-doubt statement and block from what Weir's tables hold after the restart:
/// applied whole (PostgreSQL and the model apply it too) or not at all.
pub(super) async fn resolve(
    weir: &Client,
    pg: &Client,
    run: &mut Run,
    tally: &mut Tally,
) -> Result<(), String> {
    exec(weir, "FLUSH").await?;
    // One at a time, so that those not yet decided stay in doubt if the server dies now.
    while let Some(statement) = run.in_doubt.first().cloned() {
        let Some(model) = run.models.iter_mut().find(|m| m.table == statement.table) else {
            return Err(format!("no writer for table {}", statement.table));
        };
        if applied(weir, &statement, model).await? {
            exec(pg, &statement.sql)
                .await
                .map_err(|e| format!("postgres: {}: {e}", statement.sql))?;
            model.apply(&statement.change);
            tally.in_doubt_applied += 1;
        } else {
            tally.in_doubt_not_applied += 1;
        }
        run.in_doubt.remove(0);
    }
    while let Some(block) = run.blocks_in_doubt.first().cloned() {
        let blocks = run.blocks.as_mut().ok_or("the block writer is missing")?;
        if blocks::resolve(weir, pg, blocks, &block).await? {
            tally.blocks_in_doubt_applied += 1;
        } else {
            tally.blocks_in_doubt_not_applied += 1;
        }
        run.blocks_in_doubt.remove(0);
    }
    if let Some(statement) = &run.large_in_doubt {
        let large = run.large.as_mut().ok_or("the large writer is missing")?;
        if super::large::resolve(weir, pg, large, statement).await? {
            tally.large_in_doubt_applied += 1;
        } else {
            tally.large_in_doubt_not_applied += 1;
        }
        run.large_in_doubt = None;
    }
    let hot = run
        .hot
        .as_mut()
        .ok_or("the conflicting writer is missing")?;
    hot.resolve(weir, pg, &mut tally.hot).await?;
    Ok(())
}

/// Whether Weir applied `statement` (of the writer `model`), from the rows it touches: all of
/// its change or none (anything else is an error).
pub(super) async fn applied(
    weir: &Client,
    statement: &Statement,
    model: &Model,
) -> Result<bool, String> {
    let column = if statement.table == "t1" { "v" } else { "w" };
    let list: Vec<String> = statement.change.ids().iter().map(i64::to_string).collect();
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
    Ok(match &statement.change {
        Change::Insert(_) if found.is_empty() => false,
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
        Change::Update { id, .. } if found.get(id) == Some(&model.rows.get(id).copied()) => false,
        _ => {
            return Err(format!(
                "statement in doubt applied in part or wrongly: {}; weir holds {found:?}",
                statement.sql
            ))
        }
    })
}

/// Compares every view and the writers' tables with PostgreSQL.
pub(super) async fn check(
    weir: &Client,
    pg: &Client,
    views: &[String],
    tally: &mut Tally,
) -> Result<(), String> {
    exec(weir, "FLUSH").await?;
    let tables = ["t1", "t2"].iter().chain(super::hot::TABLES);
    for name in views.iter().map(String::as_str).chain(tables.copied()) {
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
