//! The fourth writer of the crash test: statements too large to be held in memory. Each
//! inserts, updates or deletes a range of 20,000 to 30,000 rows of table `big` from a session
//! whose `statement_mem` of 1 MB makes parts of 4,096 rows (or of a batch, 8,192 rows), so
//! that its rows are spooled and logged as a group of records applied a part per epoch
//! (`docs/design/0023-large-writes.md`), as a statement of millions of rows is under the
//! server's own share. The kill lands in the middle of most of them. After the restart the
//! range's rows tell whether the statement was applied, and it must have been applied whole
//! or not at all.

use std::time::Duration;

use tokio_postgres::Client;
use weir::rng::Rng;

use crate::replay::{exec, rows};

pub(super) const SCHEMA: &str = "CREATE TABLE big (id bigint PRIMARY KEY, v bigint NOT NULL)";

/// The view over `big` compared with PostgreSQL after every restart.
pub(super) const VIEW: (&str, &str) = (
    "v_big",
    "SELECT count(*) AS c, sum(v) AS sv, min(id) AS lo, max(id) AS hi FROM big",
);

/// The session's share, under which a statement keeps at most 4,096 rows in memory.
const SETTINGS: &str = "SET statement_mem = '1MB'";

/// The fewest rows a statement touches: more than two parts, the most a statement keeps in
/// memory under `SETTINGS`.
const ROWS_MIN: u64 = 20_000;

/// An `add` no range ever has: its rows never match it.
const NONE: i64 = -1_000_000_000;

/// A range of `big`'s ids whose rows hold `v = id % 1000 + add`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Range {
    lo: i64,
    hi: i64,
    add: i64,
}

/// One large statement: the range it touches as it was before and as it is after.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    sql: String,
    lo: i64,
    hi: i64,
    before: Option<i64>,
    after: Option<i64>,
}

/// The large writer: the ranges `big` holds, oldest first.
pub(super) struct Large {
    rng: Rng,
    ranges: Vec<Range>,
    next_id: i64,
}

impl Large {
    pub(super) fn new(seed: u64) -> Large {
        Large {
            rng: Rng::new(seed),
            ranges: Vec::new(),
            next_id: 1,
        }
    }

    /// The next statement: an insert of a new range while there are fewer than two, else
    /// an update or a delete of one.
    fn next(&mut self) -> Statement {
        let roll = self.rng.below(4);
        if self.ranges.is_empty() || (self.ranges.len() < 2 && roll < 2) {
            let lo = self.next_id;
            let hi = lo + (ROWS_MIN + self.rng.below(10_000)) as i64 - 1;
            self.next_id = hi + 1;
            let add = self.rng.below(1000) as i64;
            return Statement {
                sql: format!(
                    "INSERT INTO big SELECT g, g % 1000 + {add} FROM generate_series({lo}, {hi}) AS t(g)"
                ),
                lo,
                hi,
                before: None,
                after: Some(add),
            };
        }
        let i = self.rng.below(self.ranges.len() as u64) as usize;
        let r = self.ranges[i];
        let (lo, hi) = (r.lo, r.hi);
        if roll.is_multiple_of(2) {
            let by = 1 + self.rng.below(5) as i64;
            return Statement {
                sql: format!("UPDATE big SET v = v + {by} WHERE id BETWEEN {lo} AND {hi}"),
                lo,
                hi,
                before: Some(r.add),
                after: Some(r.add + by),
            };
        }
        Statement {
            sql: format!("DELETE FROM big WHERE id BETWEEN {lo} AND {hi}"),
            lo,
            hi,
            before: Some(r.add),
            after: None,
        }
    }

    fn apply(&mut self, s: &Statement) {
        self.ranges.retain(|r| r.lo != s.lo);
        if let Some(add) = s.after {
            let (lo, hi) = (s.lo, s.hi);
            self.ranges.push(Range { lo, hi, add });
            self.ranges.sort_by_key(|r| r.lo);
        }
    }
}

impl super::Writer for Large {
    type Statement = Statement;
    /// A large statement in a debug build takes about a second: up to a minute on a busy
    /// machine.
    const ANSWER_WITHIN: Duration = Duration::from_secs(120);
    const SETTINGS: Option<&'static str> = Some(SETTINGS);

    fn next_statement(&mut self) -> Statement {
        self.next()
    }

    fn sql(statement: &Statement) -> &str {
        &statement.sql
    }

    fn acknowledged(&mut self, statement: &Statement) {
        self.apply(statement);
    }
}

/// Decides a large statement the kill interrupted from the rows of its range in Weir: every
/// one as it was before (not applied), or every one as it is after (applied: PostgreSQL and
/// the writer apply it too). Anything else is a statement applied in part. Returns whether it
/// was applied.
pub(super) async fn resolve(
    weir: &Client,
    pg: &Client,
    large: &mut Large,
    s: &Statement,
) -> Result<bool, String> {
    let query = format!(
        "SELECT count(*), count(CASE WHEN v = id % 1000 + {} THEN 1 END), \
         count(CASE WHEN v = id % 1000 + {} THEN 1 END) FROM big WHERE id BETWEEN {} AND {}",
        s.before.unwrap_or(NONE),
        s.after.unwrap_or(NONE),
        s.lo,
        s.hi
    );
    let found: Vec<i64> = rows(weir, &query)
        .await
        .map_err(|e| format!("weir: {query}: {e}"))?
        .first()
        .map(|r| {
            r.iter()
                .map(|c| c.as_deref().and_then(|t| t.parse().ok()).unwrap_or(-1))
                .collect()
        })
        .unwrap_or_default();
    let n = s.hi - s.lo + 1;
    let whole = |add: Option<i64>| if add.is_some() { n } else { 0 };
    let applied = if found == [whole(s.before), whole(s.before), 0] {
        false
    } else if found == [whole(s.after), 0, whole(s.after)] {
        true
    } else {
        return Err(format!(
            "a large statement in doubt was applied in part: {}; of its {n} rows weir holds \
             {:?} (all, as before, as after)",
            s.sql, found
        ));
    };
    if applied {
        exec(pg, &s.sql)
            .await
            .map_err(|e| format!("postgres: {}: {e}", s.sql))?;
        large.apply(s);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stay_two_at_most_and_every_statement_is_past_the_memory_bound() {
        let mut large = Large::new(7);
        let mut kinds = [0; 3];
        for _ in 0..200 {
            let s = large.next();
            assert!(s.hi - s.lo + 1 >= ROWS_MIN as i64, "{s:?}");
            kinds[usize::from(s.before.is_some()) + usize::from(s.after.is_none())] += 1;
            large.apply(&s);
            assert!(large.ranges.len() <= 2);
            assert!(large
                .ranges
                .iter()
                .all(|r| r.hi - r.lo + 1 >= ROWS_MIN as i64));
        }
        assert!(
            kinds.iter().all(|k| *k > 20),
            "inserts, updates, deletes: {kinds:?}"
        );
    }
}
