//! Long and deep statements against the real binary (its runtime and its thread stacks):
//! long lists and chains plan and run, nesting past the documented limits gets 54001, and
//! the server stays up throughout. `docs/sql.md` documents the limits.

mod common;

use common::{text_rows, ChildServer};

/// `SELECT 1 + 1 + ...` with `n` terms: a left-deep tree `n` levels deep.
fn sum_of_ones(n: usize) -> String {
    format!("SELECT {}", vec!["1"; n].join(" + "))
}

/// `x = 0 OR x = 1 OR ...`, as ORMs write a set of values.
fn or_chain(n: usize) -> String {
    (0..n)
        .map(|i| format!("x = {i}"))
        .collect::<Vec<_>>()
        .join(" OR ")
}

async fn refused(client: &tokio_postgres::Client, sql: &str, what: &str) {
    let err = client
        .simple_query(sql)
        .await
        .err()
        .unwrap_or_else(|| panic!("{what} was accepted"));
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("{what}: not an ErrorResponse: {err}"));
    assert_eq!(db.code().code(), "54001", "{what}: {}", db.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_statements_run_and_deep_ones_get_54001() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE t (x int); \
         INSERT INTO t SELECT g FROM generate_series(1, 20000) AS s(g); \
         FLUSH",
    )
    .await
    .unwrap();

    // Long lists and chains of 10 000: in queries, in a view's definition, in DML.
    let in_list = (0..10_000)
        .map(|i| (i * 2 + 1).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        text_rows(
            &c,
            &format!("SELECT count(*) FROM t WHERE x IN ({in_list})")
        )
        .await,
        ["10000"]
    );
    let ors = or_chain(10_000);
    assert_eq!(
        text_rows(&c, &format!("SELECT count(*) FROM t WHERE {ors}")).await,
        ["9999"]
    );
    let ands = (0..10_000)
        .map(|i| format!("x <> {}", i * 2))
        .collect::<Vec<_>>()
        .join(" AND ");
    assert_eq!(
        text_rows(&c, &format!("SELECT count(*) FROM t WHERE {ands}")).await,
        ["10001"]
    );
    assert_eq!(text_rows(&c, &sum_of_ones(10_000)).await, ["10000"]);
    // Through the extended protocol too (Parse, Bind, Execute).
    let row = c.query_one(&sum_of_ones(1_000), &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1_000);
    let chained = format!("SELECT max(x {}) FROM t", "+ 1 ".repeat(1_000));
    assert_eq!(text_rows(&c, &chained).await, ["21000"]);

    let case = format!(
        "SELECT sum(CASE {} ELSE 0 END) FROM t WHERE x <= 1000",
        (1..=1_000)
            .map(|i| format!("WHEN x = {i} THEN {i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert_eq!(text_rows(&c, &case).await, ["500500"]);

    c.batch_execute(&format!(
        "CREATE MATERIALIZED VIEW v AS SELECT count(*) AS n FROM t WHERE {ors}"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!(
        "INSERT INTO t VALUES ({}); FLUSH",
        vec!["1"; 5_000].join(" + ")
    ))
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT n FROM v").await, ["10000"]);

    // Nesting up to the limit of 1 000 runs; one level more is refused.
    let nested = |n: usize| {
        format!(
            "SELECT {}x{} FROM t WHERE x = 3",
            "(".repeat(n),
            ")".repeat(n)
        )
    };
    assert_eq!(text_rows(&c, &nested(1_000)).await, ["3"]);
    refused(&c, &nested(1_001), "1 001 parentheses").await;
    let negated = |n: usize| format!("SELECT {}x FROM t WHERE x = 3", "- ".repeat(n));
    assert_eq!(text_rows(&c, &negated(1_000)).await, ["3"]);
    refused(&c, &negated(1_001), "1 001 unary minus").await;
    let cases = |n: usize| {
        format!(
            "SELECT {}x{} FROM t WHERE x = 3",
            "CASE WHEN x > 0 THEN ".repeat(n),
            " END".repeat(n)
        )
    };
    assert_eq!(text_rows(&c, &cases(1_000)).await, ["3"]);
    refused(&c, &cases(1_001), "1 001 nested CASE").await;

    // Far past every limit, in every position a recursive pass could meet it.
    let far = 100_000;
    refused(&c, &nested(far), "parentheses").await;
    refused(&c, &sum_of_ones(far), "a chain of 100 000").await;
    refused(&c, &format!("SELECT {}1", "NOT ".repeat(far)), "NOT").await;
    refused(&c, &format!("SELECT 1{}", "::int".repeat(far)), "casts").await;
    refused(
        &c,
        &format!("SELECT x{} FROM t", " IS NULL".repeat(far)),
        "IS NULL",
    )
    .await;
    refused(
        &c,
        &format!("SELECT {}1{}", "ARRAY[".repeat(far), "]".repeat(far)),
        "arrays",
    )
    .await;
    refused(
        &c,
        &format!(
            "SELECT * FROM {}t{}",
            "(SELECT * FROM ".repeat(far),
            ") s".repeat(far)
        ),
        "subqueries in FROM",
    )
    .await;
    refused(
        &c,
        &format!(
            "SELECT {}1{}",
            "EXISTS (SELECT ".repeat(100),
            ")".repeat(100)
        ),
        "subqueries in expressions",
    )
    .await;
    refused(
        &c,
        &format!("SELECT {}x{} FROM t", "abs(".repeat(far), ")".repeat(far)),
        "function calls",
    )
    .await;
    refused(
        &c,
        &format!("SELECT {}", vec!["1"; far].join(" UNION ALL SELECT ")),
        "UNION ALL",
    )
    .await;
    refused(
        &c,
        &format!(
            "CREATE MATERIALIZED VIEW w AS SELECT x FROM t WHERE {}",
            sum_of_ones(far).replace("SELECT ", "x = ")
        ),
        "a view's definition",
    )
    .await;

    // Nothing above took the server down or left it unable to answer.
    assert_eq!(text_rows(&c, "SELECT count(*) FROM t").await, ["20001"]);
    let fresh = server.connect().await;
    assert_eq!(text_rows(&fresh, "SELECT n FROM v").await, ["10000"]);
}

/// How a generated expression wraps the one inside it.
#[derive(Clone, Copy)]
enum Wrap {
    /// A group: `(e)`, `abs(e)`, `coalesce(e, 0)`, `CASE WHEN true THEN e END`, `nullif(e, 99)`.
    Group(&'static str, &'static str),
    /// A prefix operator: `- e`, `+ e`.
    Prefix(&'static str),
    /// A scalar subquery: `(SELECT e)`.
    Subquery,
    /// One more link of a chain: `e + 1`, `e::int`, `e * 1`.
    Link(&'static str),
}

const WRAPS: &[Wrap] = &[
    Wrap::Group("(", ")"),
    Wrap::Group("abs(", ")"),
    Wrap::Group("coalesce(", ", 0)"),
    Wrap::Group("CASE WHEN true THEN ", " END"),
    Wrap::Group("nullif(", ", 99)"),
    Wrap::Prefix("- "),
    Wrap::Prefix("+ "),
    Wrap::Subquery,
    Wrap::Link(" + 1"),
    Wrap::Link("::int"),
    Wrap::Link(" * 1"),
];

/// What a generated expression nests, and how large the planner's copies of it grow.
#[derive(Debug, Default)]
struct Nesting {
    /// Groups, subqueries included.
    groups: usize,
    subqueries: usize,
    /// The longest run of prefix operators.
    prefix_run: usize,
    /// Nodes, counting the copies the planner makes of `coalesce`'s first argument.
    copied: u64,
}

impl Nesting {
    /// Past a documented limit: 54001 for certain.
    fn over(&self) -> bool {
        self.groups > 1_000
            || self.subqueries > 16
            || self.prefix_run > 1_000
            || self.copied > 2_000_000
    }

    /// Within every limit with room to spare: never 54001.
    fn within(&self) -> bool {
        self.groups <= 1_000
            && self.subqueries <= 16
            && self.prefix_run <= 1_000
            && self.copied <= 500_000
    }
}

/// A random expression of random runs of wraps around `3`, and what it nests.
fn deep_expression(rng: &mut weir::rng::Rng, levels: usize) -> (String, Nesting) {
    let (mut prefix, mut suffix) = (String::new(), String::new());
    let mut nesting = Nesting {
        copied: 1,
        ..Nesting::default()
    };
    let mut run = 0;
    let mut left = levels;
    while left > 0 {
        let wrap = *rng.pick(WRAPS);
        // Subqueries wrap small expressions only: DataFusion plans nested function calls in
        // time cubic in their depth, once more per enclosing subquery (12 subqueries around
        // 300 nested calls take 40 s in a debug build), which is slow but not unsafe.
        if matches!(wrap, Wrap::Subquery) && levels - left > 100 {
            continue;
        }
        let n = (1 + rng.below(left as u64 / 2 + 1) as usize).min(left);
        left -= n;
        for _ in 0..n {
            let (before, after) = match wrap {
                Wrap::Group(b, a) => (b, a),
                Wrap::Prefix(p) => (p, ""),
                Wrap::Subquery => ("(SELECT ", ")"),
                Wrap::Link(l) => ("", l),
            };
            // Wrapped from the inside out: the prefix grows leftwards.
            prefix.insert_str(0, before);
            suffix.push_str(after);
            match wrap {
                Wrap::Prefix(_) => {
                    run += 1;
                    nesting.prefix_run = nesting.prefix_run.max(run);
                }
                Wrap::Link(_) => {}
                _ => run = 0,
            }
            nesting.groups += matches!(wrap, Wrap::Group(..) | Wrap::Subquery) as usize;
            nesting.subqueries += matches!(wrap, Wrap::Subquery) as usize;
            nesting.copied = match wrap {
                Wrap::Group("coalesce(", _) => nesting.copied.saturating_mul(2).saturating_add(2),
                _ => nesting.copied.saturating_add(2),
            };
        }
    }
    (format!("{prefix}3{suffix}"), nesting)
}

/// Random deep expressions against the real binary: nothing takes the server down or ends
/// in an internal error; nesting within the limits is never refused as too complex, nesting
/// past them always is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_deep_expressions_never_take_the_server_down() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let c = server.connect().await;
    c.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (3); FLUSH")
        .await
        .unwrap();
    let mut rng = weir::rng::Rng::new(0xdee9_5eed);
    let (mut ran, mut refused, mut failed) = (0, 0, 0);
    for i in 0..200 {
        // Levels from 1 to 2 000, spread evenly over their logarithm.
        let levels = (2000f64.powf(rng.below(1001) as f64 / 1000.0)) as usize;
        let (expr, nesting) = deep_expression(&mut rng, levels);
        let sql = format!("SELECT {expr} FROM t WHERE x = 3");
        match c.simple_query(&sql).await {
            Ok(_) => {
                assert!(!nesting.over(), "case {i} ran: {nesting:?}");
                ran += 1;
            }
            Err(e) => {
                let db = e.as_db_error().unwrap_or_else(|| {
                    panic!("case {i} ({levels} levels) broke the connection: {e}")
                });
                let code = db.code().code();
                assert_ne!(code, "XX000", "case {i}: internal error: {}", db.message());
                if code == "54001" {
                    assert!(
                        !nesting.within(),
                        "case {i} was refused: {nesting:?}: {}",
                        db.message()
                    );
                    refused += 1;
                } else {
                    assert!(!nesting.over(), "case {i}: {code}, not 54001: {nesting:?}");
                    failed += 1;
                }
            }
        }
    }
    eprintln!("{ran} ran, {refused} refused as too complex, {failed} failed otherwise");
    assert!(
        ran > 0 && refused > 0,
        "the generator should reach both sides of the limits"
    );
    assert_eq!(text_rows(&c, "SELECT x FROM t").await, ["3"]);
}
