//! Disk and descriptor errors: a full disk (ENOSPC), no descriptor left (EMFILE) or a device
//! error (EIO) at the change log, the catalog or the state store refuses the statement with
//! PostgreSQL's code (53100, 53000, 58030) and keeps nothing of it; writes go on by themselves
//! once the error is gone, and after a restart every acknowledged write is there and nothing
//! else. Failpoints inject the errors (debug builds); a real full tmpfs does it too, where the
//! test may mount one.

mod common;

use common::{http, text_rows, ChildServer};

const SIGKILL: i32 = 9;

/// The SQLSTATE of a failed statement.
fn code(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

/// The ids in table t, in order.
async fn ids(client: &tokio_postgres::Client) -> Vec<String> {
    let mut rows = text_rows(client, "SELECT id FROM t").await;
    rows.sort_by_key(|r| r.parse::<i32>().unwrap());
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_log_and_catalog_errors_refuse_the_statement_and_writes_resume_by_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The first start saves the catalog once: the second save is the first CREATE TABLE.
    // Change-log appends 3 and 4 find the disk full; the cut-back after the first of them
    // fails too (the next append cuts back first); append 6 is written but its fsync fails.
    let failpoints = "catalog.save@2:enospc,changelog.write@3..4:enospc,\
                      changelog.cut_back@1:eio,changelog.sync@4:emfile";
    let server = ChildServer::start_with_env(&data, &[], &[("WEIR_FAILPOINTS", failpoints)]).await;
    let client = server.connect().await;
    let e = client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        .await
        .unwrap_err();
    assert_eq!(code(&e), "53100", "{e}");
    // Refused means it did not happen: the table is not there, and can be created.
    let e = client.batch_execute("SELECT * FROM t").await.unwrap_err();
    assert_eq!(code(&e), "42P01", "{e}");
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int);
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n, sum(v) AS total FROM t;",
        )
        .await
        .unwrap();
    let expected = ["ok", "ok", "53100", "53100", "ok", "53000", "ok", "ok"];
    let mut outcomes = Vec::new();
    let mut acknowledged = Vec::new();
    for id in 1..=expected.len() {
        match client
            .batch_execute(&format!("INSERT INTO t VALUES ({id}, {id})"))
            .await
        {
            Ok(()) => {
                outcomes.push("ok".to_string());
                acknowledged.push(id.to_string());
            }
            Err(e) => outcomes.push(code(&e)),
        }
    }
    assert_eq!(outcomes, expected);
    // A refused write's primary key is free: the row was never kept.
    client
        .batch_execute("INSERT INTO t VALUES (3, 3); FLUSH")
        .await
        .unwrap();
    acknowledged.insert(2, "3".to_string());
    assert_eq!(ids(&client).await, acknowledged);
    drop(client);
    server.stop(SIGKILL).await;

    // The log holds exactly the acknowledged statements: no refused one, no torn record.
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(ids(&client).await, acknowledged);
    assert_eq!(
        text_rows(&client, "SELECT * FROM s").await,
        text_rows(&client, "SELECT count(*), sum(v) FROM t").await
    );
    server.stop(15).await;
}

/// The dataflow's running actors, as the admin port's metrics count them.
async fn actors(admin: std::net::SocketAddr) -> u64 {
    let (status, metrics) = http(admin, "GET /metrics").await;
    assert_eq!(status, 200);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("weir_dataflow_actors "))
        .expect("weir_dataflow_actors in the metrics")
        .parse()
        .unwrap()
}

