//! A statement never takes more than its share: the statements users and tools send by
//! mistake (functions that size their results from their arguments, aggregates of everything,
//! products, recursion), each against a server with a small `memory_limit`, end with their
//! result or their SQLSTATE; the server's peak resident memory stays under the limit plus a
//! fixed overhead, and another session's `SELECT 1` is answered meanwhile.
//! See `docs/design/0022-statement-resources.md`.

mod common;

use std::time::{Duration, Instant};

use common::ChildServer;

/// The server's `memory_limit`: batch queries share half of it.
const LIMIT_BYTES: u64 = 256 << 20;
/// What the server takes besides what `memory_limit` bounds: the binary and its debug
/// information, thread stacks, RocksDB's tables and buffers, allocator slack.
const OVERHEAD_BYTES: u64 = 320 << 20;
/// How long another session's `SELECT 1` may wait while a probe runs.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// A probe: a statement and how it must end, with its rows as text or with a SQLSTATE.
struct Probe {
    sql: &'static str,
    ends: Ends,
}

enum Ends {
    Rows(&'static [&'static str]),
    Code(&'static str),
}

const PROBES: &[Probe] = &[
    // A value over PostgreSQL's 1 GB limit, refused before it is built.
    Probe {
        sql: "SELECT length(repeat('x', 2000000000))",
        ends: Ends::Code("54000"),
    },
    Probe {
        sql: "SELECT length(lpad('x', 300000000))",
        ends: Ends::Code("54000"),
    },
    // Values within PostgreSQL's limit but over the statements' share.
    Probe {
        sql: "SELECT length(repeat('x', 200000000))",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT length(concat(repeat('x', 50000000), repeat('y', 50000000)))",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT length(repeat('x', 50000000) || repeat('y', 50000000))",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT length(repeat('x', 20000000) || repeat('y', 20000000))",
        ends: Ends::Rows(&["40000000"]),
    },
    Probe {
        sql: "SELECT length(concat_ws(',', repeat('x', 20000000), 'y'))",
        ends: Ends::Rows(&["20000002"]),
    },
    // A large constant repeated over every row of a batch.
    Probe {
        sql: "SELECT sum(length(repeat(repeat('x', 1000000), (g % 2)::int))) \
              FROM generate_series(1, 8192) AS t(g)",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT sum(length(repeat('x', 100000 + g % 2))) FROM generate_series(1, 20000) AS t(g)",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT length(string_agg(repeat('x', 1000), ',')) FROM generate_series(1, 300000)",
        ends: Ends::Code("53200"),
    },
    Probe {
        sql: "SELECT cardinality(array_agg(g)) FROM generate_series(1, 3000000) AS t(g)",
        ends: Ends::Rows(&["3000000"]),
    },
    Probe {
        sql: "SELECT count(DISTINCT g) FROM generate_series(1, 3000000) AS t(g)",
        ends: Ends::Rows(&["3000000"]),
    },
    Probe {
        sql: "SELECT count(*) FROM generate_series(1, 3000) AS a(x), generate_series(1, 3000) AS b(y)",
        ends: Ends::Rows(&["9000000"]),
    },
    Probe {
        sql: "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 300000) \
              SELECT count(*) FROM t",
        ends: Ends::Rows(&["300000"]),
    },
    Probe {
        sql: "SELECT sum(x) FROM (SELECT g AS x FROM generate_series(1, 3000000) AS t(g) \
              ORDER BY g % 1000, g LIMIT 2000000) AS s",
        ends: Ends::Rows(&["2998668667000"]),
    },
];

