//! Start, stop, start again: a server stopped by SIGTERM or SIGKILL before, during or after
//! its first checkpoint, holding no objects, only failed DDL, tables, views, sources or
//! dropped objects, starts again with everything it acknowledged in place, and again after
//! a checkpoint taken by the restarted server.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{text_rows, ChildServer};

/// A view that computes one aggregate twice, as a subplan of its own that two readers share.
const COMMONEST: &str = "SELECT c.v, c.n FROM (SELECT v, count(*) AS n FROM t GROUP BY v) AS c \
     JOIN (SELECT max(d.n) AS top FROM (SELECT count(*) AS n, v FROM t GROUP BY v) AS d) AS m \
     ON c.n = m.top";

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;

#[derive(Debug, Clone, Copy)]
enum Objects {
    None,
    FailedDdl,
    Tables,
    Views,
    Sources,
    Dropped,
}

const ALL: [Objects; 6] = [
    Objects::None,
    Objects::FailedDdl,
    Objects::Tables,
    Objects::Views,
    Objects::Sources,
    Objects::Dropped,
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum When {
    /// No checkpoint was ever taken.
    Before,
    /// The first checkpoint is held before its manifest is written.
    During,
    /// The first checkpoint completed, and more was acknowledged after it.
    After,
}

/// One data directory through its stops and starts, and what it must hold.
struct Scenario {
    objects: Objects,
    signal: i32,
    when: When,
    dir: tempfile::TempDir,
    /// The rows of table `t` the server acknowledged, as `id v`, in id order.
    t: Vec<(i32, String)>,
}

impl Scenario {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("weir.toml")
    }

    fn input(&self) -> PathBuf {
        self.dir.path().join("input")
    }

    async fn start(&self, failpoints: &str) -> ChildServer {
        let config = self.config().display().to_string();
        ChildServer::start_with_env(
            &self.data(),
            &["--config", &config],
            &[("WEIR_FAILPOINTS", failpoints)],
        )
        .await
    }

    fn name(&self) -> String {
        let signal = if self.signal == SIGTERM {
            "SIGTERM"
        } else {
            "SIGKILL"
        };
        format!(
            "{:?} stopped by {signal} {:?} the first checkpoint",
            self.objects, self.when
        )
    }

    /// Creates the scenario's objects and its first rows.
    async fn create(&mut self, client: &tokio_postgres::Client) {
        match self.objects {
            Objects::None => {}
            Objects::FailedDdl => {
                // Each refused (their SQLSTATEs are tested elsewhere), none leaving a trace.
                for sql in [
                    "CREATE TABLE t (a nosuchtype)",
                    "CREATE TABLE t (a int, a int)",
                    "CREATE MATERIALIZED VIEW v AS SELECT * FROM missing",
                    "CREATE SOURCE s (a int) WITH (connector = 'file', path = '/nonexistent/weir')",
                    "CREATE SINK k AS SELECT 1 / 0 AS x WITH (connector = 'blackhole')",
                    "DROP TABLE missing",
                    "INSERT INTO missing VALUES (1)",
                ] {
                    client.batch_execute(sql).await.expect_err(sql);
                }
            }
            Objects::Tables | Objects::Views => {
                client
                    .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
                    .await
                    .unwrap();
                if matches!(self.objects, Objects::Views) {
                    client
                        .batch_execute(&format!(
                            "CREATE TABLE u (id int, w int);
                             CREATE MATERIALIZED VIEW counts AS
                               SELECT v, count(*) AS n, sum(id) AS s FROM t GROUP BY v;
                             CREATE MATERIALIZED VIEW joined AS
                               SELECT t.id, t.v, u.w FROM t JOIN u ON t.id = u.id;
                             CREATE MATERIALIZED VIEW commonest AS {COMMONEST};
                             INSERT INTO u VALUES (1, 10), (2, 20), (11, 110), (21, 210);"
                        ))
                        .await
                        .unwrap();
                }
                self.write(client, 0).await;
            }
            Objects::Sources => {
                std::fs::create_dir_all(self.input()).unwrap();
                std::fs::write(self.input().join("part-0.csv"), "1,a\n2,b\n3,c\n").unwrap();
                client
                    .batch_execute(&format!(
                        "CREATE SOURCE f (k bigint, s text) WITH (connector = 'file', path = '{}');
                         CREATE MATERIALIZED VIEW fv AS SELECT count(*) AS n, sum(k) AS s FROM f;
                         CREATE SOURCE bid WITH (connector = 'nexmark', stream = 'bid', events = 1000);
                         CREATE MATERIALIZED VIEW bids AS SELECT count(*) AS n FROM bid;
                         CREATE SOURCE idle WITH (connector = 'nexmark', stream = 'person');",
                        self.input().display()
                    ))
                    .await
                    .unwrap();
                drain(client).await;
            }
            Objects::Dropped => {
                client
                    .batch_execute(
                        "CREATE TABLE t (id int PRIMARY KEY, v text);
                         CREATE MATERIALIZED VIEW gone AS SELECT count(*) AS n FROM t;
                         INSERT INTO t VALUES (100, 'old'), (101, 'old');
                         CREATE SOURCE s WITH (connector = 'nexmark', stream = 'bid', events = 100);
                         CREATE SINK k AS SELECT * FROM s WITH (connector = 'blackhole');
                         FLUSH;
                         DROP SINK k;
                         DROP SOURCE s;
                         DROP MATERIALIZED VIEW gone;
                         DROP TABLE t;
                         CREATE TABLE t (id int PRIMARY KEY, v text);
                         CREATE MATERIALIZED VIEW n AS SELECT count(*) AS n FROM t;",
                    )
                    .await
                    .unwrap();
                self.write(client, 0).await;
            }
        }
    }

    /// Round `r`'s writes to `t`, where the scenario has it: two rows inserted, one of them
    /// updated, and a row of the round before deleted.
    async fn write(&mut self, client: &tokio_postgres::Client, r: i32) {
        if !matches!(
            self.objects,
            Objects::Tables | Objects::Views | Objects::Dropped
        ) {
            return;
        }
        let (a, b) = (r * 10 + 1, r * 10 + 2);
        client
            .batch_execute(&format!(
                "INSERT INTO t VALUES ({a}, 'r{r}'), ({b}, 'r{r}');
                 UPDATE t SET v = 'r{r} updated' WHERE id = {a};
                 DELETE FROM t WHERE id = {}",
                b - 10
            ))
            .await
            .unwrap();
        self.t.retain(|(id, _)| *id != b - 10);
        self.t.push((a, format!("r{r} updated")));
        self.t.push((b, format!("r{r}")));
        self.t.sort();
    }

    /// Asserts that the server holds everything acknowledged, and that its views equal
    /// their queries.
    async fn check(&self, client: &tokio_postgres::Client) {
        let name = self.name();
        let relations = text_rows(client, "SHOW TABLES").await;
        match self.objects {
            Objects::None | Objects::FailedDdl => {
                assert!(relations.is_empty(), "{name}: {relations:?}");
                // Every name the failed statements tried is free.
                client
                    .batch_execute(
                        "CREATE TABLE t (a int); CREATE MATERIALIZED VIEW v AS SELECT * FROM t;
                         DROP MATERIALIZED VIEW v; DROP TABLE t;",
                    )
                    .await
                    .unwrap();
            }
            Objects::Tables | Objects::Views | Objects::Dropped => {
                client.batch_execute("FLUSH").await.unwrap();
                let want: Vec<String> = self.t.iter().map(|(id, v)| format!("{id} {v}")).collect();
                let got = text_rows(client, "SELECT id, v FROM t ORDER BY id").await;
                assert_eq!(got, want, "{name}: table t");
                let views: &[(&str, &str)] = match self.objects {
                    Objects::Views => &[
                        (
                            "counts",
                            "SELECT v, count(*) AS n, sum(id) AS s FROM t GROUP BY v",
                        ),
                        (
                            "joined",
                            "SELECT t.id, t.v, u.w FROM t JOIN u ON t.id = u.id",
                        ),
                        ("commonest", COMMONEST),
                    ],
                    Objects::Dropped => &[("n", "SELECT count(*) AS n FROM t")],
                    _ => &[],
                };
                for (view, query) in views {
                    let got = text_rows(client, &format!("SELECT * FROM {view} ORDER BY 1")).await;
                    let want =
                        text_rows(client, &format!("SELECT * FROM ({query}) q ORDER BY 1")).await;
                    assert_eq!(got, want, "{name}: view {view}");
                }
                if matches!(self.objects, Objects::Dropped) {
                    let err = client
                        .batch_execute("SELECT * FROM gone")
                        .await
                        .unwrap_err();
                    assert_eq!(err.code().map(|c| c.code()), Some("42P01"), "{name}");
                    assert_eq!(relations, ["t"], "{name}");
                }
            }
            Objects::Sources => {
                drain(client).await;
                assert_eq!(
                    text_rows(client, "SELECT * FROM fv").await,
                    ["3 6"],
                    "{name}"
                );
                assert_eq!(
                    text_rows(client, "SELECT * FROM bids").await,
                    ["920"],
                    "{name}"
                );
                let sources = text_rows(client, "SHOW SOURCES").await;
                assert_eq!(sources, ["bid", "f", "idle"], "{name}");
            }
        }
    }

    /// The whole scenario: create, stop as chosen, start and check; then a checkpoint by the
    /// restarted server, more writes, the same stop, start and check again.
    async fn run(mut self) {
        let failpoints = match self.when {
            When::During => "checkpoint.before_manifest:pause",
            _ => "",
        };
        let server = self.start(failpoints).await;
        let client = server.connect().await;
        self.create(&client).await;
        match self.when {
            When::Before => {}
            When::During => {
                let held = server.connect().await;
                tokio::spawn(async move {
                    let _ = held.batch_execute("CHECKPOINT").await;
                });
                wait_for(&server.log, "failpoint checkpoint.before_manifest: paused").await;
            }
            When::After => {
                client.batch_execute("CHECKPOINT").await.unwrap();
                self.write(&client, 1).await;
            }
        }
        drop(client);
        server.stop(self.signal).await;

        let server = self.start("").await;
        let client = server.connect().await;
        self.check(&client).await;
        client.batch_execute("CHECKPOINT").await.unwrap();
        self.write(&client, 2).await;
        drop(client);
        server.stop(self.signal).await;

        let server = self.start("").await;
        let client = server.connect().await;
        self.check(&client).await;
        drop(client);
        server.stop(SIGTERM).await;
    }
}