/// DDL refused because the catalog cannot be saved leaves nothing behind: what a CREATE
/// started stops and drops its state (a view created again later holds each row once), and
/// a DROP changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_refused_by_a_catalog_error_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Save 1 is the first start's, save 2 CREATE TABLE t's; saves 3 to 6 fail.
    let server = ChildServer::start_with_env(
        &data,
        &["--admin-listen", "127.0.0.1:0"],
        &[("WEIR_FAILPOINTS", "catalog.save@3..6:enospc")],
    )
    .await;
    let admin = server.admin.expect("an admin port");
    let c = server.connect().await;
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int);
         INSERT INTO t SELECT value, value + 0 FROM generate_series(1, 100);
         FLUSH",
    )
    .await
    .unwrap();
    let running = actors(admin).await;
    for refused in [
        "CREATE MATERIALIZED VIEW v AS SELECT v % 10 AS g, count(*) AS n FROM t GROUP BY v % 10",
        "CREATE TABLE u (id int)",
        "CREATE SOURCE s WITH (connector = 'nexmark', stream = 'bid', events = 10)",
        "DROP TABLE t",
    ] {
        let e = c.batch_execute(refused).await.unwrap_err();
        assert_eq!(code(&e), "53100", "{refused}: {e}");
        assert_eq!(
            actors(admin).await,
            running,
            "{refused} left actors running"
        );
    }
    for gone in ["v", "u", "s"] {
        let e = c
            .batch_execute(&format!("SELECT * FROM {gone}"))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "42P01", "{e}");
    }
    // The table is still there, and takes writes.
    c.batch_execute("INSERT INTO t VALUES (101, 101); FLUSH")
        .await
        .unwrap();
    c.batch_execute(
        "CREATE MATERIALIZED VIEW v AS SELECT v % 10 AS g, count(*) AS n FROM t GROUP BY v % 10;
         FLUSH",
    )
    .await
    .unwrap();
    let expected = ["101 10"];
    let view = "SELECT sum(n), count(*) FROM v";
    assert_eq!(text_rows(&c, view).await, expected);
    drop(c);
    server.stop(SIGKILL).await;
    let server = ChildServer::start(&data).await;
    let c = server.connect().await;
    c.batch_execute("FLUSH").await.unwrap();
    assert_eq!(text_rows(&c, view).await, expected);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM t").await, ["101"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_state_store_refuses_writes_and_a_restart_recovers_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int);
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n, sum(v) AS total FROM t;
             INSERT INTO t SELECT x, 2 * x FROM generate_series(1, 100) AS g(x);
             FLUSH;",
        )
        .await
        .unwrap();
    drop(client);
    server.stop(SIGKILL).await;

    // Started again, the state store's first write finds the disk full: the table's actor
    // stops, and writes are refused with the reason, before anything is logged.
    let server =
        ChildServer::start_with_env(&data, &[], &[("WEIR_FAILPOINTS", "state.write@1:enospc")])
            .await;
    let client = server.connect().await;
    let (mut acknowledged, mut refused) = (100, None);
    for id in 101..200 {
        client.batch_execute("FLUSH").await.unwrap();
        match client
            .batch_execute(&format!("INSERT INTO t VALUES ({id}, {id})"))
            .await
        {
            Ok(()) => acknowledged += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("writes were never refused");
    assert_eq!(code(&e), "53100", "{e}");
    let message = e.as_db_error().unwrap().message().to_string();
    assert!(message.contains("No space left on device"), "{message}");
    // Reads are refused the same way: the table and the view stopped at the failed epoch,
    // without the writes acknowledged after it.
    for read in ["SELECT count(*) FROM t", "SELECT * FROM s"] {
        let e = client.batch_execute(read).await.unwrap_err();
        assert_eq!(code(&e), "53100", "{read}: {e}");
    }
    drop(client);
    server.stop(SIGKILL).await;

    // With space again, a restart brings everything back.
    let server = ChildServer::start(&data).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    let count: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, acknowledged);
    assert_eq!(
        text_rows(&client, "SELECT * FROM s").await,
        text_rows(&client, "SELECT count(*), sum(v) FROM t").await
    );
    server.stop(15).await;
}

