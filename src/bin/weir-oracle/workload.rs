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
    /// Inner, left, right and full joins of two or three tables (or a table with itself, or
    /// with a grouped view), on equal keys with an extra condition at times.
    Join,
    /// A join under GROUP BY.
    JoinGroupBy,
    /// IN, EXISTS, NOT EXISTS and correlated scalar subqueries.
    Subquery,
    /// UNION [ALL], INTERSECT, EXCEPT.
    SetOperation,
    /// SELECT DISTINCT, DISTINCT and FILTER aggregates, BOOL_AND/BOOL_OR.
    Distinct,
    /// ORDER BY ... LIMIT [OFFSET], and ROW_NUMBER / RANK / DENSE_RANK per partition.
    TopN,
    /// TUMBLE and HOP windows under GROUP BY; PostgreSQL runs the same windows written with
    /// date_bin and generate_series.
    Window,
    /// Conditions on now(). The generated times are on 2024-01-01 and the bounds years away
    /// from them, so both servers agree whenever the test runs: the family checks that rows
    /// pass through temporal filters under every kind of change, not the passing of time
    /// (tests/server.rs moves a manual clock for that).
    Temporal,
}

/// A SELECT in parts, so that the shrinker can drop clauses.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub select: Vec<String>,
    pub from: String,
    pub filter: Option<String>,
    pub group_by: Vec<String>,
    pub having: Option<String>,
    /// A set operation with a second query: `UNION ALL`, `EXCEPT` and so on.
    pub then: Option<(String, Box<Query>)>,
    /// `ORDER BY ... LIMIT ...`.
    pub order_limit: Option<String>,
    /// What PostgreSQL reads instead of `from`, when Weir's form has no PostgreSQL spelling.
    pub postgres_from: Option<String>,
}

impl Query {
    pub fn sql(&self) -> String {
        self.sql_for(false)
    }

    /// The query as Weir reads it, or as PostgreSQL does.
    pub fn sql_for(&self, postgres: bool) -> String {
        let from = match (&self.postgres_from, postgres) {
            (Some(f), true) => f,
            _ => &self.from,
        };
        let mut sql = format!("SELECT {} FROM {from}", self.select.join(", "));
        if let Some(f) = &self.filter {
            sql += &format!(" WHERE {f}");
        }
        if !self.group_by.is_empty() {
            sql += &format!(" GROUP BY {}", self.group_by.join(", "));
        }
        if let Some(h) = &self.having {
            sql += &format!(" HAVING {h}");
        }
        if let Some((op, other)) = &self.then {
            sql += &format!(" {op} {}", other.sql_for(postgres));
        }
        if let Some(tail) = &self.order_limit {
            sql += &format!(" {tail}");
        }
        sql
    }

    fn grouped_by(self, key: &str) -> Query {
        Query {
            group_by: vec![key.to_string()],
            ..self
        }
    }

    fn simple(select: Vec<String>, from: String, filter: Option<String>) -> Query {
        Query {
            select,
            from,
            filter,
            group_by: vec![],
            having: None,
            then: None,
            order_limit: None,
            postgres_from: None,
        }
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
                query.sql_for(postgres)
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
        match self.rng.below(21) {
            0 | 1 => {
                let mut select = vec!["k".to_string(), "g".to_string()];
                let count = 2 + self.rng.below(6) as usize;
                select.extend(self.some(PROJECTIONS, count));
                let query = Query::simple(select, self.table(), self.filter());
                (query, Family::Project)
            }
            2..=4 => (self.grouped(), Family::GroupBy),
            5 => {
                let mut select = vec!["count(*) AS c".to_string()];
                let count = 1 + self.rng.below(5) as usize;
                select.extend(self.some(AGGREGATES, count));
                let query = Query::simple(select, self.table(), self.filter());
                (query, Family::Global)
            }
            6 => match self.on_view() {
                Some(q) => (q, Family::OnView),
                None => self.view(),
            },
            7 | 8 => (self.join(), Family::Join),
            9 | 10 => (self.join_grouped(), Family::JoinGroupBy),
            11 | 12 => (self.subquery(), Family::Subquery),
            13 | 14 => (self.set_operation(), Family::SetOperation),
            15 | 16 => (self.top_n(), Family::TopN),
            17 | 18 => (self.window(), Family::Window),
            19 => (self.temporal(), Family::Temporal),
            _ => (self.distinct(), Family::Distinct),
        }
    }

