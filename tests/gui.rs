//! What GUI and BI tools send when they connect and browse, replayed against Weir and a real
//! PostgreSQL 15 side by side: Grafana's PostgreSQL data source, Metabase (with pgJDBC's
//! DatabaseMetaData queries), DBeaver, SQLAlchemy as Superset uses it, and pgAdmin 4. The
//! statements are in `tests/gui/*.sql`, each after the `-- source:` line that cites the tool's
//! code it comes from. Tools read results by column name, so every statement must succeed on
//! Weir with PostgreSQL's column names, and, prepared (as pgJDBC and DBeaver send them), with
//! PostgreSQL's column types. A statement that reads only the fixture's relations (the data a
//! dashboard shows) must return PostgreSQL's rows too.

mod common;
#[allow(dead_code)]
#[path = "../src/bin/weir-oracle/postgres.rs"]
mod postgres;

use common::{connect, TestServer};
use postgres::Postgres;
use tokio_postgres::{Client, SimpleQueryMessage};

/// PostgreSQL's fixture, the one the corpus was recorded against (`tests/gui/README.md`).
const PG_FIXTURE: &str = "
CREATE TABLE public.customers (id integer PRIMARY KEY, name text NOT NULL, email varchar(200));
CREATE TABLE public.orders (id bigserial PRIMARY KEY, customer_id integer REFERENCES public.customers(id),
  amount numeric(12,2) NOT NULL DEFAULT 0, status text, created_at timestamptz NOT NULL DEFAULT now());
COMMENT ON TABLE public.orders IS 'orders fixture';
CREATE INDEX orders_created_at_idx ON public.orders (created_at);
CREATE VIEW public.orders_view AS SELECT id, amount, created_at FROM public.orders WHERE status = 'paid';
CREATE MATERIALIZED VIEW public.orders_daily AS
  SELECT date_trunc('day', created_at) AS day, sum(amount) AS total FROM public.orders GROUP BY 1;
";

/// Weir's: the same relations and columns, without what Weir does not have yet (foreign keys,
/// defaults, secondary indexes, comments and plain views: `orders_view` is materialized).
const WEIR_FIXTURE: &str = "
CREATE TABLE public.customers (id integer PRIMARY KEY, name text NOT NULL, email varchar(200));
CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id integer,
  amount numeric(12,2) NOT NULL, status text, created_at timestamptz NOT NULL);
CREATE MATERIALIZED VIEW public.orders_view AS SELECT id, amount, created_at FROM public.orders WHERE status = 'paid';
CREATE MATERIALIZED VIEW public.orders_daily AS
  SELECT date_trunc('day', created_at) AS day, sum(amount) AS total FROM public.orders GROUP BY 1;
";

/// The rows both hold: orders inside and outside the dashboard's range (2024-01-01 00:00 to
/// 06:00 UTC), in several minutes and five-minute buckets.
const ROWS: &str = "
INSERT INTO public.customers VALUES (1, 'ann', 'ann@example.com'), (2, 'bob', NULL);
INSERT INTO public.orders VALUES
  (1, 1, 10.50, 'paid', '2024-01-01 00:00:10+00'),
  (2, 1, 4.25, 'paid', '2024-01-01 00:00:50+00'),
  (3, 2, 7.00, 'open', '2024-01-01 00:03:00+00'),
  (4, 2, 1.99, 'paid', '2024-01-01 00:07:30+00'),
  (5, NULL, 100.00, 'paid', '2024-01-01 05:59:59+00'),
  (6, 1, 3.00, 'open', '2024-01-01 07:00:00+00'),
  (7, 2, 2.50, NULL, '2023-12-31 23:59:59+00');
REFRESH MATERIALIZED VIEW public.orders_daily;
";

/// One replayed Query message: where it comes from and its text.
struct Entry {
    file: &'static str,
    source: String,
    text: String,
}

impl Entry {
    fn name(&self) -> String {
        format!("{}: {}", self.file, self.source)
    }

    /// The statements in the message, for the extended protocol (one at a time, as JDBC
    /// prepares them), without comments.
    fn statements(&self) -> Vec<String> {
        split_statements(&self.text)
    }