/// Waits until every source has read all it will, then for one barrier.
async fn drain(client: &tokio_postgres::Client) {
    for _ in 0..6000 {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE NOT done AND read) AS running, \
                 count(*) FILTER (WHERE error IS NOT NULL) AS failed FROM weir_catalog.sources",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>("failed"), 0, "a source failed");
        if row.get::<_, i64>("running") == 0 {
            client.batch_execute("FLUSH").await.unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the sources did not finish within 60 s");
}

async fn wait_for(log: &Path, text: &str) {
    for _ in 0..3000 {
        if std::fs::read_to_string(log).is_ok_and(|l| l.contains(text)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never said {text:?}", log.display());
}

/// Every kind of objects, stopped by `signal` at `when`; three scenarios at a time.
async fn matrix(signal: i32, when: When) {
    let scenarios: Vec<Scenario> = ALL
        .iter()
        .map(|&objects| {
            let dir = tempfile::tempdir().unwrap();
            // Checkpoints only when a test asks for one.
            std::fs::write(
                dir.path().join("weir.toml"),
                "[checkpoint]\ninterval_ms = 0\n",
            )
            .unwrap();
            Scenario {
                objects,
                signal,
                when,
                dir,
                t: Vec::new(),
            }
        })
        .collect();
    let mut scenarios = scenarios.into_iter();
    loop {
        let batch: Vec<Scenario> = scenarios.by_ref().take(3).collect();
        if batch.is_empty() {
            return;
        }
        futures::future::join_all(batch.into_iter().map(Scenario::run)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_before_the_first_checkpoint() {
    matrix(SIGTERM, When::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_the_first_checkpoint() {
    matrix(SIGKILL, When::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_first_checkpoint() {
    matrix(SIGTERM, When::During).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_the_first_checkpoint() {
    matrix(SIGKILL, When::During).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_the_first_checkpoint() {
    matrix(SIGTERM, When::After).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_the_first_checkpoint() {
    matrix(SIGKILL, When::After).await;
}

/// A second server on a data directory in use refuses to start, naming the first, and
/// changes nothing there; once the first has stopped, however it stopped, a server starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_a_data_directory_in_use_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = ChildServer::start(&data).await;
    let c = first.connect().await;
    c.batch_execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
        .await
        .unwrap();
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output();
    let second = tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .expect("the second server should exit")
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    let holder = format!(
        "in use by another Weir server (pid {}, listening on {})",
        first.pid(),
        first.addr
    );
    assert!(said.contains(&holder), "{said}");
    // The first server went on undisturbed.
    c.batch_execute("INSERT INTO t VALUES (3); FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text_rows(&c, "SELECT id FROM t ORDER BY id").await,
        ["1", "2", "3"]
    );
    drop(c);
    first.stop(SIGKILL).await;
    let again = ChildServer::start(&data).await;
    let c = again.connect().await;
    assert_eq!(
        text_rows(&c, "SELECT id FROM t ORDER BY id").await,
        ["1", "2", "3"]
    );
}

/// A write to a table whose actor has failed is refused before it is logged (57P03, and it is
/// not there after a restart); every write acknowledged before is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_after_its_tables_actor_failed_never_happened() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Barriers only when asked for, so that they can be counted.
    let config = common::barriers_on_request_config(dir.path());
    let args = ["--config", config.to_str().unwrap()];
    // Table t is relation 1000, fed by actor 1000: it fails at its fifth barrier.
    let server =
        ChildServer::start_with_env(&data, &args, &[("WEIR_FAILPOINTS", "actor.1000.barrier@5")])
            .await;
    let c = server.connect().await;
    c.batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for id in 0..40 {
        match c
            .batch_execute(&format!("INSERT INTO t VALUES ({id})"))
            .await
        {
            Ok(()) => acknowledged.push(id.to_string()),
            Err(e) => {
                let code = e.as_db_error().map(|d| d.code().code().to_string());
                assert_eq!(code.as_deref(), Some("57P03"), "{e}");
                refused += 1;
            }
        }
        // A barrier after each write (FLUSH may fail once the actor has).
        let _ = c.batch_execute("FLUSH").await;
    }
    assert!(refused > 0, "the failpoint never fired");
    drop(c);
    server.stop(SIGKILL).await;
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute("FLUSH").await.unwrap();
    let mut rows = text_rows(&c, "SELECT id FROM t").await;
    rows.sort_by_key(|r| r.parse::<i32>().unwrap());
    assert_eq!(rows, acknowledged);
}

/// The row errors a view holds come back with its restored state: those of the rows the
/// checkpoint holds and those of the rows replayed after it, in the view's own actor and in
/// its parallel workers (an aggregate out of range); deleting the rows takes them away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_views_row_errors_are_restored_with_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::barriers_on_request_config(dir.path());
    let args = ["--config", config.to_str().unwrap()];
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, g int, a int, n numeric(38,0));
         CREATE MATERIALIZED VIEW ratio AS SELECT id, 100 / a AS r FROM t;
         SET streaming_parallelism = 2;
         CREATE MATERIALIZED VIEW sums AS SELECT g, sum(n) AS total FROM t GROUP BY g;
         INSERT INTO t VALUES (1, 1, 0, 99999999999999999999999999999999999999),
                              (2, 1, 0, 99999999999999999999999999999999999999),
                              (3, 2, 5, 1);
         FLUSH;
         CHECKPOINT;
         INSERT INTO t VALUES (4, 3, 0, 99999999999999999999999999999999999999),
                              (5, 3, 1, 99999999999999999999999999999999999999);
         FLUSH",
    )
    .await
    .unwrap();
    let status = "SELECT name, status, row_errors FROM weir_catalog.views ORDER BY name";
    let before = text_rows(&c, status).await;
    assert_eq!(before, ["ratio degraded 3", "sums degraded 2"]);
    drop(c);
    server.stop(SIGKILL).await;

    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute("FLUSH").await.unwrap();
    assert_eq!(text_rows(&c, status).await, before);
    c.batch_execute("DELETE FROM t WHERE id IN (1, 4); FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text_rows(&c, status).await,
        ["ratio degraded 1", "sums running 0"]
    );
    c.batch_execute("DELETE FROM t WHERE id = 2; FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text_rows(&c, status).await,
        ["ratio running 0", "sums running 0"]
    );
    assert_eq!(
        text_rows(&c, "SELECT * FROM sums ORDER BY g").await,
        ["2 1", "3 99999999999999999999999999999999999999"]
    );
}

/// A view from a catalog written before integer constants were typed as PostgreSQL types
/// them (its entry has no `int4_literals`) is planned with bigint constants again on every
/// start, as its state was built: a checkpoint of its state restores and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_from_an_older_catalog_keeps_the_types_its_state_was_built_with() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::barriers_on_request_config(dir.path());
    let args = ["--config", config.to_str().unwrap()];
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE t (a int, b bigint);
         INSERT INTO t VALUES (1, 10), (2, 20);
         CREATE MATERIALIZED VIEW v AS SELECT a + 1 AS x, 5 AS five, b * 2 AS b2 FROM t;
         FLUSH",
    )
    .await
    .unwrap();
    drop(c);
    server.stop(SIGKILL).await;
    // The catalog as an older server wrote it, which kept neither how the view's constants
    // were typed nor its compiled plan; without a checkpoint, the view is built again from the
    // table's log, as that server built it.
    let path = data.join("catalog.json");
    let mut catalog: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    catalog["format"] = 1.into();
    let mut views = 0;
    for object in catalog["objects"].as_array_mut().unwrap() {
        if let Some(view) = object.get_mut("View").and_then(|v| v.as_object_mut()) {
            assert!(view.remove("int4_literals").is_some());
            assert!(view.remove("plan").is_some());
            views += 1;
        }
    }
    assert_eq!(views, 1);
    std::fs::write(&path, serde_json::to_vec_pretty(&catalog).unwrap()).unwrap();
    let types = "SELECT arrow_typeof(x), arrow_typeof(five) FROM v LIMIT 1";
    let expected = ["Int64 Int64"];
    for round in 0..2 {
        let server = ChildServer::start_with(&data, &args).await;
        let c = server.connect().await;
        c.batch_execute(&format!(
            "INSERT INTO t VALUES ({0}, {0}0); FLUSH",
            round + 3
        ))
        .await
        .unwrap();
        assert_eq!(text_rows(&c, types).await, expected, "round {round}");
        let mut rows = text_rows(&c, "SELECT * FROM v").await;
        rows.sort();
        let want: Vec<String> = (1..=round + 3)
            .map(|a| format!("{} 5 {}", a + 1, a * 20))
            .collect();
        assert_eq!(rows, want, "round {round}");
        // The next start restores this checkpoint of the view's state.
        c.batch_execute("CHECKPOINT").await.unwrap();
        drop(c);
        server.stop(SIGKILL).await;
    }
}

/// A restart runs the plan the catalog keeps for a view, not one planned again from its
/// query: a view whose recorded query text no longer matches its plan goes on computing what
/// it was created to compute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_runs_the_views_kept_plan_not_its_query_planned_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::barriers_on_request_config(dir.path());
    let args = ["--config", config.to_str().unwrap()];
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE t (a int, b bigint);
         INSERT INTO t VALUES (1, 10), (2, 20), (2, 5);
         CREATE MATERIALIZED VIEW v AS SELECT a, sum(b) AS s FROM t GROUP BY a;
         FLUSH; CHECKPOINT",
    )
    .await
    .unwrap();
    drop(c);
    server.stop(SIGKILL).await;
    let path = data.join("catalog.json");
    let catalog = std::fs::read_to_string(&path).unwrap();
    let query = "SELECT a, sum(b) AS s FROM t GROUP BY a";
    assert!(catalog.contains(query));
    std::fs::write(
        &path,
        catalog.replace(query, "SELECT a, min(b) AS s FROM t GROUP BY a"),
    )
    .unwrap();
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute("INSERT INTO t VALUES (2, 1), (3, 7); FLUSH")
        .await
        .unwrap();
    let mut rows = text_rows(&c, "SELECT * FROM v").await;
    rows.sort();
    assert_eq!(rows, ["1 10", "2 26", "3 7"]);
}

/// A table ten times the server's memory limit loads, takes a full-scan UPDATE, a point
/// UPDATE and key checks, restarts from a checkpoint, and backfills a new aggregate view, with
/// the server's peak RSS within the limit plus 256 MiB each time: a table's latest rows are
/// read from RocksDB, with only its unsealed changes in memory, a restart reads no rows, and
/// a backfill reads the table a part at a time and sends a view a part per barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_ten_times_the_memory_limit_loads_updates_and_restarts_within_it() {
    const MIB: u64 = 1 << 20;
    const LIMIT: u64 = 32 * MIB;
    // Rows of about 1 KB.
    const ROWS: i64 = 340_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, format!("memory_limit = {LIMIT}\n")).unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let bound = LIMIT + 256 * MIB;
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute("CREATE TABLE big (note text, id bigint PRIMARY KEY, v bigint)")
        .await
        .unwrap();
    for first in (1..=ROWS).step_by(10_000) {
        c.batch_execute(&format!(
            "INSERT INTO big SELECT repeat(md5(value::text), 31), value, 0
               FROM generate_series({first}, {})",
            first + 9_999
        ))
        .await
        .unwrap();
    }
    c.batch_execute("FLUSH").await.unwrap();
    let bytes: u64 = text_rows(&c, "SELECT sum(octet_length(note) + 16) FROM big").await[0]
        .parse()
        .unwrap();
    assert!(bytes > 10 * LIMIT, "the table holds {} MiB", bytes / MIB);
    // A full scan, a point update and key checks against sealed rows.
    let updated = c
        .execute("UPDATE big SET v = v + 1 WHERE id % 1000 = 0", &[])
        .await
        .unwrap();
    assert_eq!(updated, 340);
    let updated = c
        .execute("UPDATE big SET v = 5 WHERE id = 77", &[])
        .await
        .unwrap();
    assert_eq!(updated, 1);
    let duplicate = |id: i64| format!("INSERT INTO big VALUES ('again', {id}, 0)");
    let e = c.batch_execute(&duplicate(12_345)).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e}");
    c.batch_execute("CHECKPOINT").await.unwrap();
    // Changes after the checkpoint are replayed.
    c.batch_execute("UPDATE big SET v = v + 1 WHERE id <= 100")
        .await
        .unwrap();
    let peak = common::peak_rss_bytes(server.pid());
    eprintln!("peak RSS while loading and updating: {} MiB", peak / MIB);
    assert!(peak < bound, "peak RSS {} MiB while loading", peak / MIB);
    drop(c);
    server.stop(SIGKILL).await;

    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    drain(&c).await;
    assert_eq!(
        text_rows(&c, "SELECT count(*), sum(v) FROM big").await,
        [format!("{ROWS} {}", 340 + 99 + 6)]
    );
    let e = c.batch_execute(&duplicate(ROWS)).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e}");
    c.batch_execute(&duplicate(ROWS + 1)).await.unwrap();
    // A new view backfills from the whole table, a part at a time.
    c.batch_execute(
        "CREATE MATERIALIZED VIEW per_group AS
           SELECT id % 100 AS g, count(*) AS n, sum(v) AS s FROM big GROUP BY id % 100;
         FLUSH",
    )
    .await
    .unwrap();
    assert_eq!(
        text_rows(&c, "SELECT count(*), sum(n), sum(s) FROM per_group").await,
        [format!("100 {} {}", ROWS + 1, 340 + 99 + 6)]
    );
    // And a view that keeps every row, from a part of the table per barrier: it never holds
    // the table's rows in one epoch.
    c.batch_execute("CREATE MATERIALIZED VIEW copy AS SELECT id, note FROM big WHERE v >= 0")
        .await
        .unwrap();
    assert_eq!(
        text_rows(
            &c,
            "SELECT count(*), sum(id), sum(octet_length(note)) FROM copy"
        )
        .await,
        text_rows(
            &c,
            "SELECT count(*), sum(id), sum(octet_length(note)) FROM big"
        )
        .await
    );
    let peak = common::peak_rss_bytes(server.pid());
    eprintln!(
        "peak RSS after the restart and a backfill: {} MiB",
        peak / MIB
    );
    assert!(
        peak < bound,
        "peak RSS {} MiB after the restart",
        peak / MIB
    );
    drop(c);
    server.stop(SIGKILL).await;
}