/// Each probe, one after another on one server: how it ended, the server's peak resident
/// memory so far, and the longest another session waited for `SELECT 1` while it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_statements_stay_within_their_share_and_others_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, format!("memory_limit = {LIMIT_BYTES}\n")).unwrap();
    let config = config.to_str().unwrap();
    let args = ["--config", config, "--admin-listen", "127.0.0.1:0"];
    let server = ChildServer::start_with(&dir.path().join("data"), &args).await;
    let pinger = server.connect().await;
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    for probe in PROBES {
        let client = server.connect().await;
        client
            .batch_execute("SET statement_timeout = '120s'")
            .await
            .unwrap();
        let run = client.simple_query(probe.sql);
        tokio::pin!(run);
        let mut slowest = Duration::ZERO;
        let ended = loop {
            tokio::select! {
                ended = &mut run => break ended,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    let asked = Instant::now();
                    let answer = tokio::time::timeout(
                        Duration::from_secs(30),
                        pinger.simple_query("SELECT 1"),
                    );
                    answer.await.expect("SELECT 1 answered").unwrap();
                    slowest = slowest.max(asked.elapsed());
                }
            }
        };
        let peak = common::peak_rss_bytes(server.pid());
        report.push(format!(
            "{}: peak {} MiB, SELECT 1 at most {} ms",
            probe.sql,
            peak >> 20,
            slowest.as_millis()
        ));
        let outcome = match (&probe.ends, ended) {
            (Ends::Rows(want), Ok(messages)) => {
                let got = common::rows_as_text(messages);
                (got != *want).then(|| format!("gave {got:?}, not {want:?}"))
            }
            (Ends::Code(want), Err(e)) => {
                (e.code().map(|c| c.code()) != Some(*want)).then(|| format!("{e}, not {want}"))
            }
            (Ends::Rows(_), Err(e)) => Some(match e.as_db_error() {
                Some(db) => format!("failed: {} {}", db.code().code(), db.message()),
                None => format!("failed: {e}"),
            }),
            (Ends::Code(want), Ok(m)) => {
                Some(format!("gave {:?}, not {want}", common::rows_as_text(m)))
            }
        };
        failures.extend(outcome.map(|o| format!("{}: {o}", probe.sql)));
        if peak >= LIMIT_BYTES + OVERHEAD_BYTES {
            failures.push(format!("{}: peak RSS {} MiB", probe.sql, peak >> 20));
        }
        if slowest >= ANSWER_WITHIN {
            failures.push(format!("{}: SELECT 1 took {slowest:?}", probe.sql));
        }
    }
    // Every probe's memory is given back, and no plan is left running (a plan's thread ends
    // just after its last rows are sent: waited for, up to 10 s).
    let admin = server.admin.expect("admin port");
    let wanted = [
        "weir_statement_memory_bytes 0".to_string(),
        format!("weir_statement_memory_limit_bytes {}", LIMIT_BYTES / 2),
        "weir_statements_running 0".to_string(),
        format!("weir_operator_cache_limit_bytes {}", LIMIT_BYTES / 8),
        "weir_temp_disk_bytes 0".to_string(),
    ];
    let mut missing = Vec::new();
    for _ in 0..100 {
        let (status, metrics) = common::http(admin, "GET /metrics").await;
        assert_eq!(status, 200);
        missing = (wanted.iter())
            .filter(|w| !metrics.lines().any(|l| l == w.as_str()))
            .collect();
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    failures.extend(missing.iter().map(|m| format!("/metrics lacks {m}")));
    // Beside them, what RocksDB holds in memory.
    let (_, metrics) = common::http(admin, "GET /metrics").await;
    let series = [
        "weir_state_memtable_bytes",
        "weir_state_block_cache_bytes",
        "weir_operator_cache_bytes",
        "weir_temp_disk_limit_bytes",
    ];
    for series in series {
        let value = (metrics.lines()).find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<u64>()
                .ok()
        });
        if value.is_none() {
            failures.push(format!("/metrics lacks {series}"));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `statement_mem` bounds one statement's working memory below what every statement shares:
/// past it the statement fails with 53200, naming the setting, while another session's same
/// statement runs. Values are read as PostgreSQL reads `work_mem`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_mem_bounds_the_statements_of_its_session() {
    let server = common::TestServer::start().await;
    let client = server.connect().await;
    let other = server.connect().await;
    const WIDE: &str = "SELECT length(repeat('x', 2000000))";
    assert_eq!(common::text_rows(&client, WIDE).await, ["2000000"]);
    for bad in ["'-1'", "'10kB'", "'1 parsec'", "'3TB'"] {
        let e = (client
            .batch_execute(&format!("SET statement_mem = {bad}"))
            .await)
            .unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("22023"), "{bad}: {e}");
    }
    client
        .batch_execute("SET statement_mem = '1MB'")
        .await
        .unwrap();
    assert_eq!(
        common::text_rows(&client, "SHOW statement_mem").await,
        ["1MB"]
    );
    let e = client.simple_query(WIDE).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("53200"), "{e}");
    let message = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("statement_mem")),
        "{message:?}"
    );
    assert_eq!(common::text_rows(&other, WIDE).await, ["2000000"]);
    client
        .batch_execute("SET statement_mem = 4096")
        .await
        .unwrap();
    assert_eq!(common::text_rows(&client, WIDE).await, ["2000000"]);
    client.batch_execute("RESET statement_mem").await.unwrap();
    assert_eq!(
        common::text_rows(&client, "SHOW statement_mem").await,
        ["0"]
    );
}

