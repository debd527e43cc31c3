//! The seeded workload: tables, views from the families Weir maintains, and batches of
//! INSERT / UPDATE / DELETE with checks between them. A workload is plain data, so that the
//! shrinker can drop parts of it and replay the rest.

use weir::rng::Rng;

/// The columns every generated table has; small domains so that groups and keys collide and
/// NULLs occur.
const COLUMNS: &str = "k int, g int, v bigint, d double precision, n numeric(10,2), s text, b boolean, dt date, ts timestamp";

const NAMES: [&str; 9] = ["k", "g", "v", "d", "n", "s", "b", "dt", "ts"];

/// A kind of view; each operator Weir gains adds its family here and in `docs/testing.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// Filter and projection: arithmetic, CASE, COALESCE, string and date functions.
    Project,
    /// GROUP BY columns or expressions, with aggregates and HAVING.
    GroupBy,
    /// Aggregates without GROUP BY: one row, also over no rows.
    Global,
    /// A view over an earlier view.
    OnView,
}

/// A SELECT in parts, so that the shrinker can drop clauses.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub select: Vec<String>,
    pub from: String,
    pub filter: Option<String>,
    pub group_by: Vec<String>,
    pub having: Option<String>,
}

impl Query {
    pub fn sql(&self) -> String {
        let mut sql = format!("SELECT {} FROM {}", self.select.join(", "), self.from);
        if let Some(f) = &self.filter {
            sql += &format!(" WHERE {f}");
        }
        if !self.group_by.is_empty() {
            sql += &format!(" GROUP BY {}", self.group_by.join(", "));
        }
        if let Some(h) = &self.having {
            sql += &format!(" HAVING {h}");
        }
        sql
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateTable {
        name: String,
        primary_key: bool,
    },
    CreateView {
        name: String,
        query: Query,
        family: Family,
    },
    Insert {
        table: String,
        rows: Vec<String>,
    },
    /// Any other change: UPDATE, DELETE, INSERT ... SELECT.
    Change(String),
    /// FLUSH Weir, then compare every view with PostgreSQL's.
    Check,
}

impl Step {
    /// The statement for Weir; PostgreSQL runs the same with views as plain views (a plain
    /// view is always its query over the current data).
    pub fn sql(&self, postgres: bool) -> Option<String> {
        match self {
            Step::CreateTable { name, primary_key } => Some(format!(
                "CREATE TABLE {name} ({COLUMNS}{})",
                if *primary_key {
                    ", PRIMARY KEY (k)"
                } else {
                    ""
                }
            )),
            Step::CreateView { name, query, .. } => Some(format!(
                "CREATE {}VIEW {name} AS {}",
                if postgres { "" } else { "MATERIALIZED " },
                query.sql()
            )),
            Step::Insert { table, rows } => {
                Some(format!("INSERT INTO {table} VALUES {}", rows.join(", ")))
            }
            Step::Change(sql) => Some(sql.clone()),
            Step::Check => None,
        }
    }
}

/// The workload of one seed: 1 to 3 tables, 3 to 6 views (some created before any data, some
/// between batches so that they backfill), `batches` batches of changes, a check after every
/// third batch and after the last.
pub fn generate(seed: u64, batches: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut g = Generator {
        rng: &mut rng,
        tables: Vec::new(),
        views: Vec::new(),
    };
    let mut steps = Vec::new();
    for i in 0..1 + g.rng.below(3) {
        let name = format!("t{i}");
        steps.push(Step::CreateTable {
            name: name.clone(),
            primary_key: g.rng.chance(50),
        });
        g.tables.push(name);
    }
    let view_count = 3 + g.rng.below(4) as usize;
    let backfill_batch = 1 + g.rng.below(3) as usize;
    for batch in 0..batches {
        if (batch == 0 || batch == backfill_batch || g.rng.chance(25)) && g.views.len() < view_count
        {
            let (query, family) = g.view();
            let name = format!("v{}", g.views.len());
            g.views.push((name.clone(), query.clone(), family));
            steps.push(Step::CreateView {
                name,
                query,
                family,
            });
        }
        for _ in 0..1 + g.rng.below(4) {
            steps.push(g.change());
        }
        if batch % 3 == 2 || batch + 1 == batches {
            steps.push(Step::Check);
        }
    }
    steps
}

struct Generator<'a> {
    rng: &'a mut Rng,
    tables: Vec<String>,
    views: Vec<(String, Query, Family)>,
}