/// A statement larger than memory (400 000 rows of about 210 bytes under a 64 MiB
/// `memory_limit`) is spooled, logged as a group of records and applied a part per epoch
/// (`docs/design/0023-large-writes.md`). Killed while its group is written, nothing of it is
/// there after the restart; killed while its parts are sent (with checkpoints every 300 ms,
/// which may hold some of them), all of it is. One that violates its key in its last row
/// applies nothing, and while a large DELETE is applied another session's reads of a view
/// see all of it or none. Peak RSS stays within the limit plus 256 MiB throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_larger_than_memory_is_applied_whole_or_not_at_all_across_kills() {
    const MIB: u64 = 1 << 20;
    const LIMIT: u64 = 64 * MIB;
    const ROWS: i64 = 400_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        format!("memory_limit = {LIMIT}\n[checkpoint]\ninterval_ms = 300\n"),
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let bound = LIMIT + 256 * MIB;
    let insert =
        format!("INSERT INTO s SELECT g, repeat('y', 200) FROM generate_series(1, {ROWS}) AS t(g)");
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE s (id bigint PRIMARY KEY, v text);
         CREATE MATERIALIZED VIEW c AS SELECT count(*) AS n, sum(length(v)) AS l FROM s;
         INSERT INTO s VALUES (0, 'a')",
    )
    .await
    .unwrap();
    drop(c);
    server.stop(SIGTERM).await;
    let everything = format!("{} {}", ROWS + 1, 200 * ROWS + 1);
    for (failpoint, after) in [
        ("changelog.group_part@2", "1 1"),
        ("table.group_part_sent@3", everything.as_str()),
    ] {
        let env = [("WEIR_FAILPOINTS", failpoint)];
        let server = ChildServer::start_with_env(&data, &args, &env).await;
        let c = server.connect().await;
        let e = c.batch_execute(&insert).await.expect_err("aborted");
        assert!(e.as_db_error().is_none(), "{failpoint}: {e}");
        server.stop(SIGKILL).await;
        let server = ChildServer::start_with(&data, &args).await;
        let c = server.connect().await;
        assert_eq!(
            text_rows(&c, "SELECT * FROM c").await,
            [after],
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&c, "SELECT count(*), sum(length(v)) FROM s").await,
            [after],
            "{failpoint}"
        );
        let peak = common::peak_rss_bytes(server.pid());
        assert!(peak < bound, "{failpoint}: peak RSS {} MiB", peak / MIB);
        drop(c);
        server.stop(SIGTERM).await;
    }
    let server = ChildServer::start_with(&data, &args).await;
    let c = server.connect().await;
    // Its last row's key is its first's: refused, nothing applied.
    let e = c
        .batch_execute(&format!(
            "INSERT INTO s SELECT g, 'x' FROM generate_series({}, {}) AS t(g)
               UNION ALL SELECT {}, 'again'",
            ROWS + 1,
            2 * ROWS,
            ROWS + 1
        ))
        .await
        .unwrap_err();
    let db = e.as_db_error().expect("an error from the server");
    assert_eq!(db.code().code(), "23505", "{e}");
    assert_eq!(
        db.detail(),
        Some(format!("Key (id)=({}) already exists.", ROWS + 1).as_str())
    );
    let e = c
        .batch_execute("INSERT INTO s VALUES (7, 'dup')")
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e}");
    // Readers see a large DELETE whole or not at all.
    let reader = server.connect().await;
    let delete = c.execute("DELETE FROM s WHERE id > 0", &[]);
    tokio::pin!(delete);
    let mut seen = std::collections::BTreeSet::new();
    let deleted = loop {
        tokio::select! {
            deleted = &mut delete => break deleted.unwrap(),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                seen.extend(text_rows(&reader, "SELECT * FROM c").await);
            }
        }
    };
    assert_eq!(deleted, ROWS as u64);
    seen.extend(text_rows(&reader, "SELECT * FROM c").await);
    let whole: std::collections::BTreeSet<String> = [everything, "1 1".to_string()].into();
    assert_eq!(seen, whole, "a reader saw part of a statement");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM s").await, ["1"]);
    let peak = common::peak_rss_bytes(server.pid());
    eprintln!("peak RSS: {} MiB", peak / MIB);
    assert!(peak < bound, "peak RSS {} MiB", peak / MIB);
    assert_eq!(
        std::fs::read_dir(data.join("spool")).unwrap().count(),
        0,
        "spool files go with their statements"
    );
    server.stop(SIGTERM).await;
}