    fn grouped(&mut self) -> Query {
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
        Query {
            group_by: keys.iter().map(|(e, _)| e.to_string()).collect(),
            having,
            ..Query::simple(select, self.table(), self.filter())
        }
    }

    /// `a <kind> JOIN b ON ...`, sometimes a third table, sometimes a grouped view as `b`.
    fn join_from(&mut self) -> String {
        let kind = *self
            .rng
            .pick(&["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]);
        let on = *self.rng.pick(&[
            "a.k = b.k",
            "a.g = b.g",
            "a.s = b.s",
            "a.g = b.g AND a.b = b.b",
            "a.k = b.k AND a.v < b.v",
            "a.g = b.g AND a.n > b.n",
            "a.k = b.k AND (a.s IS NULL OR b.s <> a.s)",
        ]);
        let a = self.table();
        let b = self.table();
        let mut from = format!("{a} a {kind} {b} b ON {on}");
        if self.rng.chance(25) {
            let kind = *self.rng.pick(&["JOIN", "LEFT JOIN"]);
            let on = *self.rng.pick(&["c.k = b.k", "c.k = a.k AND c.g = b.g"]);
            from += &format!(" {kind} {} c ON {on}", self.table());
        }
        from
    }

    fn join(&mut self) -> Query {
        // A grouped view keyed by g joins like a table.
        let grouped_views: Vec<String> = self
            .views
            .iter()
            .filter(|(_, q, f)| *f == Family::GroupBy && q.group_by == ["g"])
            .map(|(name, _, _)| name.clone())
            .collect();
        if !grouped_views.is_empty() && self.rng.chance(20) {
            let view = self.rng.pick(&grouped_views).clone();
            let kind = *self.rng.pick(&["JOIN", "LEFT JOIN"]);
            let select = vec!["a.k AS ak".into(), "a.v AS av".into(), "w.c AS wc".into()];
            let from = format!("{} a {kind} {view} w ON a.g = w.g", self.table());
            return Query::simple(select, from, None);
        }
        let from = self.join_from();
        let pool = [
            "a.k AS ak",
            "a.g AS ag",
            "a.v AS av",
            "a.s AS sa",
            "a.n AS an",
            "b.k AS bk",
            "b.v AS bv",
            "b.s AS sb",
            "b.dt AS bdt",
            "a.v + b.v AS vsum",
            "coalesce(b.s, a.s) AS cs",
        ];
        let count = 2 + self.rng.below(5) as usize;
        let mut select = self.some(&pool, count);
        if from.contains(" c ON ") {
            select.push("c.v AS cv".into());
        }
        let filter = match self.rng.below(4) {
            0 => Some("a.v > 0".to_string()),
            1 => Some("b.v IS NULL".to_string()),
            2 => Some("(a.g IS NULL OR b.k > 10)".to_string()),
            _ => None,
        };
        Query::simple(select, from, filter)
    }

    fn join_grouped(&mut self) -> Query {
        let from = self.join_from();
        let key = *self.rng.pick(&["a.g", "b.g", "a.b", "b.s"]);
        let mut select = vec![key.to_string(), "count(*) AS c".to_string()];
        let pool = [
            "count(b.k) AS cb",
            "sum(a.v) AS sa",
            "sum(b.n) AS sn",
            "min(b.s) AS ms",
            "max(a.dt) AS md",
            "count(DISTINCT b.g) AS dg",
        ];
        let count = 1 + self.rng.below(4) as usize;
        select.extend(self.some(&pool, count));
        Query {
            group_by: vec![key.to_string()],
            having: self.rng.chance(25).then(|| "count(*) > 1".to_string()),
            ..Query::simple(select, from, None)
        }
    }

    fn subquery(&mut self) -> Query {
        let (a, b) = (self.table(), self.table());
        let x = self.rng.below(3) as i64 - 1;
        match self.rng.below(6) {
            0 => Query::simple(
                vec!["k".into(), "g".into(), "v".into()],
                a,
                Some(format!("g IN (SELECT g FROM {b} WHERE v > {x})")),
            ),
            1 => Query::simple(
                vec!["a.k".into(), "a.s".into()],
                format!("{a} a"),
                Some(format!(
                    "EXISTS (SELECT 1 FROM {b} b WHERE b.k = a.k AND b.v > a.v)"
                )),
            ),
            2 => Query::simple(
                vec!["a.k".into(), "a.g".into()],
                format!("{a} a"),
                Some(format!("NOT EXISTS (SELECT 1 FROM {b} b WHERE b.g = a.g)")),
            ),
            3 => Query::simple(
                vec![
                    "a.k".into(),
                    format!("(SELECT max(b.v) FROM {b} b WHERE b.k = a.k) AS mv"),
                ],
                format!("{a} a"),
                None,
            ),
            4 => Query::simple(
                vec![
                    "a.k".into(),
                    format!("(SELECT count(*) FROM {b} b WHERE b.g = a.g) AS c"),
                ],
                format!("{a} a"),
                self.rng.chance(50).then(|| "a.v > 0".to_string()),
            ),
            _ => Query::simple(
                vec!["a.g".into(), "count(*) AS c".into()],
                format!("{a} a"),
                Some(format!(
                    "a.s IN (SELECT s FROM {b} WHERE b) AND NOT EXISTS (SELECT 1 FROM {b} b WHERE b.k = a.k AND b.v = a.v)"
                )),
            )
            .grouped_by("a.g"),
        }
    }

    fn set_operation(&mut self) -> Query {
        let choices: [&[&str]; 3] = [&["g", "s"], &["k"], &["b", "dt"]];
        let columns = *self.rng.pick(&choices);
        // EXCEPT ALL and INTERSECT ALL are refused (see sql-tests/set_operations.slt).
        let op = *self
            .rng
            .pick(&["UNION ALL", "UNION", "INTERSECT", "EXCEPT"]);
        let select: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        let second = Query::simple(select.clone(), self.table(), self.filter());
        Query {
            then: Some((op.to_string(), Box::new(second))),
            ..Query::simple(select, self.table(), self.filter())
        }
    }

    /// Every output column is in the ordering (or is the rank), so that ties cannot make the
    /// result depend on which of two equal rows comes first.
    fn top_n(&mut self) -> Query {
        let n = 1 + self.rng.below(4);
        let filter = self.filter();
        let table = self.table();
        match self.rng.below(3) {
            0 => {
                let offset = if self.rng.chance(30) {
                    format!(" OFFSET {}", self.rng.below(3))
                } else {
                    String::new()
                };
                let direction = *self.rng.pick(&["DESC NULLS LAST", "ASC", "DESC"]);
                Query {
                    order_limit: Some(format!("ORDER BY v {direction}, k, g LIMIT {n}{offset}")),
                    ..Query::simple(vec!["k".into(), "g".into(), "v".into()], table, filter)
                }
            }
            1 => {
                let inner = Query::simple(
                    vec![
                        "k".into(),
                        "g".into(),
                        "v".into(),
                        "s".into(),
                        "row_number() OVER (PARTITION BY g ORDER BY v DESC, k, s) AS rn".into(),
                    ],
                    table,
                    filter,
                );
                Query::simple(
                    vec!["*".into()],
                    format!("({}) x", inner.sql()),
                    Some(format!("rn <= {n}")),
                )
            }
            _ => {
                let function = *self.rng.pick(&["rank", "dense_rank"]);
                let inner = Query::simple(
                    vec![
                        "g".into(),
                        "v".into(),
                        format!("{function}() OVER (PARTITION BY g ORDER BY v) AS r"),
                    ],
                    table,
                    filter,
                );
                Query::simple(
                    vec!["g".into(), "v".into(), "r".into()],
                    format!("({}) x", inner.sql()),
                    Some(format!("r <= {n}")),
                )
            }
        }
    }

    fn window(&mut self) -> Query {
        let table = self.table();
        const ORIGIN: &str = "TIMESTAMP '1970-01-01 00:00:00'";
        let (from, postgres_from) = if self.rng.chance(50) {
            let size = *self.rng.pick(&["10 minutes", "15 minutes", "1 hour"]);
            (
                format!("TUMBLE({table}, ts, INTERVAL '{size}')"),
                format!(
                    "(SELECT *, date_bin(INTERVAL '{size}', ts, {ORIGIN}) AS window_start, \
                     date_bin(INTERVAL '{size}', ts, {ORIGIN}) + INTERVAL '{size}' AS window_end \
                     FROM {table} WHERE ts IS NOT NULL) w"
                ),
            )
        } else {
            let (slide, size, back) = *self.rng.pick(&[
                ("10 minutes", "30 minutes", "20 minutes"),
                ("15 minutes", "30 minutes", "15 minutes"),
                ("20 minutes", "1 hour", "40 minutes"),
            ]);
            (
                format!("HOP({table}, ts, INTERVAL '{slide}', INTERVAL '{size}')"),
                format!(
                    "(SELECT t.*, ws AS window_start, ws + INTERVAL '{size}' AS window_end \
                     FROM {table} t, generate_series(date_bin(INTERVAL '{slide}', ts, {ORIGIN}) - \
                     INTERVAL '{back}', date_bin(INTERVAL '{slide}', ts, {ORIGIN}), \
                     INTERVAL '{slide}') AS ws) w"
                ),
            )
        };
        let keys: &[&str] = if self.rng.chance(50) {
            &["window_start", "window_end"]
        } else {
            &["window_start", "g"]
        };
        let mut select: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        select.push("count(*) AS c".into());
        let count = 1 + self.rng.below(3) as usize;
        select.extend(self.some(AGGREGATES, count));
        Query {
            group_by: keys.iter().map(|k| k.to_string()).collect(),
            postgres_from: Some(postgres_from),
            ..Query::simple(select, from, self.filter())
        }
    }

    fn temporal(&mut self) -> Query {
        let condition = *self.rng.pick(&[
            "ts > now() - INTERVAL '20000 days'",
            "now() - INTERVAL '20000 days' <= ts",
            "ts < now() + INTERVAL '1 hour'",
            "ts > now() - INTERVAL '1 day'",
            "ts <= current_timestamp - INTERVAL '10 minutes'",
        ]);
        let table = self.table();
        let filter = Some(match self.filter() {
            Some(f) => format!("{condition} AND {f}"),
            None => condition.to_string(),
        });
        if self.rng.chance(50) {
            Query::simple(vec!["k".into(), "g".into(), "ts".into()], table, filter)
        } else {
            Query {
                group_by: vec!["g".into()],
                ..Query::simple(
                    vec!["g".into(), "count(*) AS c".into(), "sum(v) AS sv".into()],
                    table,
                    filter,
                )
            }
        }
    }

    fn distinct(&mut self) -> Query {
        if self.rng.chance(40) {
            let choices: [&[&str]; 3] = [&["g", "b"], &["s"], &["g % 2 AS parity", "dt"]];
            let columns = *self.rng.pick(&choices);
            let select: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
            let mut q = Query::simple(select, self.table(), self.filter());
            q.select[0] = format!("DISTINCT {}", q.select[0]);
            return q;
        }
        let pool = [
            "count(DISTINCT s) AS ds",
            "sum(DISTINCT v) AS sv",
            "count(DISTINCT v) FILTER (WHERE b) AS cvb",
            "count(*) FILTER (WHERE v > 0) AS pos",
            "sum(n) FILTER (WHERE s IS NOT NULL) AS sn",
            "min(s) FILTER (WHERE v < 0) AS ms",
            "bool_and(b) AS ball",
            "bool_or(v > 5) AS bany",
            "avg(DISTINCT v)::double precision AS adv",
        ];
        let count = 1 + self.rng.below(4) as usize;
        let mut select = vec!["g".to_string()];
        select.extend(self.some(&pool, count));
        Query {
            group_by: vec!["g".into()],
            ..Query::simple(select, self.table(), self.filter())
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
                group_by: vec!["g".into()],
                ..Query::simple(
                    vec![
                        "g".into(),
                        "count(*) AS c".into(),
                        "max(k) AS mk".into(),
                        "sum(k) AS sk".into(),
                    ],
                    name,
                    self.rng.chance(50).then(|| "k > 10".to_string()),
                )
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
                Query::simple(select, name, Some(format!("c > {}", self.rng.below(3))))
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