/// Projections (each with its own output name) that Weir and PostgreSQL compute alike.
const PROJECTIONS: &[&str] = &[
    "v * 2 + 1 AS v2",
    "coalesce(s, 'none') AS s2",
    "CASE WHEN v > 0 THEN 'pos' WHEN v < 0 THEN 'neg' ELSE 'zero' END AS sign",
    "nullif(g, 0) AS g0",
    "n * 2 AS n2",
    "d",
    "upper(s) AS su",
    "length(s) AS sl",
    "s || 'x' AS sx",
    "abs(v) AS av",
    "v % 3 AS vm",
    "v / 2 AS vd",
    "round(n, 1) AS nr",
    "dt + 1 AS dn",
    "b AND v > 0 AS bv",
    "NOT b AS nb",
    "g IS DISTINCT FROM 1 AS gd",
    "greatest(v, g) AS gr",
    "n::int AS ni",
    "cast(v AS text) AS vt",
    "d * 2 AS d2",
    "-v AS neg",
    "v + g AS vg",
    "n + v AS nv",
    "ts + interval '1 hour' AS th",
    "date_trunc('hour', ts) AS h",
    "substr(s, 1, 1) AS s1",
    "replace(s, 'a', 'A') AS sr",
    "n * n AS nn",
    "k::bigint * 1000000000 AS big",
    "dt",
    "ts",
    "b",
    "s",
];

/// Aggregates (with output names); `count(*) AS c` comes first in every aggregate view, so that
/// views on views can rely on it.
const AGGREGATES: &[&str] = &[
    "count(v) AS cv",
    "sum(v) AS sv",
    "min(v) AS lo",
    "max(v) AS hi",
    "sum(n) AS sn",
    "min(s) AS smin",
    "max(dt) AS dmax",
    "avg(v)::double precision AS av",
    "sum(d) AS sd",
    "max(ts) AS tmax",
    "min(n) AS nmin",
    "count(s) AS cs",
    "avg(n)::numeric(12,2) AS an",
    "sum(v * g) AS svg",
    "max(v + 1) AS hv1",
];

/// Grouping keys: the expressions and the names they have in the output.
const KEYS: &[&[(&str, &str)]] = &[
    &[("g", "g")],
    &[("s", "s")],
    &[("b", "b")],
    &[("dt", "dt")],
    &[("g", "g"), ("b", "b")],
    &[("g % 2", "parity")],
    &[("g % 2", "parity"), ("s", "s")],
];