    /// Whether the entry reads only the fixture's relations, so that its rows are the data's
    /// and must be PostgreSQL's.
    fn reads_only_fixture(&self) -> bool {
        let sql = self.statements().join(" ").to_lowercase();
        let fixture = ["orders", "customers"].iter().any(|t| sql.contains(t));
        let catalog = [
            "pg_",
            "information_schema",
            "current_",
            "version",
            "session_user",
            "regclass",
            "show ",
            "set ",
        ];
        fixture && !catalog.iter().any(|c| sql.contains(c))
    }
}

/// Every entry of `tests/gui/<file>`: the text from a `-- source:` line to the next one.
fn corpus(file: &'static str) -> Vec<Entry> {
    let path = format!("{}/tests/gui/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut entries: Vec<Entry> = Vec::new();
    for line in text.lines() {
        if let Some(source) = line.strip_prefix("-- source: ") {
            entries.push(Entry {
                file,
                source: source.chars().take(140).collect(),
                text: String::new(),
            });
        } else if let Some(entry) = entries.last_mut() {
            entry.text.push_str(line);
            entry.text.push('\n');
        }
    }
    assert!(!entries.is_empty(), "{path} has no entries");
    entries
}

/// The statements of `text` without comments, split at semicolons outside quotes.
fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                current.push(c);
                if c == q {
                    quote = None;
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                current.push(c);
            }
            None if c == '-' && chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                current.push('\n');
            }
            None if c == ';' => {
                statements.push(std::mem::take(&mut current));
            }
            None => current.push(c),
        }
    }
    statements.push(current);
    statements
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// What a simple Query's answer says, data aside: each result's column names, and how many
/// statements completed (an EmptyQueryResponse counts as one).
#[derive(Debug, PartialEq)]
struct Shape {
    results: Vec<Vec<String>>,
    completed: usize,
}

/// The answer to `text` sent as one Query message: its shape and its rows, or the error.
async fn simple(client: &Client, text: &str) -> Result<(Shape, Vec<Vec<Option<String>>>), String> {
    let messages = client
        .simple_query(text)
        .await
        .map_err(|e| e.as_db_error().map_or(e.to_string(), |d| d.to_string()))?;
    let mut shape = Shape {
        results: Vec::new(),
        completed: 0,
    };
    let mut rows = Vec::new();
    for m in messages {
        match m {
            SimpleQueryMessage::RowDescription(columns) => shape
                .results
                .push(columns.iter().map(|c| c.name().to_string()).collect()),
            SimpleQueryMessage::Row(row) => rows.push(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            SimpleQueryMessage::CommandComplete(_) => shape.completed += 1,
            _ => {}
        }
    }
    Ok((shape, rows))
}

/// A statement prepared and described, as JDBC sends it: its columns' names and types.
async fn described(client: &Client, sql: &str) -> Result<Vec<(String, String)>, String> {
    let statement = client
        .prepare(sql)
        .await
        .map_err(|e| e.as_db_error().map_or(e.to_string(), |d| d.to_string()))?;
    Ok(statement
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.type_().name().to_string()))
        .collect())
}

async fn setup() -> (Postgres, TestServer, Client, Client) {
    let pg = Postgres::start().expect("PostgreSQL 15 (scripts/deps installs it)");
    let admin = connect(&format!("{} dbname=postgres", pg.conn)).await;
    admin.batch_execute("CREATE DATABASE weir").await.unwrap();
    let pg_client = connect(&format!("{} dbname=weir", pg.conn)).await;
    pg_client
        .batch_execute(&format!("{PG_FIXTURE}{ROWS}"))
        .await
        .unwrap();
    let server = TestServer::start().await;
    let weir = server.connect().await;
    weir.batch_execute(WEIR_FIXTURE).await.unwrap();
    // Weir's materialized views are always up to date: no REFRESH.
    let rows = ROWS.replace("REFRESH MATERIALIZED VIEW public.orders_daily;", "FLUSH;");
    weir.batch_execute(&rows).await.unwrap();
    (pg, server, pg_client, weir)
}