/// Plans run on threads of their own, at most twice `connections_max` (at least 16) at once:
/// open cursors hold theirs, and one more is refused with 53000, in the session and in others;
/// closed cursors give their threads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_running_at_once_are_bounded() {
    let server = common::TestServer::start_with(|c| c.connections_max = 4).await;
    let client = server.connect().await;
    let other = server.connect().await;
    client.batch_execute("BEGIN").await.unwrap();
    for i in 0..16 {
        client
            .batch_execute(&format!(
                "DECLARE c{i} CURSOR FOR SELECT g FROM generate_series(1, 1000000) AS t(g)"
            ))
            .await
            .unwrap();
    }
    let e = (client
        .batch_execute("DECLARE c16 CURSOR FOR SELECT 1")
        .await)
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("53000"), "{e}");
    let e = other.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("53000"), "{e}");
    client.batch_execute("ROLLBACK").await.unwrap();
    // A closed cursor's thread ends at its plan's next wait: given up to 10 s.
    let mut answer = other.simple_query("SELECT 1").await;
    for _ in 0..100 {
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = other.simple_query("SELECT 1").await;
    }
    assert_eq!(common::rows_as_text(answer.unwrap()), ["1"]);
}

/// The SQLSTATE and message of `sql`'s error, or `ok`.
async fn outcome(client: &tokio_postgres::Client, sql: &str) -> String {
    match client.batch_execute(sql).await {
        Ok(()) => "ok".into(),
        Err(e) => match e.as_db_error() {
            Some(db) => format!("{} {}", db.code().code(), db.message()),
            None => e.to_string(),
        },
    }
}

/// `weir_catalog.sessions` shows the working memory each session's statements hold (an open
/// cursor's sort holds its rows), the most they held, and their plans' CPU time; the memory
/// is given back when the cursor closes. Sessions of roles whose privileges the reader lacks
/// show who they are, not what they use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sessions_memory_and_cpu_time_are_shown() {
    let server = common::TestServer::start().await;
    let admin = server.connect().await;
    let sorting = server.connect().await;
    admin
        .batch_execute("CREATE ROLE app LOGIN PASSWORD 'pw'")
        .await
        .unwrap();
    let app = common::connect_as(&server, "app", "pw").await.unwrap();
    let pid = common::text_rows(&sorting, "SELECT pg_backend_pid()").await[0].clone();
    sorting
        .batch_execute(
            "BEGIN; DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 2000000) AS t(g) \
             ORDER BY g DESC; FETCH 1 FROM c",
        )
        .await
        .unwrap();
    let usage = format!(
        "SELECT memory_bytes, memory_peak_bytes, cpu_ms FROM weir_catalog.sessions \
         WHERE pid = {pid}"
    );
    let row = common::text_rows(&admin, &usage).await;
    let numbers: Vec<u64> = row[0].split(' ').map(|v| v.parse().unwrap()).collect();
    let (held, peak, cpu_ms) = (numbers[0], numbers[1], numbers[2]);
    // The sort held its 2 M bigints (16 MB) while it sorted them, and holds what it has not
    // sent yet.
    assert!(peak >= 16_000_000 && held >= 4_000_000, "{row:?}");
    assert!(peak >= held && cpu_ms > 0, "{row:?}");
    assert_eq!(
        common::text_rows(&app, &usage).await,
        ["NULL NULL NULL"],
        "another role's session"
    );
    let own = "SELECT usename, state, memory_bytes FROM weir_catalog.sessions \
               WHERE pid = pg_backend_pid()";
    assert_eq!(common::text_rows(&app, own).await, ["app active 0"]);
    sorting.batch_execute("CLOSE c; COMMIT").await.unwrap();
    // A closed cursor's plan ends at its next wait.
    let mut row = common::text_rows(&admin, &usage).await;
    for _ in 0..100 {
        if row[0].starts_with("0 ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        row = common::text_rows(&admin, &usage).await;
    }
    assert_eq!(
        row,
        [format!("0 {peak} {}", row[0].rsplit(' ').next().unwrap())]
    );
}