/// A tmpfs of a few MiB mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// None where this process may not mount file systems (not root, or no CAP_SYS_ADMIN).
    fn mount(mib: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(Tmpfs { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// The data directory on a real tmpfs that fills up: every write is either acknowledged and
/// kept, or refused with 53100 and not kept; once space is back, a restart (if the state
/// store hit the full disk too) brings everything acknowledged back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_full_disk_loses_no_acknowledged_write() {
    let Some(fs) = Tmpfs::mount(64) else {
        common::skip(
            "disk::a_real_full_disk_loses_no_acknowledged_write",
            "mounting a tmpfs needs root or CAP_SYS_ADMIN (CI runs as root)",
        );
        return;
    };
    let data = fs.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = fs.path().join("weir.toml");
    std::fs::write(&config, "[checkpoint]\ninterval_ms = 500\n").unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, pad text);
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n, sum(length(pad)) AS bytes FROM t;",
        )
        .await
        .unwrap();
    // Leave about 8 MiB free.
    let filler = fs.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 1 << 20];
        let free = || free_bytes(fs.path());
        while free() > 8 << 20 {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for id in 1..=2000 {
        let sql = format!("INSERT INTO t VALUES ({id}, repeat('x', 20000))");
        match client.batch_execute(&sql).await {
            Ok(()) => acknowledged.push(id.to_string()),
            Err(e) => {
                assert_eq!(code(&e), "53100", "{e}");
                refused += 1;
                if refused == 20 {
                    break;
                }
            }
        }
    }
    assert!(refused > 0, "the disk never filled");
    // Space comes back.
    std::fs::remove_file(&filler).unwrap();
    let late = 100_000;
    let resumed = client
        .batch_execute(&format!("INSERT INTO t VALUES ({late}, 'late')"))
        .await;
    match &resumed {
        Ok(()) => acknowledged.push(late.to_string()),
        // The state store hit the full disk too: its table's actor stopped.
        Err(e) => assert_eq!(code(e), "53100", "{e}"),
    }
    eprintln!(
        "full disk: {} writes acknowledged, {refused} refused; after space came back: {}",
        acknowledged.len(),
        match &resumed {
            Ok(()) => "written".to_string(),
            Err(e) => format!("refused ({e})"),
        }
    );
    drop(client);
    server.stop(SIGKILL).await;

    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    acknowledged.sort_by_key(|r| r.parse::<i32>().unwrap());
    assert_eq!(ids(&client).await, acknowledged);
    assert_eq!(
        text_rows(&client, "SELECT * FROM s").await,
        text_rows(&client, "SELECT count(*), sum(length(pad)) FROM t").await
    );
    client
        .batch_execute("INSERT INTO t VALUES (200000, 'after'); FLUSH")
        .await
        .unwrap();
    server.stop(15).await;
}

/// Free bytes of the file system holding `path` (`df`'s available column).
fn free_bytes(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap()
}

/// With few file descriptors left, new connections are refused (53300) before they take the
/// descriptors the server keeps for its own files: checkpoints (RocksDB opens new files) and
/// writes go on, where RocksDB running out stopped every actor until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cannot_take_the_descriptors_the_server_needs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int);
             CREATE MATERIALIZED VIEW s AS SELECT count(*) AS n FROM t;
             INSERT INTO t VALUES (1, 1);",
        )
        .await
        .unwrap();
    let limit = libc::rlimit {
        rlim_cur: 160,
        rlim_max: 160,
    };
    // SAFETY: prlimit reads the new limit from the struct it is given.
    let set = unsafe {
        libc::prlimit(
            server.pid() as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    let conn_str = format!(
        "host={} port={} user=weir dbname=weir",
        server.addr.ip(),
        server.addr.port()
    );
    let mut held = Vec::new();
    let refused = loop {
        let connect = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls);
        match tokio::time::timeout(std::time::Duration::from_secs(10), connect).await {
            Ok(Ok((c, conn))) => {
                tokio::spawn(conn);
                held.push(c);
                assert!(held.len() < 150, "no connection was refused");
            }
            Ok(Err(e)) => break e,
            Err(_) => panic!("connection {} neither admitted nor refused", held.len() + 1),
        }
    };
    assert_eq!(code(&refused), "53300", "{refused}");
    // The server's own files still open: a checkpoint writes new RocksDB files, and writes go on.
    client
        .batch_execute(
            "INSERT INTO t VALUES (2, 2); FLUSH; CHECKPOINT; INSERT INTO t VALUES (3, 3); FLUSH",
        )
        .await
        .unwrap();
    assert_eq!(text_rows(&client, "SELECT n FROM s").await, ["3"]);
    drop(held);
    // Connections are admitted again once others close.
    let mut again = None;
    for _ in 0..100 {
        match tokio_postgres::connect(&conn_str, tokio_postgres::NoTls).await {
            Ok((c, conn)) => {
                tokio::spawn(conn);
                again = Some(c);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let again = again.expect("connections are admitted again");
    assert_eq!(text_rows(&again, "SELECT n FROM s").await, ["3"]);
    server.stop(15).await;
}