/// A transaction block over two tables, its server killed after its commit point: once
/// after the commit file is named, once after the first table's log has the block and
/// before the second's. Either way the restart applies it whole, to both tables and to the
/// view that joins them; a block rolled back, or cut off by its session's disconnect, leaves
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_killed_after_its_commit_point_is_applied_whole_at_restart() {
    for failpoint in ["table.after_commit_point@1", "table.commit_appended@1"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let server =
            ChildServer::start_with_env(&data, &[], &[("WEIR_FAILPOINTS", failpoint)]).await;
        let client = server.connect().await;
        client
            .batch_execute(
                "CREATE TABLE a (id int PRIMARY KEY, v int);
                 CREATE TABLE b (id int PRIMARY KEY, w int);
                 CREATE MATERIALIZED VIEW ab AS SELECT a.id, a.v, b.w FROM a JOIN b ON a.id = b.id;
                 INSERT INTO a VALUES (1, 10);
                 INSERT INTO b VALUES (1, 100);
                 BEGIN; INSERT INTO a VALUES (9, 9); ROLLBACK;",
            )
            .await
            .unwrap();
        // A block its client leaves without ending.
        let other = server.connect().await;
        other
            .batch_execute("BEGIN; INSERT INTO a VALUES (8, 8); INSERT INTO b VALUES (8, 8)")
            .await
            .unwrap();
        drop(other);
        let err = client
            .batch_execute(
                "BEGIN;
                 UPDATE a SET v = v + 1 WHERE id = 1;
                 INSERT INTO a VALUES (2, 20);
                 INSERT INTO b VALUES (2, 200);
                 COMMIT;",
            )
            .await
            .expect_err("the server aborts at the failpoint");
        assert!(err.as_db_error().is_none(), "{failpoint}: {err}");
        server.stop(9).await;

        let server = ChildServer::start(&data).await;
        let client = server.connect().await;
        assert_eq!(
            text_rows(&client, "SELECT * FROM a ORDER BY id").await,
            ["1 11", "2 20"],
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&client, "SELECT * FROM b ORDER BY id").await,
            ["1 100", "2 200"],
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&client, "SELECT * FROM ab ORDER BY id").await,
            ["1 11 100", "2 20 200"],
            "{failpoint}"
        );
        assert_eq!(
            std::fs::read_dir(data.join("tables/commits"))
                .unwrap()
                .count(),
            0,
            "{failpoint}: the commit file is gone once redone"
        );
        drop(client);
        server.stop(15).await;
    }
}