/// The last `superuser_reserved_connections` connections, and as many of the plans that may
/// run at once, are kept for superusers: when other roles have taken the rest, an
/// administrator still connects, looks and cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_connections_and_plans_are_kept_for_superusers() {
    let server = common::TestServer::start_with(|c| {
        c.connections_max = 5;
        c.superuser_reserved_connections = 2;
    })
    .await;
    let admin = server.connect().await;
    admin
        .batch_execute("CREATE ROLE app LOGIN PASSWORD 'pw'")
        .await
        .unwrap();
    let app = common::connect_as(&server, "app", "pw").await.unwrap();
    let _second = common::connect_as(&server, "app", "pw").await.unwrap();
    let refused = common::connect_as(&server, "app", "pw").await.err();
    assert_eq!(
        refused.as_deref(),
        Some(
            "53300 remaining connection slots are reserved for roles with the SUPERUSER attribute"
        )
    );
    let other_admin = server.connect().await;
    // Of 16 plans at once, 14 for other roles than superusers.
    app.batch_execute("BEGIN").await.unwrap();
    for i in 0..14 {
        let cursor =
            format!("DECLARE c{i} CURSOR FOR SELECT g FROM generate_series(1, 1000000) AS t(g)");
        app.batch_execute(&cursor).await.unwrap();
    }
    let refused = outcome(&app, "DECLARE c14 CURSOR FOR SELECT 1").await;
    assert_eq!(
        refused,
        "53000 too many statements are running: 16 at once is the most, 2 of them kept for \
         superusers"
    );
    let pid = "(SELECT pid FROM weir_catalog.sessions WHERE usename = 'app' AND state <> 'idle')";
    let cancelled = format!("SELECT pg_cancel_backend({pid})");
    assert_eq!(common::text_rows(&admin, &cancelled).await, ["t"]);
    assert_eq!(common::text_rows(&other_admin, "SELECT 1").await, ["1"]);
    drop(other_admin);
}