/// Replays `file` on both servers; returns what differed, one line per difference.
async fn replay(file: &'static str, pg: &Client, weir: &Client) -> Vec<String> {
    let mut differences = Vec::new();
    for entry in corpus(file) {
        let name = entry.name();
        let expected = simple(pg, &entry.text)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL refused {name}: {e}"));
        match simple(weir, &entry.text).await {
            Err(e) => differences.push(format!("{name}\n  failed: {e}")),
            Ok((shape, _)) if shape != expected.0 => differences.push(format!(
                "{name}\n  columns {:?}\n  PostgreSQL's {:?}",
                shape, expected.0
            )),
            Ok((_, rows)) if entry.reads_only_fixture() && sorted(&rows) != sorted(&expected.1) => {
                differences.push(format!(
                    "{name}\n  rows {rows:?}\n  PostgreSQL's {:?}",
                    expected.1
                ))
            }
            Ok(_) => {}
        }
        let statements = entry.statements();
        if let [statement] = statements.as_slice() {
            let expected = as_weir_types(
                described(pg, statement)
                    .await
                    .unwrap_or_else(|e| panic!("PostgreSQL refused to prepare {name}: {e}")),
            );
            match described(weir, statement).await {
                Err(e) => differences.push(format!("{name}\n  prepare failed: {e}")),
                Ok(columns) if columns != expected => differences.push(format!(
                    "{name}\n  described {columns:?}\n  PostgreSQL's {expected:?}"
                )),
                Ok(_) => {}
            }
        }
    }
    differences
}

/// Where Weir still answers a replayed statement otherwise than PostgreSQL: (file, part of
/// the entry's source line, part of the difference, why). Each must still occur, so that the
/// list shrinks as Weir catches up.
const KNOWN: &[(&str, &str, &str, &str)] = &[
    (
        "grafana.sql",
        "macros.go",
        "(\"time\", \"float8\")",
        "EXTRACT is double precision in Weir (date_part's type), numeric in PostgreSQL 14+; \
         the values are the same for whole seconds",
    ),
    (
        "pgadmin4.sql",
        "(_set_user_info)",
        "column \"oid\" does not exist",
        "a recursive CTE inside ARRAY(...) that reads the outer row",
    ),
    (
        "pgadmin4.sql",
        "tables/sql/default/properties.sql",
        "(\"typname\", \"text\")",
        "a CASE of text and name, which PostgreSQL resolves to name",
    ),
    (
        "pgadmin4.sql",
        "columns/sql/default/properties.sql",
        "Correlated scalar subquery can only be used in Projection, Filter, Aggregate",
        "a correlated scalar subquery in a join's condition",
    ),
    (
        "pgadmin4.sql",
        "columns/sql/default/properties.sql",
        "(\"typnspname\", \"text\")",
        "a correlated scalar subquery's name column, which the described plan does not trace",
    ),
    (
        "pgadmin4.sql",
        "sql/default/nodes.sql",
        "column \"tableoid\" does not exist",
        "system columns (tableoid): Weir's catalog tables have only their visible columns",
    ),
    (
        "pgadmin4.sql",
        "index_constraint/sql/15_plus/properties",
        "column \"tableoid\" does not exist",
        "system columns (tableoid)",
    ),
    (
        "pgadmin4.sql",
        "views/pg/15_plus/sql/properties.sql",
        "column \"xmin\" does not exist",
        "system columns (xmin)",
    ),
];

/// Grafana, Metabase (with pgJDBC's metadata queries), DBeaver and SQLAlchemy (Superset)
/// connect and browse as they do with PostgreSQL, but for `KNOWN`'s; so does pgAdmin, but for
/// `KNOWN`'s more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gui_and_bi_tools_browse_weir_as_they_browse_postgresql() {
    let (_pg, _server, pg, weir) = setup().await;
    let mut differences = Vec::new();
    for file in [
        "grafana.sql",
        "metabase.sql",
        "dbeaver.sql",
        "sqlalchemy.sql",
        "pgadmin4.sql",
    ] {
        differences.extend(replay(file, &pg, &weir).await);
    }
    let known = |d: &String, (file, source, difference, _): &(&str, &str, &str, &str)| {
        let (name, rest) = d.split_once('\n').unwrap_or((d, ""));
        name.starts_with(file) && name.contains(source) && rest.contains(difference)
    };
    let unknown: Vec<&String> = (differences.iter())
        .filter(|d| !KNOWN.iter().any(|k| known(d, k)))
        .collect();
    assert!(
        unknown.is_empty(),
        "{} differences:\n{}",
        unknown.len(),
        unknown
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for k in KNOWN {
        assert!(
            differences.iter().any(|d| known(d, k)),
            "no longer differs, remove it from KNOWN: {k:?}"
        );
    }
}