/// DDL in transaction blocks across a kill: a block that creates a table and a view, writes
/// both a new and an old table and drops another, its server killed after its commit point
/// (the commit file named; one table's log holding the block; the catalog saved and the file
/// not yet removed), is applied whole at the restart; a block left open by the kill, and
/// another whose COMMIT fails before its commit point, leave nothing of their DDL behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocks_ddl_is_applied_with_its_writes_or_not_at_all_across_a_kill() {
    for failpoint in [
        "table.after_commit_point@1",
        "table.commit_appended@1",
        "table.block_settled@1",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let server = ChildServer::start_with_env(
            &data,
            &[],
            &[(
                "WEIR_FAILPOINTS",
                &format!("{failpoint},changelog.commit@1:eio"),
            )],
        )
        .await;
        let client = server.connect().await;
        client
            .batch_execute(
                "CREATE TABLE a (id int PRIMARY KEY, v int);
                 CREATE TABLE old (x int);
                 INSERT INTO a VALUES (1, 10);",
            )
            .await
            .unwrap();
        // The first commit file's write fails: that block commits nothing, DDL included.
        let err = client
            .batch_execute(
                "BEGIN;
                 CREATE TABLE failed (x int);
                 INSERT INTO failed VALUES (1);
                 INSERT INTO a VALUES (5, 50);
                 DROP TABLE old;
                 COMMIT;",
            )
            .await
            .expect_err("the commit file cannot be written");
        assert_eq!(
            err.as_db_error().map(|e| e.code().code()),
            Some("58030"),
            "{failpoint}: {err}"
        );
        assert_eq!(text_rows(&client, "SHOW TABLES").await, ["a", "old"]);
        // A block the kill leaves open.
        let other = server.connect().await;
        other
            .batch_execute(
                "BEGIN;
                 CREATE TABLE lost (x int);
                 INSERT INTO lost VALUES (1);
                 CREATE MATERIALIZED VIEW lost_count AS SELECT count(*) AS n FROM a;",
            )
            .await
            .unwrap();
        let err = client
            .batch_execute(
                "BEGIN;
                 CREATE TABLE c (id int PRIMARY KEY, w int);
                 INSERT INTO c VALUES (1, 100), (2, 200);
                 UPDATE a SET v = 11 WHERE id = 1;
                 CREATE MATERIALIZED VIEW ac AS SELECT a.id, a.v, c.w FROM a JOIN c ON a.id = c.id;
                 DROP TABLE old;
                 COMMIT;",
            )
            .await
            .expect_err("the server aborts at the failpoint");
        assert!(err.as_db_error().is_none(), "{failpoint}: {err}");
        server.stop(9).await;

        let server = ChildServer::start(&data).await;
        let client = server.connect().await;
        assert_eq!(
            text_rows(&client, "SHOW TABLES").await,
            ["a", "c"],
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&client, "SHOW MATERIALIZED VIEWS").await.len(),
            1,
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&client, "SELECT * FROM a ORDER BY id").await,
            ["1 11"],
            "{failpoint}"
        );
        assert_eq!(
            text_rows(&client, "SELECT * FROM ac ORDER BY id").await,
            ["1 11 100"],
            "{failpoint}"
        );
        // The names the lost blocks took are free, and a new table of one starts empty.
        client
            .batch_execute("CREATE TABLE lost (x int); CREATE TABLE failed (x int)")
            .await
            .unwrap();
        assert!(text_rows(&client, "SELECT * FROM lost").await.is_empty());
        assert_eq!(
            std::fs::read_dir(data.join("tables/commits"))
                .unwrap()
                .count(),
            0,
            "{failpoint}: the commit file is gone once redone"
        );
        drop((client, other));
        server.stop(15).await;
    }
}