impl Generator<'_> {
    fn table(&mut self) -> String {
        self.rng.pick(&self.tables).clone()
    }

    /// `count` items of `pool`, without repeats, in pool order.
    fn some(&mut self, pool: &[&str], count: usize) -> Vec<String> {
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < count.min(pool.len()) {
            let i = self.rng.below(pool.len() as u64) as usize;
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        chosen.sort();
        chosen.into_iter().map(|i| pool[i].to_string()).collect()
    }

    fn filter(&mut self) -> Option<String> {
        self.rng.chance(50).then(|| predicate(self.rng))
    }

    fn view(&mut self) -> (Query, Family) {
        match self.rng.below(7) {
            0 | 1 => {
                let mut select = vec!["k".to_string(), "g".to_string()];
                let count = 2 + self.rng.below(6) as usize;
                select.extend(self.some(PROJECTIONS, count));
                let query = Query {
                    select,
                    from: self.table(),
                    filter: self.filter(),
                    group_by: vec![],
                    having: None,
                };
                (query, Family::Project)
            }
            2..=4 => {
                let keys = *self.rng.pick(KEYS);
                let mut select: Vec<String> = keys
                    .iter()
                    .map(|(e, name)| {
                        if e == name {
                            e.to_string()
                        } else {
                            format!("{e} AS {name}")
                        }
                    })
                    .collect();
                select.push("count(*) AS c".into());
                let count = 1 + self.rng.below(6) as usize;
                select.extend(self.some(AGGREGATES, count));
                let having = match self.rng.below(6) {
                    0 => Some("count(*) > 1".to_string()),
                    1 => Some("sum(v) > 0".to_string()),
                    2 => Some("min(s) IS NOT NULL".to_string()),
                    _ => None,
                };
                let query = Query {
                    select,
                    from: self.table(),
                    filter: self.filter(),
                    group_by: keys.iter().map(|(e, _)| e.to_string()).collect(),
                    having,
                };
                (query, Family::GroupBy)
            }
            5 => {
                let mut select = vec!["count(*) AS c".to_string()];
                let count = 1 + self.rng.below(5) as usize;
                select.extend(self.some(AGGREGATES, count));
                let query = Query {
                    select,
                    from: self.table(),
                    filter: self.filter(),
                    group_by: vec![],
                    having: None,
                };
                (query, Family::Global)
            }
            _ => match self.on_view() {
                Some(q) => (q, Family::OnView),
                None => self.view(),
            },
        }
    }

    /// A view over an earlier grouped or projecting view, if there is one.
    fn on_view(&mut self) -> Option<Query> {
        let bases: Vec<(String, Query, Family)> = self
            .views
            .iter()
            .filter(|(_, _, f)| matches!(f, Family::GroupBy | Family::Project))
            .cloned()
            .collect();
        if bases.is_empty() {
            return None;
        }
        let (name, base, family) = self.rng.pick(&bases).clone();
        Some(match family {
            Family::Project => Query {
                select: vec![
                    "g".into(),
                    "count(*) AS c".into(),
                    "max(k) AS mk".into(),
                    "sum(k) AS sk".into(),
                ],
                from: name,
                filter: self.rng.chance(50).then(|| "k > 10".to_string()),
                group_by: vec!["g".into()],
                having: None,
            },
            _ => {
                // The base's grouping columns, by their output names.
                let keys: Vec<String> = base
                    .select
                    .iter()
                    .take_while(|s| !s.starts_with("count(*)"))
                    .map(|s| s.rsplit(' ').next().unwrap_or(s).to_string())
                    .collect();
                let mut select = keys;
                select.push("c * 2 AS c2".into());
                Query {
                    select,
                    from: name,
                    filter: Some(format!("c > {}", self.rng.below(3))),
                    group_by: vec![],
                    having: None,
                }
            }
        })
    }

    fn change(&mut self) -> Step {
        let table = self.table();
        match self.rng.below(10) {
            0..=4 => Step::Insert {
                rows: (0..1 + self.rng.below(6)).map(|_| row(self.rng)).collect(),
                table,
            },
            5 | 6 => Step::Change(format!(
                "UPDATE {table} SET g = {}, v = v + {} WHERE {}",
                value(self.rng, "g"),
                self.rng.below(5),
                predicate(self.rng)
            )),
            7 => Step::Change(format!(
                "UPDATE {table} SET s = NULL, n = n * 2 WHERE {}",
                predicate(self.rng)
            )),
            8 => Step::Change(format!("DELETE FROM {table} WHERE {}", predicate(self.rng))),
            _ => {
                if self.rng.chance(30) {
                    Step::Change(format!("DELETE FROM {table}"))
                } else {
                    let from = self.table();
                    Step::Change(format!(
                        "INSERT INTO {table} SELECT * FROM {from} WHERE {}",
                        predicate(self.rng)
                    ))
                }
            }
        }
    }
}

fn value(rng: &mut Rng, column: &str) -> String {
    if column != "k" && rng.chance(12) {
        return "NULL".into();
    }
    match column {
        "k" => rng.below(40).to_string(),
        "g" => rng.below(5).to_string(),
        "v" => (rng.below(21) as i64 - 10).to_string(),
        "d" => format!("{}.{}", rng.below(20) as i64 - 10, rng.below(4) * 25),
        "n" => format!("{}.{:02}", rng.below(200) as i64 - 100, rng.below(100)),
        "s" => format!("'{}'", rng.pick(&["a", "b", "ab", "ba", "z", ""])),
        "b" => rng.pick(&["true", "false"]).to_string(),
        "dt" => format!("'2024-01-{:02}'", 1 + rng.below(5)),
        "ts" => format!("'2024-01-01 {:02}:{:02}:00'", rng.below(3), rng.below(60)),
        _ => unreachable!("unknown column {column}"),
    }
}

fn row(rng: &mut Rng) -> String {
    let values: Vec<String> = NAMES.iter().map(|c| value(rng, c)).collect();
    format!("({})", values.join(", "))
}

fn predicate(rng: &mut Rng) -> String {
    match rng.below(7) {
        0 => format!("g = {}", rng.below(5)),
        1 => format!("v > {}", rng.below(11) as i64 - 5),
        2 => "s IS NULL".into(),
        3 => format!("n < {}", rng.below(100) as i64 - 50),
        4 => format!("k % 3 = {}", rng.below(3)),
        5 => "b".into(),
        _ => format!(
            "(g IS NULL OR v BETWEEN {} AND {})",
            -(rng.below(5) as i64),
            rng.below(5)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_workload() {
        assert_eq!(generate(3, 12), generate(3, 12));
        assert_ne!(generate(3, 12), generate(4, 12));
    }

    #[test]
    fn every_view_is_checked_and_the_run_ends_with_a_check() {
        for seed in 1..50 {
            let steps = generate(seed, 12);
            assert_eq!(steps.last(), Some(&Step::Check));
            assert!(steps.iter().any(|s| matches!(s, Step::CreateView { .. })));
        }
    }
}
