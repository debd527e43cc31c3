//! Writes a failure as a self-contained sqllogictest file: the (shrunk) statements in order,
//! with PostgreSQL's answers as the expected results, so that it runs against Weir with
//! `tests/slt.rs` and against PostgreSQL with `scripts/slt-vs-postgres`, and can become a
//! regression test in `sql-tests/` once the bug is fixed.

use std::path::{Path, PathBuf};

use crate::replay::{difference, Failure, Row};
use crate::shrink::Shrunk;
use crate::workload::Step;

pub fn write(
    dir: &Path,
    seed: u64,
    parallelism: usize,
    original_steps: usize,
    shrunk: &Shrunk,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("seed-{seed}.slt"));
    std::fs::write(&path, render(seed, parallelism, original_steps, shrunk))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn render(seed: u64, parallelism: usize, original_steps: usize, shrunk: &Shrunk) -> String {
    let mut out = format!(
        "# weir-oracle seed {seed} (rerun: weir-oracle --first-seed {seed} --seeds 1 \
         --parallelism {parallelism})\n"
    );
    out += &match &shrunk.failure {
        Failure::Mismatch { view, family, .. } => {
            format!("# view {view} ({family:?}) differs from PostgreSQL's answer.\n")
        }
        Failure::Disagree {
            sql,
            weir,
            postgres,
        } => format!(
            "# the servers disagree on: {sql}\n#   weir: {}\n#   postgres: {}\n",
            outcome(weir),
            outcome(postgres)
        ),
    };
    out += &if shrunk.reproduced {
        format!(
            "# shrunk from {original_steps} steps to {} in {} replays.\n",
            shrunk.steps.len(),
            shrunk.replays
        )
    } else {
        "# did not fail again on a replay (it depends on timing): not shrunk.\n".to_string()
    };
    let last = shrunk.steps.len().saturating_sub(1);
    for (i, step) in shrunk.steps.iter().enumerate() {
        out += "\n";
        // A view PostgreSQL reads in another spelling: each server gets its own statement.
        if let Step::CreateView { query, .. } = step {
            if query.postgres_from.is_some() {
                let (weir, postgres) = (step.sql(false), step.sql(true));
                let (weir, postgres) = (weir.unwrap_or_default(), postgres.unwrap_or_default());
                out += &format!(
                    "onlyif weir\nstatement ok\n{weir}\n\nskipif weir\nstatement ok\n{postgres}\n"
                );
                continue;
            }
        }
        match step.sql(false) {
            Some(sql) => {
                let refused = shrunk.refused.get(i).cloned().flatten();
                let postgres_refused = match (&shrunk.failure, i == last) {
                    (Failure::Disagree { postgres, .. }, true) => postgres.clone().err(),
                    _ => refused,
                };
                match postgres_refused {
                    Some(code) => {
                        out += &format!("statement error {}\n", code.get(..5).unwrap_or(&code))
                    }
                    None => out += "statement ok\n",
                }
                out += &format!("{sql}\n");
            }
            None => {
                out += "statement ok\nFLUSH\n";
                if let (
                    Failure::Mismatch {
                        view,
                        expected,
                        actual,
                        ..
                    },
                    true,
                ) = (&shrunk.failure, i == last)
                {
                    out += &expected_rows(view, expected, actual);
                }
            }
        }
    }
    out
}

fn outcome(r: &Result<(), String>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => e.clone(),
    }
}

fn expected_rows(view: &str, expected: &[Row], actual: &[Row]) -> String {
    let (only_weir, only_pg) = difference(actual, expected, &[]);
    let mut out = String::new();
    for r in only_weir {
        out += &format!("# only in Weir: {}\n", cells(r));
    }
    for r in only_pg {
        out += &format!("# only in PostgreSQL: {}\n", cells(r));
    }
    let columns = expected.first().or(actual.first()).map_or(1, |r| r.len());
    out += &format!(
        "\nquery {} rowsort\nSELECT * FROM {view}\n----\n",
        "T".repeat(columns)
    );
    for r in expected {
        out += &format!("{}\n", cells(r));
    }
    out
}

/// A row as the slt harness prints it: NULL, `(empty)` for empty text.
fn cells(r: &Row) -> String {
    r.iter()
        .map(|c| match c.as_deref() {
            None => "NULL".to_string(),
            Some("") => "(empty)".to_string(),
            Some(v) => v.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Family, Query};

    #[test]
    fn a_mismatch_renders_as_an_slt_file_with_postgres_answers() {
        let shrunk = Shrunk {
            steps: vec![
                Step::CreateTable {
                    name: "t0".into(),
                    primary_key: true,
                },
                Step::CreateView {
                    name: "v0".into(),
                    query: Query {
                        select: vec!["min(v) AS lo".into()],
                        from: "t0".into(),
                        filter: None,
                        group_by: vec![],
                        having: None,
                        then: None,
                        order_limit: None,
                        postgres_from: None,
                    },
                    family: Family::Global,
                },
                Step::Insert {
                    table: "t0".into(),
                    rows: vec!["(1, 1, 1, 1, 1, 'a', true, NULL, NULL)".into()],
                },
                Step::Insert {
                    table: "t0".into(),
                    rows: vec!["(1, 1, 1, 1, 1, '', true, NULL, NULL)".into()],
                },
                Step::Check,
            ],
            failure: Failure::Mismatch {
                view: "v0".into(),
                family: Family::Global,
                expected: vec![vec![Some("1".into())]],
                actual: vec![vec![None]],
            },
            refused: vec![None, None, None, Some("23505".into()), None],
            replays: 9,
            reproduced: true,
        };
        let text = render(7, 1, 20, &shrunk);
        assert!(text.contains("shrunk from 20 steps to 5 in 9 replays"));
        assert!(text.contains(
            "statement ok\nCREATE MATERIALIZED VIEW v0 AS SELECT min(v) AS lo FROM t0\n"
        ));
        assert!(text.contains(
            "statement error 23505\nINSERT INTO t0 VALUES (1, 1, 1, 1, 1, '', true, NULL, NULL)\n"
        ));
        assert!(text.contains("# only in Weir: NULL\n# only in PostgreSQL: 1\n"));
        assert!(text.ends_with("query T rowsort\nSELECT * FROM v0\n----\n1\n"));
    }
}
