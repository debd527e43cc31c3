//! Shrinks a failing workload: drops steps (in halving chunks, then one by one), rows of
//! inserts and clauses of views, keeping each change only while the same failure persists on
//! a fresh replay. Bounded by a number of replays and a time budget.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::replay::{replay, Checks, Failure};
use crate::workload::{Query, Step};

pub struct Shrunk {
    pub steps: Vec<Step>,
    pub failure: Failure,
    pub refused: Vec<Option<String>>,
    pub replays: usize,
    /// False when the failure did not happen again on the first replay (it depends on timing,
    /// such as where epochs end); the workload is then returned as it was.
    pub reproduced: bool,
}

pub struct Budget {
    pub replays: usize,
    pub time: Duration,
}

struct Shrinker<'a> {
    pg: &'a Client,
    target: Failure,
    budget: Budget,
    parallelism: usize,
    started: Instant,
    replays: usize,
    best: Shrunk,
}

/// `steps` end with the step at which `failure` happened.
pub async fn shrink(
    pg: &Client,
    steps: Vec<Step>,
    failure: Failure,
    budget: Budget,
    parallelism: usize,
) -> Result<Shrunk, String> {
    let mut s = Shrinker {
        pg,
        target: failure.clone(),
        budget,
        parallelism,
        started: Instant::now(),
        replays: 0,
        best: Shrunk {
            steps: steps.clone(),
            failure,
            refused: Vec::new(),
            replays: 0,
            reproduced: false,
        },
    };
    if !s.attempt(steps).await? {
        return Ok(s.finish());
    }
    s.best.reproduced = true;
    loop {
        let before = s.best.steps.clone();
        s.drop_steps().await?;
        s.drop_rows().await?;
        s.simplify_views().await?;
        if s.best.steps == before || s.exhausted() {
            break;
        }
    }
    Ok(s.finish())
}

impl Shrinker<'_> {
    fn finish(mut self) -> Shrunk {
        self.best.replays = self.replays;
        self.best
    }

    fn exhausted(&self) -> bool {
        self.replays >= self.budget.replays || self.started.elapsed() >= self.budget.time
    }

    /// Replays `candidate`; keeps it (cut after the failing step) if the failure persists.
    async fn attempt(&mut self, candidate: Vec<Step>) -> Result<bool, String> {
        if self.exhausted() {
            return Ok(false);
        }
        self.replays += 1;
        let checks = match &self.target {
            Failure::Mismatch { view, .. } => Checks::Only(view),
            Failure::Disagree { .. } => Checks::Skip,
        };
        let run = replay(self.pg, &candidate, checks, self.parallelism).await?;
        match run.failure {
            Some((at, failure)) if failure.same_kind(&self.target) => {
                let mut steps = candidate;
                steps.truncate(at + 1);
                self.best.steps = steps;
                self.best.failure = failure;
                self.best.refused = run.refused;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn is_target(&self, step: &Step) -> bool {
        match (step, &self.target) {
            (Step::CreateView { name, .. }, Failure::Mismatch { view, .. }) => name == view,
            _ => false,
        }
    }

    /// Removes runs of steps, halving the run length down to single steps.
    async fn drop_steps(&mut self) -> Result<(), String> {
        let mut chunk = (self.best.steps.len() / 2).max(1);
        loop {
            let mut start = 0;
            while start < self.best.steps.len() && !self.exhausted() {
                let steps = &self.best.steps;
                let end = (start + chunk).min(steps.len());
                let candidate: Vec<Step> = steps
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| !(start..end).contains(i) || self.is_target(s))
                    .map(|(_, s)| s.clone())
                    .collect();
                if candidate.len() == steps.len() || !self.attempt(candidate).await? {
                    start += chunk;
                }
            }
            if chunk == 1 || self.exhausted() {
                return Ok(());
            }
            chunk /= 2;
        }
    }

    /// Removes rows of multi-row inserts one at a time.
    async fn drop_rows(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.best.steps.len() && !self.exhausted() {
            let mut row = 0;
            while let Step::Insert { rows, .. } = &self.best.steps[i] {
                if row >= rows.len() || rows.len() < 2 || self.exhausted() {
                    break;
                }
                let mut candidate = self.best.steps.clone();
                if let Step::Insert { rows, .. } = &mut candidate[i] {
                    rows.remove(row);
                }
                if !self.attempt(candidate).await? {
                    row += 1;
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Drops WHERE, HAVING, select items and grouping keys of each view.
    async fn simplify_views(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.best.steps.len() && !self.exhausted() {
            let mut variant = 0;
            while let Step::CreateView { query, .. } = &self.best.steps[i] {
                let Some(simpler) = simplify(query, variant) else {
                    break;
                };
                let mut candidate = self.best.steps.clone();
                if let Step::CreateView { query, .. } = &mut candidate[i] {
                    *query = simpler;
                }
                if !self.attempt(candidate).await? {
                    variant += 1;
                }
                if self.exhausted() {
                    break;
                }
            }
            i += 1;
        }
        Ok(())
    }
}

/// The `variant`-th simplification of a query, in order: without WHERE, without HAVING,
/// without one select item, without one grouping key (and the select items naming it).
fn simplify(query: &Query, variant: usize) -> Option<Query> {
    let mut variants: Vec<Query> = Vec::new();
    if query.filter.is_some() {
        variants.push(Query {
            filter: None,
            ..query.clone()
        });
    }
    if query.having.is_some() {
        variants.push(Query {
            having: None,
            ..query.clone()
        });
    }
    if query.then.is_some() {
        variants.push(Query {
            then: None,
            ..query.clone()
        });
    }
    if query.order_limit.is_some() {
        variants.push(Query {
            order_limit: None,
            ..query.clone()
        });
    }
    if query.select.len() > 1 {
        for i in 0..query.select.len() {
            let mut q = query.clone();
            q.select.remove(i);
            variants.push(q);
        }
    }
    for i in 0..query.group_by.len() {
        let mut q = query.clone();
        let key = q.group_by.remove(i);
        q.select
            .retain(|s| s != &key && !s.starts_with(&format!("{key} AS ")));
        if !q.select.is_empty() {
            variants.push(q);
        }
    }
    variants.into_iter().nth(variant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simplifications_drop_one_clause_each() {
        let q = Query {
            select: vec!["g % 2 AS parity".into(), "count(*) AS c".into()],
            from: "t0".into(),
            filter: Some("v > 1".into()),
            group_by: vec!["g % 2".into()],
            having: Some("count(*) > 1".into()),
            then: None,
            order_limit: None,
            postgres_from: None,
        };
        let all: Vec<String> = (0..)
            .map_while(|i| simplify(&q, i))
            .map(|q| q.sql())
            .collect();
        assert_eq!(
            all,
            [
                "SELECT g % 2 AS parity, count(*) AS c FROM t0 GROUP BY g % 2 HAVING count(*) > 1",
                "SELECT g % 2 AS parity, count(*) AS c FROM t0 WHERE v > 1 GROUP BY g % 2",
                "SELECT count(*) AS c FROM t0 WHERE v > 1 GROUP BY g % 2 HAVING count(*) > 1",
                "SELECT g % 2 AS parity FROM t0 WHERE v > 1 GROUP BY g % 2 HAVING count(*) > 1",
                "SELECT count(*) AS c FROM t0 WHERE v > 1 HAVING count(*) > 1",
            ]
        );
    }
}