/// A role's `statement_mem`, or the server's when the role has none, bounds what its sessions
/// may set: they may lower it, not raise or lift it, and only a superuser changes a role's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roles_statement_mem_only_a_superuser_raises() {
    let server = common::TestServer::start_with(|c| c.statement_mem = 4 << 20).await;
    let admin = server.connect().await;
    admin
        .batch_execute(
            "CREATE ROLE app LOGIN PASSWORD 'pw'; CREATE ROLE other LOGIN PASSWORD 'pw'; \
             ALTER ROLE app SET statement_mem = '1MB'",
        )
        .await
        .unwrap();
    let app = common::connect_as(&server, "app", "pw").await.unwrap();
    let other = common::connect_as(&server, "other", "pw").await.unwrap();
    assert_eq!(common::text_rows(&app, "SHOW statement_mem").await, ["1MB"]);
    assert_eq!(
        common::text_rows(&other, "SHOW statement_mem").await,
        ["4MB"]
    );
    let denied = "42501 permission denied to set parameter \"statement_mem\"";
    for raise in ["'2MB'", "0", "DEFAULT"] {
        let set = format!("SET statement_mem = {raise}");
        let expected = if raise == "DEFAULT" { "ok" } else { denied };
        assert_eq!(outcome(&app, &set).await, expected, "{set}");
    }
    assert_eq!(outcome(&other, "SET statement_mem = '8MB'").await, denied);
    assert_eq!(outcome(&app, "SET statement_mem = '512kB'").await, "ok");
    let e = app
        .simple_query("SELECT length(repeat('x', 2000000))")
        .await
        .unwrap_err();
    let message = e
        .as_db_error()
        .map(|d| (d.code().code(), d.message().to_string()));
    assert!(
        message
            .as_ref()
            .is_some_and(|(code, m)| *code == "53200" && m.contains("statement_mem")),
        "{message:?}"
    );
    app.batch_execute("RESET statement_mem").await.unwrap();
    assert_eq!(common::text_rows(&app, "SHOW statement_mem").await, ["1MB"]);
    for change in [
        "ALTER ROLE app SET statement_mem = '64MB'",
        "ALTER ROLE app RESET statement_mem",
        "ALTER ROLE app RESET ALL",
    ] {
        assert_eq!(outcome(&app, change).await, denied, "{change}");
    }
    assert_eq!(outcome(&admin, "SET statement_mem = '64MB'").await, "ok");
    admin
        .batch_execute("ALTER ROLE app SET statement_mem = '64MB'")
        .await
        .unwrap();
    let app = common::connect_as(&server, "app", "pw").await.unwrap();
    assert_eq!(outcome(&app, "SET statement_mem = '32MB'").await, "ok");
}

/// Statements' temporary files share `temp_disk_limit`: a sort past its memory spills within
/// it and answers, holding its files while its cursor is open and giving them back when it
/// closes; a sort, an `INSERT ... SELECT` and a COPY whose files would pass it fail with 53400,
/// leave nothing behind (no row, no file) and the server answers the next statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_files_stay_within_temp_disk_limit() {
    const TEMP_LIMIT: u64 = 48 << 20;
    let server = common::TestServer::start_with(|c| {
        c.memory_limit = Some(64 << 20);
        c.temp_disk_limit = Some(TEMP_LIMIT);
    })
    .await;
    let client = server.connect().await;
    let temp = || server.db.memory().temp_disk_bytes;
    let files = || {
        std::fs::read_dir(server.dir.path().join("spool"))
            .unwrap()
            .count()
    };
    let sort = |rows: u64| {
        format!(
            "DECLARE c CURSOR FOR SELECT g, md5(g::text) AS h FROM generate_series(1, {rows}) \
             AS t(g) ORDER BY h"
        )
    };
    // 600,000 rows of 32-character text do not fit the statements' 32 MiB: they spill.
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute(&sort(600_000)).await.unwrap();
    let first = common::text_rows(&client, "FETCH 1 FROM c").await;
    assert_eq!(first, ["5329 00003e3b9e5336685200ae85d21b4f5e"]);
    let spilled = temp();
    assert!(
        spilled > 0 && spilled <= TEMP_LIMIT && files() > 0,
        "{spilled} bytes in {} files",
        files()
    );
    client.batch_execute("CLOSE c; COMMIT").await.unwrap();
    for _ in 0..100 {
        if temp() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((temp(), files()), (0, 0), "a closed cursor's files go");

    let refused = "53400 temporary file size exceeds temp_disk_limit (48MB)";
    let too_many = format!("BEGIN; {}; FETCH 1 FROM c", sort(3_000_000));
    assert_eq!(outcome(&client, &too_many).await, refused);
    client.batch_execute("ROLLBACK").await.unwrap();
    client
        .batch_execute("CREATE TABLE w (id bigint PRIMARY KEY, v text)")
        .await
        .unwrap();
    let insert = "INSERT INTO w SELECT g, repeat('y', 200) FROM generate_series(1, 400000) AS t(g)";
    assert_eq!(outcome(&client, insert).await, refused);
    let text: String = (1..=400_000)
        .map(|i| format!("{i}\t{}\n", "y".repeat(200)))
        .collect();
    let copied = async {
        let sink = client
            .copy_in::<_, bytes::Bytes>("COPY w FROM STDIN")
            .await?;
        futures::pin_mut!(sink);
        for part in text.as_bytes().chunks(1 << 20) {
            futures::SinkExt::send(&mut sink, bytes::Bytes::copy_from_slice(part)).await?;
        }
        sink.finish().await
    };
    let e = copied.await.unwrap_err();
    let db = e
        .as_db_error()
        .map(|d| format!("{} {}", d.code().code(), d.message()));
    assert_eq!(db.as_deref(), Some(refused), "{e}");
    assert_eq!(
        common::text_rows(&client, "SELECT count(*) FROM w").await,
        ["0"]
    );
    assert_eq!((temp(), files()), (0, 0), "a refused statement's files go");
    // Within the limit, the same INSERT is applied.
    let fits = "INSERT INTO w SELECT g, repeat('y', 200) FROM generate_series(1, 150000) AS t(g)";
    assert_eq!(outcome(&client, fits).await, "ok");
    assert_eq!(
        common::text_rows(&client, "SELECT count(*) FROM w").await,
        ["150000"]
    );
}