/// Grafana's time-series panel over a materialized view: the `$__timeGroupAlias` and
/// `$__timeFilter` macros expanded as Grafana expands them, bucketed sums ordered by time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grafana_time_series_over_a_view_is_postgresql_s() {
    let (_pg, _server, pg, weir) = setup().await;
    let panel = "SELECT floor(extract(epoch from created_at)/300)*300 AS \"time\", \
                 sum(amount) AS \"amount\" FROM orders_view \
                 WHERE created_at BETWEEN '2024-01-01T00:00:00Z' AND '2024-01-01T06:00:00Z' \
                 GROUP BY 1 ORDER BY 1";
    let expected = simple(&pg, panel).await.unwrap();
    let got = simple(&weir, panel).await.unwrap();
    assert_eq!(got, expected);
    assert_eq!(got.1.len(), 3, "{:?}", got.1);
}

/// PostgreSQL's types that Weir's catalog columns have not, and the type they have instead.
const OTHER_TYPES: &[(&str, &str)] = &[
    // Weir has no network address types: a client's address (`pg_stat_activity`) is its text.
    ("inet", "text"),
    // A type's input and output functions are their names: Weir has no functions with OIDs,
    // which is how a `regproc` travels in binary.
    ("regproc", "text"),
];

/// PostgreSQL's description of columns with `OTHER_TYPES` replaced by Weir's.
fn as_weir_types(columns: Vec<(String, String)>) -> Vec<(String, String)> {
    (columns.into_iter())
        .map(|(column, ty)| {
            let other = OTHER_TYPES.iter().find(|(pg, _)| *pg == ty);
            (column, other.map_or(ty, |(_, ty)| ty.to_string()))
        })
        .collect()
}

/// Rows in an order of their own: a query's ORDER BY may leave ties in any order.
fn sorted(rows: &[Vec<Option<String>>]) -> Vec<Vec<Option<String>>> {
    let mut rows = rows.to_vec();
    rows.sort();
    rows
}

/// Every table Weir has in `pg_catalog` and `information_schema` has PostgreSQL 15's columns,
/// in its order and with its types (a domain's as its base type, which PostgreSQL sends), but
/// for `OTHER_TYPES`. Tools read them by name and convert values by type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_tables_have_postgresql_s_columns_and_types() {
    let (_pg, _server, pg, weir) = setup().await;
    let mut differences = Vec::new();
    for (schema, table) in weir::sql::catalog_tables() {
        let sql = format!("SELECT * FROM {schema}.{table}");
        let expected = described(&pg, &sql)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL has no {schema}.{table}: {e}"));
        let expected = as_weir_types(expected);
        match described(&weir, &sql).await {
            Ok(columns) if columns == expected => {}
            Ok(columns) => {
                let differ: Vec<String> = (columns.iter().zip(&expected))
                    .filter(|(a, b)| a != b)
                    .map(|(a, b)| format!("{a:?} (PostgreSQL's {b:?})"))
                    .collect();
                differences.push(format!(
                    "{schema}.{table}: {} columns ({} in PostgreSQL): {}",
                    columns.len(),
                    expected.len(),
                    differ.join(", ")
                ));
            }
            Err(e) => differences.push(format!("{schema}.{table}: {e}")),
        }
    }
    assert!(
        differences.is_empty(),
        "{} tables differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
}

#[test]
fn statements_split_outside_quotes_and_comments() {
    assert_eq!(
        split_statements("-- a; comment\nSET a = 'x;y'; SELECT \"b;\" -- c;\n;\n-- ping\n"),
        vec!["SET a = 'x;y'", "SELECT \"b;\""]
    );
}