/// A transaction block whose changes to a table pass what it keeps in memory (16 MiB) keeps
/// them on disk, in the spool directory, instead of being refused (54000 past 128 MiB before):
/// its own statements read them, its keys are checked against them, another session sees
/// none of them until COMMIT applies all of them (the view too); ROLLBACK, a failed block and
/// a commit take the files with them. A block that writes a second table keeps its changes in
/// memory, and is refused with 54000 past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_block_past_memory_keeps_its_changes_on_disk() {
    let server = common::TestServer::start_with(|c| c.memory_limit = Some(LIMIT_BYTES)).await;
    let a = server.connect().await;
    let b = server.connect().await;
    let on_disk = || {
        std::fs::read_dir(server.dir.path().join("spool"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("block".as_ref()))
            .count()
    };
    a.batch_execute(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text);
         CREATE TABLE other (x int);
         CREATE MATERIALIZED VIEW tv AS SELECT count(*) AS n, sum(id) AS s, max(v) AS top FROM t;
         INSERT INTO t SELECT g, 'a' FROM generate_series(1, 1000) AS g(g);",
    )
    .await
    .unwrap();
    let count = |c| async move { common::text_rows(c, "SELECT count(*), sum(id) FROM t").await };
    // 400,000 rows of 200 bytes: about 170 MB of changes as a block counts them.
    let insert = |from: u64, to: u64| {
        format!(
            "INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series({from}, {to}) AS g(g)"
        )
    };
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&insert(1001, 400_000)).await.unwrap();
    assert_eq!(on_disk(), 1);
    assert_eq!(count(&a).await, ["400000 80000200000"]);
    assert_eq!(count(&b).await, ["1000 500500"]);
    let updated = a
        .execute("UPDATE t SET v = 'z' WHERE id % 2 = 0", &[])
        .await
        .unwrap();
    let deleted = a
        .execute("DELETE FROM t WHERE id > 300000", &[])
        .await
        .unwrap();
    assert_eq!((updated, deleted), (200_000, 100_000));
    assert_eq!(
        common::text_rows(
            &a,
            "SELECT count(*), count(*) FILTER (WHERE v = 'z') FROM t"
        )
        .await,
        ["300000 150000"]
    );
    assert_eq!(
        outcome(&a, "INSERT INTO t VALUES (300001, 'again')").await,
        "ok",
        "a key the block deleted is free"
    );
    a.batch_execute("DELETE FROM t WHERE id = 300001")
        .await
        .unwrap();
    assert_eq!(count(&b).await, ["1000 500500"]);
    a.batch_execute("COMMIT").await.unwrap();
    assert_eq!(on_disk(), 0);
    let expected = ["300000 45000150000"];
    assert_eq!(count(&b).await, expected);
    assert_eq!(
        common::text_rows(&b, "SELECT n, s, top FROM tv").await,
        ["300000 45000150000 z"]
    );

    // A key among those on disk is taken; the failed block's files go.
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&insert(1_000_001, 1_150_000))
        .await
        .unwrap();
    assert_eq!(on_disk(), 1);
    let taken = outcome(&a, "INSERT INTO t VALUES (1000005, 'dup')").await;
    assert!(taken.starts_with("23505 "), "{taken}");
    assert_eq!(on_disk(), 0);
    a.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(count(&b).await, expected);

    // Another session's commit of a key the block changed fails the block's commit.
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&insert(1_000_001, 1_150_000))
        .await
        .unwrap();
    a.batch_execute("UPDATE t SET v = 'mine' WHERE id = 7")
        .await
        .unwrap();
    b.batch_execute("UPDATE t SET v = 'theirs' WHERE id = 7")
        .await
        .unwrap();
    let conflict = outcome(&a, "COMMIT").await;
    assert!(conflict.starts_with("40001 "), "{conflict}");
    assert_eq!(on_disk(), 0);
    assert_eq!(count(&b).await, expected);

    // ROLLBACK takes them too.
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&insert(1_000_001, 1_150_000))
        .await
        .unwrap();
    a.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(on_disk(), 0);

    // A block that writes two tables keeps its changes in memory.
    let refused = "54000 a transaction block that writes more than one table, or runs DDL, \
                   keeps at most 16MB of changes to each";
    a.batch_execute("BEGIN; INSERT INTO other VALUES (1)")
        .await
        .unwrap();
    assert_eq!(outcome(&a, &insert(1_000_001, 1_150_000)).await, refused);
    a.batch_execute("ROLLBACK").await.unwrap();
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute(&insert(1_000_001, 1_150_000))
        .await
        .unwrap();
    assert_eq!(outcome(&a, "INSERT INTO other VALUES (1)").await, refused);
    a.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(on_disk(), 0);
    assert_eq!(count(&b).await, expected);
    assert_eq!(
        common::text_rows(&b, "SELECT count(*) FROM other").await,
        ["0"]
    );
}

/// A view over a source that produces as fast as the view takes its rows, with periodic
/// barriers an hour apart: its epochs still end by memory, not by time. Past their share (an
/// eighth of `memory_limit`), the aggregation's cache of groups and the epoch's state writes
/// ask for a barrier, which flushes them: the view's rows become visible while the source
/// goes on (before, nothing was until the hour's barrier, and an epoch held every group it
/// touched: 3.8 GB of resident memory under a 256 MiB `memory_limit` with 10 s barriers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_sources_epochs_end_when_their_state_passes_its_share() {
    let server = common::TestServer::start_with(|c| {
        c.memory_limit = Some(64 << 20);
        c.barrier_interval_ms = 3_600_000;
        c.checkpoint.interval_ms = 0;
    })
    .await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE SOURCE bid WITH (connector = 'nexmark', stream = 'bid', events = 400000);
             CREATE MATERIALIZED VIEW pairs AS
                 SELECT auction, bidder, count(*) AS n, max(price) AS top FROM bid
                 GROUP BY auction, bidder",
        )
        .await
        .unwrap();
    let seen = || async { common::text_rows(&client, "SELECT count(*) FROM pairs").await };
    let started = Instant::now();
    while seen().await == ["0"] {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no barrier came while the source produced"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // On a loaded machine the source may not have produced everything yet.
    let left = Duration::from_secs(300).saturating_sub(started.elapsed());
    common::drain(&client, left).await;
    assert_eq!(
        common::text_rows(&client, "SELECT sum(n) FROM pairs").await,
        ["368000"]
    );
    let memory = server.db.memory();
    assert_eq!(memory.epoch_writes_limit_bytes, 8 << 20);
    assert_eq!(memory.epoch_writes_bytes, 0, "the last epoch is flushed");
}
