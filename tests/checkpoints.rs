//! Checkpoints against a real RocksDB and real object stores (a local directory, and moto's
//! S3-compatible server): what each uploads and reuses, what expiry deletes, and that the store
//! never holds an object no retained checkpoint names.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{http, text_rows, ChildServer, S3Server, TestServer};
use weir::checkpoint::{Manifest, Storage};

/// `SHOW CHECKPOINTS` as (id, status, files_uploaded, files_reused, bytes_uploaded,
/// bytes_referenced), newest first.
async fn shown(client: &tokio_postgres::Client) -> Vec<(i64, String, i64, i64, i64, i64)> {
    client
        .query("SHOW CHECKPOINTS", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get("id"),
                r.get("status"),
                r.get("files_uploaded"),
                r.get("files_reused"),
                r.get("bytes_uploaded"),
                r.get("bytes_referenced"),
            )
        })
        .collect()
}

/// Asserts that each (view, query) pair reads the same rows; returns the views' rows.
async fn views_equal_their_queries(
    client: &tokio_postgres::Client,
    checks: &[(&str, &str)],
) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for (view, query) in checks {
        let rows = text_rows(client, view).await;
        assert_eq!(rows, text_rows(client, query).await, "{view}");
        all.push(rows);
    }
    all
}

/// The view `by_g` most tests here make, and its query.
const BY_G: (&str, &str) = (
    "SELECT * FROM by_g ORDER BY g",
    "SELECT g, count(*) AS n, sum(v) AS s, max(v) AS top FROM t GROUP BY g ORDER BY g",
);

async fn checkpoint(client: &tokio_postgres::Client) -> i64 {
    client.query_one("CHECKPOINT", &[]).await.unwrap().get("id")
}

/// A base checkpoint: a RocksDB image, whatever the deltas since the last one.
async fn checkpoint_base(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("CHECKPOINT BASE", &[])
        .await
        .unwrap()
        .get("id")
}

/// Every object of checkpoints in the local store (all but the generation objects, see
/// `generations`), relative to its root.
fn objects(root: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                out.insert(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out.retain(|o| !o.starts_with("generations/"));
    out
}

fn manifest(root: &Path, id: i64) -> Manifest {
    let bytes = std::fs::read(root.join(format!("checkpoints/{id:020}/manifest.json"))).unwrap();
    Manifest::decode(&bytes).unwrap()
}

/// The objects retained checkpoints name, with their manifests.
fn named(root: &Path, ids: &[i64]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for id in ids {
        let m = manifest(root, *id);
        assert_eq!(m.id, *id as u64);
        for f in m.objects() {
            let size = std::fs::metadata(root.join(&f.object)).unwrap().len();
            assert_eq!(size, f.size, "{} has the size its manifest says", f.object);
            out.insert(f.object.clone());
        }
        out.insert(format!("checkpoints/{id:020}/manifest.json"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_upload_only_new_files_and_expire_what_nothing_names() {
    let server = TestServer::start_with(|c| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.retained = 2;
    })
    .await;
    let root = server.dir.path().join("checkpoint-store");
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, payload text);
             CREATE MATERIALIZED VIEW by_g AS SELECT g, count(*) AS n FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW copy AS SELECT id, payload FROM t WHERE id % 2 = 0;",
        )
        .await
        .unwrap();
    // Several MB of state: the table's rows, half of them again in `copy`.
    for chunk in 0..8 {
        client
            .batch_execute(&format!(
                "INSERT INTO t SELECT value, value % 97, repeat(md5(value::text), 6) \
                 FROM generate_series({}, {})",
                chunk * 5000,
                chunk * 5000 + 4999
            ))
            .await
            .unwrap();
    }
    let first = checkpoint(&client).await;
    assert_eq!(first, 1);
    let s = shown(&client).await;
    let (id, status, uploaded, reused, bytes_up, bytes_ref) = s[0].clone();
    assert_eq!((id, status.as_str(), reused), (1, "completed", 0));
    assert!(uploaded > 0);
    assert_eq!(
        bytes_up, bytes_ref,
        "the first checkpoint uploads everything"
    );
    assert!(bytes_up > 3 << 20, "several MB of state: {bytes_up}");
    // The manifest records the table's offset: the 8 statements fed before the barrier.
    let first_manifest = manifest(&root, 1);
    let offsets: Vec<u64> = first_manifest.offsets.values().copied().collect();
    assert_eq!(offsets, [8]);
    // And the catalog at that epoch: the table and both views.
    let catalog = first_manifest.catalog.to_string();
    for name in ["\"t\"", "\"by_g\"", "\"copy\""] {
        assert!(catalog.contains(name), "{name} in {catalog}");
    }

    // A small change: the second checkpoint uploads a small fraction of the first.
    client
        .batch_execute(
            "INSERT INTO t VALUES (-1, 1, 'x'), (-2, 2, 'y'); UPDATE t SET g = 0 WHERE id = 7",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 2);
    let offsets: Vec<u64> = manifest(&root, 2).offsets.values().copied().collect();
    assert_eq!(offsets, [10]);
    let (_, status, _, reused, small_up, small_ref) = shown(&client).await[0].clone();
    assert_eq!(status, "completed");
    assert!(reused > 0);
    assert!(
        small_up * 20 < bytes_up,
        "second checkpoint uploaded {small_up} of {small_ref} bytes, the first {bytes_up}"
    );
    assert_eq!(objects(&root), named(&root, &[1, 2]));

    // Compaction rewrites every file: the next base checkpoint uploads the new ones, and the
    // first checkpoint expires with the files only it named.
    let first_files = named(&root, &[1]);
    server.db.compact_state().await.unwrap();
    assert_eq!(checkpoint_base(&client).await, 3);
    let after = shown(&client).await;
    assert_eq!(after[2].1, "expired");
    assert!(!root
        .join(format!("checkpoints/{:020}", 1))
        .join("manifest.json")
        .exists());
    let live = named(&root, &[2, 3]);
    assert_eq!(
        objects(&root),
        live,
        "the store holds exactly what 2 and 3 name"
    );
    let second_files = named(&root, &[2]);
    let gone: Vec<&String> = first_files.difference(&second_files).collect();
    assert!(!gone.is_empty(), "checkpoint 1 had files of its own");
    assert!(gone.iter().all(|o| !root.join(o).exists()));

    // Another small change after compaction reuses the compacted files.
    client
        .batch_execute("DELETE FROM t WHERE id < 100")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 4);
    let (_, _, _, reused, up, referenced) = shown(&client).await[0].clone();
    assert!(reused > 0 && up * 10 < referenced, "{up} of {referenced}");
    assert_eq!(objects(&root), named(&root, &[3, 4]));

    // The same, as system tables.
    let listed: Vec<(i64, String)> = client
        .query(
            "SELECT id, status FROM weir_catalog.checkpoints WHERE id >= 2 ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        listed,
        [
            (2, "expired".to_string()),
            (3, "completed".to_string()),
            (4, "completed".to_string())
        ]
    );
    let files = client
        .query_one(
            "SELECT count(*), max(ref_count), \
             count(*) FILTER (WHERE checkpoint_ids = '{3,4}') \
             FROM weir_catalog.checkpoint_files",
            &[],
        )
        .await
        .unwrap();
    let objects_named = named(&root, &[3, 4]).len() as i64 - 2; // less the two manifests
    assert_eq!(files.get::<_, i64>(0), objects_named);
    assert_eq!(files.get::<_, i64>(1), 2);
    assert!(
        files.get::<_, i64>(2) > 0,
        "compacted files are shared by 3 and 4"
    );

    // Ids only increase, also across a restart; the checkpoints found in the store stay
    // retained until newer ones replace them.
    drop(client);
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, |c| c.checkpoint.interval_ms = 0).await;
    let client = server.connect().await;
    let before: Vec<i64> = shown(&client).await.iter().map(|r| r.0).collect();
    assert_eq!(before, [4, 3]);
    assert_eq!(checkpoint(&client).await, 5);
    assert_eq!(objects(&root), named(&root, &[4, 5]));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_and_the_command_line_take_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, "[checkpoint]\ninterval_ms = 0\n").unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start_with(
        &data,
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
    )
    .await;
    let admin = server.admin.expect("an admin port");
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (a int); INSERT INTO t SELECT * FROM generate_series(1, 1000);",
        )
        .await
        .unwrap();

    // Another system triggers one, with a label.
    let (status, body) = http(admin, "POST /api/v1/checkpoints?label=nightly%20run").await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["id"], 1);
    assert!(answer["epoch"].as_u64().unwrap() > 0);

    // The command line, over SQL.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoint", "--server", &server.addr.to_string()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("checkpoint 2 complete"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let (status, body) = http(admin, "GET /api/v1/checkpoints").await;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list[0]["id"], 2);
    assert_eq!(list[0]["kind"], "manual");
    assert_eq!(list[1]["kind"], "external");
    assert_eq!(list[1]["label"], "nightly run");
    assert_eq!(list[1]["status"], "completed");

    let (status, metrics) = http(admin, "GET /metrics").await;
    assert_eq!(status, 200);
    for line in [
        "weir_checkpoints_completed_total 2",
        "weir_checkpoints_failed_total 0",
        "weir_checkpoint_last_completed_id 2",
        "weir_checkpoint_duration_seconds_count 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let barriers: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("weir_barrier_latency_seconds_count "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(barriers > 2);

    assert_eq!(http(admin, "GET /nowhere").await.0, 404);
    assert_eq!(http(admin, "DELETE /api/v1/checkpoints").await.0, 405);
    assert!(server.stop(15).await.success());
}

/// The objects the manifests of checkpoints `ids` name (with their manifests), each checked
/// against the size the store reports.
async fn named_in(store: &Storage, ids: &[i64]) -> BTreeSet<String> {
    let sizes: std::collections::BTreeMap<String, u64> =
        store.list("").await.unwrap().into_iter().collect();
    let mut out = BTreeSet::new();
    for id in ids {
        let name = format!("checkpoints/{id:020}/manifest.json");
        let m = Manifest::decode(&store.get(&name).await.unwrap()).unwrap();
        assert_eq!(m.id, *id as u64);
        for f in m.objects() {
            assert_eq!(sizes.get(&f.object), Some(&f.size), "{}", f.object);
            out.insert(f.object.clone());
        }
        out.insert(name);
    }
    out
}

/// Every object of checkpoints in `store` (all but the generation objects).
async fn listed(store: &Storage) -> BTreeSet<String> {
    store
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.0)
        .filter(|o| !o.starts_with("generations/"))
        .collect()
}

/// The generation objects in `store`.
async fn generations(store: &Storage) -> Vec<String> {
    let listed = store.list("generations").await.unwrap();
    listed.into_iter().map(|o| o.0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_go_to_an_s3_compatible_store() {
    let s3 = S3Server::start().await;
    s3.create_bucket("weir-checkpoints").await;
    let url = "s3://weir-checkpoints/cluster-a";
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.storage = Some(url.into());
        c.checkpoint.s3 = s3.options();
        c.checkpoint.interval_ms = 0;
        c.checkpoint.retained = 2;
    };
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, payload text);
             CREATE MATERIALIZED VIEW by_g AS SELECT g, count(*) AS n FROM t GROUP BY g;
             INSERT INTO t SELECT value, value % 31, repeat(md5(value::text), 4)
             FROM generate_series(1, 20000);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    client
        .batch_execute("INSERT INTO t VALUES (-1, 1, 'x')")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 2);
    let s = shown(&client).await;
    assert_eq!(s[0].1, "completed");
    assert!(s[0].3 > 0, "the second checkpoint reuses files: {s:?}");
    assert!(s[0].4 * 10 < s[1].4, "and uploads a small part: {s:?}");

    // What the bucket holds, read with the same options: exactly what 1 and 2 name, all of
    // it under the URL's prefix.
    let store = Storage::open(url, &s3.options()).unwrap();
    assert_eq!(listed(&store).await, named_in(&store, &[1, 2]).await);
    let bucket = Storage::open("s3://weir-checkpoints", &s3.options()).unwrap();
    let everything = listed(&bucket).await;
    assert!(everything.iter().all(|o| o.starts_with("cluster-a/")));
    assert_eq!(everything.len(), listed(&store).await.len() + 1);
    assert_eq!(
        generations(&store).await,
        [format!("generations/{:020}.json", 1)]
    );

    // Compaction, a third checkpoint (a base one): the first expires and its own files
    // leave the bucket.
    server.db.compact_state().await.unwrap();
    assert_eq!(checkpoint_base(&client).await, 3);
    assert_eq!(listed(&store).await, named_in(&store, &[2, 3]).await);

    // A restart adopts the bucket's checkpoints; ids continue.
    drop(client);
    let dir = server.stop_and_close().await;
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    let ids: Vec<i64> = shown(&client).await.iter().map(|r| r.0).collect();
    assert_eq!(ids, [3, 2]);
    assert_eq!(checkpoint(&client).await, 4);
    assert_eq!(listed(&store).await, named_in(&store, &[3, 4]).await);
    assert_eq!(
        generations(&store).await,
        [format!("generations/{:020}.json", 2)],
        "the restarted server took the store over, and the older generation went"
    );

    // Changes of every kind, then delta checkpoints over base 3: a new machine (an empty
    // data directory, the same bucket) restores every table and view from the bucket alone,
    // as they were at the newest checkpoint, whose restore reads base 3 and deltas 4 to 6.
    client
        .batch_execute(
            "INSERT INTO t SELECT value, value % 7, 'new' FROM generate_series(20001, 20500);
             UPDATE t SET g = g + 100, payload = 'moved' WHERE id % 97 = 0;
             DELETE FROM t WHERE id % 101 = 0",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 5);
    client
        .batch_execute(
            "UPDATE t SET payload = 'again' WHERE id % 89 = 0; DELETE FROM t WHERE id < 0",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 6);
    let modes = modes(&client).await;
    assert_eq!(
        modes[modes.len() - 4..],
        ["base", "delta", "delta", "delta"]
    );
    client.batch_execute("FLUSH").await.unwrap();
    let table = "SELECT id, g, payload FROM t ORDER BY id";
    let view = "SELECT g, n FROM by_g ORDER BY g";
    let (table_at_six, view_at_six) = (
        text_rows(&client, table).await,
        text_rows(&client, view).await,
    );
    assert_eq!(
        view_at_six,
        text_rows(&client, "SELECT g, count(*) FROM t GROUP BY g ORDER BY g").await
    );
    drop(client);
    server.stop().await;
    let fresh = TestServer::start_with(configure).await;
    let client = fresh.connect().await;
    assert_eq!(text_rows(&client, table).await, table_at_six);
    assert_eq!(text_rows(&client, view).await, view_at_six);
    let restored: Vec<String> = text_rows(
        &client,
        "SELECT checkpoint_id, from_store_alone, files_reused, files_downloaded > 0 \
         FROM weir_catalog.recoveries ORDER BY started_at DESC LIMIT 1",
    )
    .await;
    assert_eq!(restored, ["6 t 0 t"]);
    // It goes on from there: writes, and a checkpoint of its own into the bucket.
    client
        .batch_execute("INSERT INTO t VALUES (30000, 1, 'after')")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 7);
    fresh.stop().await;
}

#[tokio::test]
async fn a_bad_storage_url_is_refused_clearly() {
    let none = std::collections::BTreeMap::new();
    for (url, says) in [
        ("gs://bucket/x", "must start with file:// or s3://"),
        ("file://relative/x", "needs an absolute path"),
        ("s3:///x", "names no bucket"),
    ] {
        let e = Storage::open(url, &none).err().expect(url).to_string();
        assert!(e.contains(says), "{url}: {e}");
    }
    let bad = [("no_such_option".to_string(), "1".to_string())].into();
    let e = Storage::open("s3://b/p", &bad).err().unwrap().to_string();
    assert!(e.contains("unknown S3 option \"no_such_option\""), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_restores_the_newest_checkpoint_and_replays_the_logs_after_it() {
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.streaming_parallelism = 2;
    };
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
             CREATE MATERIALIZED VIEW by_g AS
               SELECT g, count(*) AS n, sum(v) AS s, max(v) AS top FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW gone AS SELECT id FROM t WHERE v > 10;
             INSERT INTO t SELECT value, value % 7, value % 13 FROM generate_series(1, 5000);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    // After the checkpoint: changes, a view dropped, a table and views created.
    client
        .batch_execute(
            "INSERT INTO t SELECT value, value % 7, value % 5 FROM generate_series(5001, 6000);
             DELETE FROM t WHERE id % 10 = 0;
             UPDATE t SET v = v + 100 WHERE id % 9 = 0;
             DROP MATERIALIZED VIEW gone;
             CREATE TABLE u (k int);
             INSERT INTO u VALUES (1), (2), (2);
             CREATE MATERIALIZED VIEW u_n AS SELECT k, count(*) AS n FROM u GROUP BY k;
             CREATE MATERIALIZED VIEW late AS SELECT g, min(v) AS lo FROM t GROUP BY g;",
        )
        .await
        .unwrap();
    let checks = [
        BY_G,
        (
            "SELECT * FROM u_n ORDER BY k",
            "SELECT k, count(*) AS n FROM u GROUP BY k ORDER BY k",
        ),
        (
            "SELECT * FROM late ORDER BY g",
            "SELECT g, min(v) AS lo FROM t GROUP BY g ORDER BY g",
        ),
    ];
    let before = views_equal_their_queries(&client, &checks).await;
    drop(client);
    let dir = server.stop_and_close().await;

    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    for ((view, query), rows) in checks.iter().zip(&before) {
        assert_eq!(
            &text_rows(&client, view).await,
            rows,
            "{view} after the restart"
        );
        assert_eq!(
            text_rows(&client, query).await,
            *rows,
            "{query} after the restart"
        );
    }
    // The dataflow goes on from the restored state.
    client
        .batch_execute("INSERT INTO t VALUES (100000, 3, 1000); INSERT INTO u VALUES (7)")
        .await
        .unwrap();
    views_equal_their_queries(&client, &checks).await;
    // The next checkpoint reuses the restored files instead of uploading the state again:
    // only a restore puts them back on disk under their names.
    assert_eq!(checkpoint(&client).await, 2);
    let (_, status, _, reused, _, _) = shown(&client).await[0].clone();
    assert_eq!(status, "completed");
    assert!(reused > 0, "checkpoint 2 reuses checkpoint 1's files");
    // Its offsets count every record of the logs, replayed ones included.
    let root = server.dir.path().join("checkpoint-store");
    let offsets: Vec<u64> = manifest(&root, 2).offsets.values().copied().collect();
    assert_eq!(
        offsets,
        [5, 2],
        "t: 4 statements before the restart, 1 after; u: 1 and 1"
    );
    server.stop().await;
}

/// The modes of the checkpoints `weir_catalog.checkpoints` shows, oldest first.
async fn modes(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query("SELECT mode FROM weir_catalog.checkpoints ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_checkpoints_restore_exactly_and_a_base_one_comes_after_max_deltas() {
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.max_deltas = 3;
        c.streaming_parallelism = 2;
    };
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int, p text);
             CREATE MATERIALIZED VIEW by_g AS
               SELECT g, count(*) AS n, sum(v) AS s, max(v) AS top FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW odd AS SELECT id, p FROM t WHERE v % 2 = 1;
             CREATE MATERIALIZED VIEW dropped AS SELECT g, min(v) AS lo FROM t GROUP BY g;
             INSERT INTO t SELECT value, value % 17, value % 101, md5(value::text)
             FROM generate_series(1, 20000);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    // Each round inserts, updates (a key's value changed in several checkpoints) and
    // deletes (keys the base holds), then checkpoints.
    let round = |i: i64| {
        format!(
            "INSERT INTO t SELECT value, value % 17, value % 7, 'r{i}' \
               FROM generate_series({lo}, {hi});
             UPDATE t SET v = v + {i} WHERE id % 97 = {i};
             DELETE FROM t WHERE id % 89 = {i};",
            lo = 100_000 * i,
            hi = 100_000 * i + 100
        )
    };
    for i in 1..=4 {
        client.batch_execute(&round(i)).await.unwrap();
        assert_eq!(checkpoint(&client).await, i + 1);
    }
    assert_eq!(
        modes(&client).await,
        ["base", "delta", "delta", "delta", "base"]
    );
    let (_, _, uploaded, reused, up, referenced) = shown(&client).await[1].clone();
    assert_eq!(uploaded, 1, "a delta checkpoint uploads one file");
    assert!(reused > 0 && up * 10 < referenced, "{up} of {referenced}");
    // A dropped view's state: the next checkpoint is a base one.
    client.batch_execute(&round(5)).await.unwrap();
    assert_eq!(checkpoint(&client).await, 6);
    client
        .batch_execute("DROP MATERIALIZED VIEW dropped")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 7);
    client.batch_execute(&round(6)).await.unwrap();
    assert_eq!(checkpoint(&client).await, 8);
    client.batch_execute(&round(7)).await.unwrap();
    assert_eq!(checkpoint(&client).await, 9);
    let all = modes(&client).await;
    assert_eq!(all[5..], ["delta", "base", "delta", "delta"]);
    // Changes after the last checkpoint, replayed from the log.
    client.batch_execute(&round(8)).await.unwrap();
    client.batch_execute("FLUSH").await.unwrap();
    let checks = [
        BY_G,
        (
            "SELECT * FROM odd ORDER BY id",
            "SELECT id, p FROM t WHERE v % 2 = 1 ORDER BY id",
        ),
    ];
    let before = views_equal_their_queries(&client, &checks).await;
    let root = server.dir.path().join("checkpoint-store");
    assert_eq!(manifest(&root, 9).deltas.len(), 2);
    assert_eq!(objects(&root), named(&root, &[8, 9]));
    drop(client);
    let dir = server.stop_and_close().await;

    // Restored from checkpoint 9: its base (7) and two deltas, kept on the local disk; then
    // without the state or the local deltas, every delta downloaded.
    let kept = dir.path().join("checkpoints").join("deltas");
    assert_eq!(std::fs::read_dir(&kept).unwrap().count(), 2);
    let mut dir = dir;
    let mut counts = Vec::new();
    for wipe in [false, true] {
        if wipe {
            std::fs::remove_dir_all(dir.path().join("state")).unwrap();
            std::fs::remove_dir_all(&kept).unwrap();
        }
        let server = TestServer::start_in(dir, configure).await;
        let client = server.connect().await;
        for ((view, _), rows) in checks.iter().zip(&before) {
            assert_eq!(
                &text_rows(&client, view).await,
                rows,
                "{view}, wiped: {wipe}"
            );
        }
        let row = client
            .query_one(
                "SELECT files_reused, files_downloaded FROM weir_catalog.recoveries \
                 ORDER BY started_at DESC LIMIT 1",
                &[],
            )
            .await
            .unwrap();
        counts.push((row.get::<_, i64>(0), row.get::<_, i64>(1)));

        drop(client);
        dir = server.stop_and_close().await;
    }
    // (reused, downloaded): the kept deltas and the base's SSTs reused, then none of them.
    let (kept_reused, kept_downloaded) = counts[0];
    let (wiped_reused, wiped_downloaded) = counts[1];
    assert!(kept_reused >= 2, "{counts:?}");
    assert_eq!(wiped_reused, 0, "{counts:?}");
    assert!(wiped_downloaded >= kept_downloaded + 2, "{counts:?}");
    // And the chain goes on from the restored checkpoint.
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    client.batch_execute(&round(9)).await.unwrap();
    let id = checkpoint(&client).await;
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(
        modes(&client).await.last().map(String::as_str),
        Some("delta")
    );
    assert_eq!(manifest(&root_of(&server), id).deltas.len(), 3);
    views_equal_their_queries(&client, &checks).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_written_ahead_in_parts_restore_exactly() {
    // Every epoch's writes start a part when the one before is written.
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.delta_part_bytes = 1;
        c.streaming_parallelism = 2;
    };
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
             CREATE MATERIALIZED VIEW by_g AS
               SELECT g, count(*) AS n, sum(v) AS s, max(v) AS top FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW top2 AS SELECT g, id, v FROM
               (SELECT g, id, v, row_number() OVER (PARTITION BY g ORDER BY v DESC, id) AS r
                FROM t) AS ranked WHERE r <= 2;
             INSERT INTO t SELECT value, value % 13, value % 101 FROM generate_series(1, 5000);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    // Rounds of several epochs each (FLUSH ends one): inserts, updates of keys written in
    // earlier epochs and parts, deletes.
    for i in 1..=3i64 {
        for step in 0..4i64 {
            let lo = 10_000 * i + 100 * step;
            client
                .batch_execute(&format!(
                    "INSERT INTO t SELECT value, value % 13, value % 7 FROM generate_series({lo}, {hi});
                     UPDATE t SET v = v + {i} WHERE id % 31 = {step};
                     DELETE FROM t WHERE id % 37 = {step} + {i};
                     FLUSH;",
                    hi = lo + 50
                ))
                .await
                .unwrap();
        }
        assert_eq!(checkpoint(&client).await, i + 1);
    }
    assert_eq!(modes(&client).await, ["base", "delta", "delta", "delta"]);
    let root = server.dir.path().join("checkpoint-store");
    let files = manifest(&root, 4).deltas.len();
    assert!(files > 3, "the deltas of 3 checkpoints are {files} files");
    // What the manifests name is all that is kept: the parts went to their names.
    let kept = server.dir.path().join("checkpoints").join("deltas");
    let named_deltas: BTreeSet<String> = manifest(&root, 4)
        .deltas
        .iter()
        .map(|f| f.local.clone())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(on_disk, named_deltas);
    let checks = [
        BY_G,
        (
            "SELECT * FROM top2 ORDER BY g, id",
            "SELECT g, id, v FROM (SELECT g, id, v, row_number() OVER \
               (PARTITION BY g ORDER BY v DESC, id) AS r FROM t) AS ranked \
             WHERE r <= 2 ORDER BY g, id",
        ),
    ];
    let before = views_equal_their_queries(&client, &checks).await;
    drop(client);
    let dir = server.stop_and_close().await;
    // From the store alone: the base and every part downloaded and ingested in order.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    std::fs::remove_dir_all(dir.path().join("checkpoints").join("deltas")).unwrap();
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    for ((view, _), rows) in checks.iter().zip(&before) {
        assert_eq!(&text_rows(&client, view).await, rows, "{view}");
    }
    server.stop().await;
}

fn root_of(server: &TestServer) -> std::path::PathBuf {
    server.dir.path().join("checkpoint-store")
}

/// `weir_catalog.recoveries`, newest first: (checkpoint_id, damaged, records_replayed).
async fn recoveries(client: &tokio_postgres::Client) -> Vec<(Option<i64>, Option<String>, i64)> {
    client
        .query(
            "SELECT checkpoint_id, damaged, records_replayed FROM weir_catalog.recoveries",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_is_skipped_and_none_whole_refuses_to_start() {
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.streaming_parallelism = 2;
    };
    let view = "SELECT * FROM by_g ORDER BY g";
    let query = "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g ORDER BY g";
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
             CREATE MATERIALIZED VIEW by_g AS
               SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g;
             INSERT INTO t SELECT value, value % 7, value % 13 FROM generate_series(1, 3000);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    client
        .batch_execute("INSERT INTO t SELECT value, value % 5, 1 FROM generate_series(3001, 4000)")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 2);
    client
        .batch_execute("DELETE FROM t WHERE id % 3 = 0; FLUSH")
        .await
        .unwrap();
    let expected = text_rows(&client, query).await;
    assert_eq!(text_rows(&client, view).await, expected);
    drop(client);
    let dir = server.stop_and_close().await;

    // Truncate the SST only checkpoint 2 names (its delta): checkpoint 1 is restored and both
    // logs' records after its offsets are replayed.
    let root = dir.path().join("checkpoint-store");
    let first = manifest(&root, 1);
    let second = manifest(&root, 2);
    let only_2 = second
        .objects()
        .find(|f| f.local.ends_with(".sst") && !first.objects().any(|o| o.object == f.object))
        .expect("checkpoint 2 uploaded an SST");
    let path = root.join(&only_2.object);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(only_2.size / 2)
        .unwrap();
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    assert_eq!(text_rows(&client, view).await, expected);
    let recovered = recoveries(&client).await;
    assert_eq!(recovered[0].0, Some(1));
    let damaged = recovered[0].1.clone().unwrap_or_default();
    assert!(
        damaged.contains("00000000000000000002/manifest.json")
            && damaged.contains(&format!("the manifest says {}", only_2.size)),
        "{damaged}"
    );
    assert_eq!(
        recovered[0].2, 2,
        "the insert and the delete after checkpoint 1"
    );
    let statuses = shown(&client).await;
    assert_eq!(statuses[0].0, 2);
    assert!(statuses[0].1.starts_with("damaged: "), "{:?}", statuses[0]);
    // Ids go on past the damaged checkpoint, which is left alone.
    assert_eq!(checkpoint(&client).await, 3);
    assert!(
        path.exists(),
        "a damaged checkpoint's files are not collected"
    );
    drop(client);
    let dir = server.stop_and_close().await;

    // A damaged manifest: checkpoint 1 again.
    let third = root.join(format!("checkpoints/{:020}/manifest.json", 3));
    let mut bytes = std::fs::read(&third).unwrap();
    bytes[10] ^= 0x20;
    std::fs::write(&third, bytes).unwrap();
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    assert_eq!(text_rows(&client, view).await, expected);
    let recovered = recoveries(&client).await;
    assert_eq!(recovered.len(), 3, "one row per start");
    assert_eq!(recovered[0].0, Some(1));
    assert!(recovered[0]
        .1
        .as_deref()
        .unwrap_or_default()
        .contains("00000000000000000003/manifest.json"));
    drop(client);
    let dir = server.stop_and_close().await;

    // Checkpoint 1's SST with other bytes of the same size, and no local copy to reuse: the
    // rebuild finds it, no checkpoint is whole, and the server refuses to start.
    let sst = first
        .files
        .iter()
        .find(|f| f.local.ends_with(".sst"))
        .unwrap();
    let mut bytes = std::fs::read(root.join(&sst.object)).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(root.join(&sst.object), bytes).unwrap();
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let config = weir::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let refused = weir::db::Database::open(config)
        .await
        .err()
        .expect("refused");
    // The logs were truncated below the oldest retained checkpoint, whose state is the only
    // copy of the records before it: no rebuild from the logs either.
    let message = refused.to_string();
    assert!(
        message.contains("no checkpoint in the store can be restored")
            && message.contains(&format!(
                "{} does not have the size and checksum",
                sst.object
            ))
            && message.contains("table 1000's starts at record 1"),
        "{message}"
    );
    for left in ["state", "state.restoring"] {
        assert!(
            !dir.path().join(left).exists(),
            "nothing half restored is left behind: {left}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_whole_checkpoint_whole_logs_rebuild_every_view() {
    let configure = |c: &mut weir::config::Config| c.checkpoint.interval_ms = 0;
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    // A checkpoint before any change: nothing of the log is truncated.
    client
        .batch_execute(
            "CREATE TABLE t (g int, v int);
             CREATE MATERIALIZED VIEW s AS SELECT g, sum(v) AS total FROM t GROUP BY g;",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    client
        .batch_execute("INSERT INTO t VALUES (1, 2), (1, 3), (2, 5); FLUSH")
        .await
        .unwrap();
    drop(client);
    let dir = server.stop_and_close().await;
    let manifest = dir.path().join(format!(
        "checkpoint-store/checkpoints/{:020}/manifest.json",
        1
    ));
    std::fs::write(&manifest, b"{}").unwrap();
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    assert_eq!(
        text_rows(&client, "SELECT * FROM s ORDER BY g").await,
        ["1 5", "2 5"]
    );
    let recovered = recoveries(&client).await;
    assert_eq!(recovered[0].0, None, "rebuilt from the logs");
    assert!(recovered[0]
        .1
        .as_deref()
        .unwrap_or_default()
        .contains("manifest.json"));
    assert_eq!(recovered[0].2, 1, "the whole log: one INSERT");
    server.stop().await;
}

/// The change-log files in a data directory.
fn logs(data: &Path) -> BTreeSet<String> {
    std::fs::read_dir(data.join("tables"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_truncated_below_the_oldest_checkpoint_and_the_store_alone_restores() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.storage = Some(url.clone());
        c.streaming_parallelism = 2;
    };
    let views = [
        (
            "SELECT * FROM totals ORDER BY g",
            "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g ORDER BY g",
        ),
        (
            "SELECT * FROM joined ORDER BY id, k",
            "SELECT t.id, u.k FROM t JOIN u ON t.g = u.k ORDER BY id, k",
        ),
    ];
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
             CREATE TABLE u (k int);
             CREATE MATERIALIZED VIEW totals AS
               SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g;
             CREATE MATERIALIZED VIEW joined AS SELECT t.id, u.k FROM t JOIN u ON t.g = u.k;
             INSERT INTO t SELECT value, value % 4, value * 2 FROM generate_series(1, 100);
             INSERT INTO u VALUES (1), (2);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    client
        .batch_execute("UPDATE t SET v = v + 1 WHERE id <= 10; INSERT INTO u VALUES (3)")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 2);
    // Two retained: checkpoint 1 still needs t's log from record 1 and u's from record 1.
    let (t, u) = (1000, 1001);
    assert_eq!(
        logs(server.dir.path()),
        [format!("{t}.1.log"), format!("{u}.1.log")].into()
    );
    client
        .batch_execute("DELETE FROM t WHERE id % 5 = 0")
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 3);
    assert_eq!(
        logs(server.dir.path()),
        [format!("{t}.2.log"), format!("{u}.2.log")].into()
    );
    let at_checkpoint: Vec<Vec<String>> = {
        client.batch_execute("FLUSH").await.unwrap();
        let mut rows = Vec::new();
        for (view, query) in views {
            let r = text_rows(&client, view).await;
            assert_eq!(r, text_rows(&client, query).await, "{view}");
            rows.push(r);
        }
        rows
    };
    // Acknowledged after the last checkpoint: lost with the disk.
    client
        .batch_execute("INSERT INTO t VALUES (1000, 1, 1); INSERT INTO u VALUES (1)")
        .await
        .unwrap();
    drop(client);
    drop(server.stop_and_close().await);

    // A new machine: an empty data directory, the same store.
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    for ((view, query), rows) in views.iter().zip(&at_checkpoint) {
        assert_eq!(&text_rows(&client, view).await, rows, "{view}");
        assert_eq!(&text_rows(&client, query).await, rows, "{query}");
    }
    let alone: bool = client
        .query_one("SELECT from_store_alone FROM weir_catalog.recoveries", &[])
        .await
        .unwrap()
        .get(0);
    assert!(alone);
    // Keys, updates and deletes work on the restored rows, and records count on.
    let duplicate = client
        .batch_execute("INSERT INTO t VALUES (1, 0, 0)")
        .await
        .unwrap_err();
    assert_eq!(duplicate.code().unwrap().code(), "23505");
    client
        .batch_execute(
            "UPDATE t SET g = 3 WHERE id = 1; DELETE FROM u WHERE k = 2; INSERT INTO u VALUES (4)",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 4);
    let offsets: Vec<u64> = manifest(store.path(), 4)
        .offsets
        .values()
        .copied()
        .collect();
    assert_eq!(
        offsets,
        [4, 4],
        "t: 3 statements at checkpoint 3 and an update; u: 2, a delete and an insert"
    );
    client
        .batch_execute("INSERT INTO t VALUES (2000, 2, 2)")
        .await
        .unwrap();
    drop(client);
    let dir = server.stop_and_close().await;

    // And a restart on the local data from there on.
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    for (view, query) in views {
        assert_eq!(
            text_rows(&client, view).await,
            text_rows(&client, query).await,
            "{view}"
        );
    }
    let total: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        total, 81,
        "80 at the checkpoint, 1 after the second restart"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_that_had_failed_at_a_checkpoint_is_rebuilt_on_restore() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Barriers only when asked for, so that they can be counted.
    let config = common::barriers_on_request_config(dir.path());
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--streaming-parallelism",
        "1",
    ];
    // Table t is relation 1000 and view v's one actor 1001: it fails at its fifth barrier.
    let server =
        ChildServer::start_with_env(&data, &args, &[("WEIR_FAILPOINTS", "actor.1001.barrier@5")])
            .await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (g int, v int);
             CREATE MATERIALIZED VIEW v AS SELECT g, sum(v) AS s FROM t GROUP BY g;
             INSERT INTO t VALUES (1, 1), (2, 2);
             FLUSH;",
        )
        .await
        .unwrap();
    let mut flushes = 0;
    while client.simple_query("SELECT * FROM v").await.is_ok() {
        client
            .batch_execute("INSERT INTO t VALUES (1, 10); FLUSH")
            .await
            .unwrap();
        flushes += 1;
        assert!(flushes < 10, "the failpoint never fired");
    }
    let status = text_rows(&client, "SHOW MATERIALIZED VIEWS").await;
    assert!(status[0].contains("failed: failpoint"), "{status:?}");
    // The checkpoint completes without the failed actor; its manifest says so.
    assert_eq!(checkpoint(&client).await, 1);
    let m = manifest(&data.join("checkpoint-store"), 1);
    assert_eq!(m.failed_actors, [1001]);
    client
        .batch_execute("INSERT INTO t VALUES (3, 3)")
        .await
        .unwrap();
    drop(client);
    server.stop(9).await;

    // Restored, the view is rebuilt from its input, not left with the failed actor's state.
    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    assert_eq!(
        text_rows(&client, "SELECT * FROM v ORDER BY g").await,
        text_rows(
            &client,
            "SELECT g, sum(v) AS s FROM t GROUP BY g ORDER BY g"
        )
        .await
    );
    assert_eq!(
        text_rows(&client, "SELECT * FROM v ORDER BY g").await,
        [
            format!("1 {}", 1 + 10 * flushes),
            "2 2".to_string(),
            "3 3".to_string()
        ]
    );
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_had_failed_at_a_checkpoint_starts_again_with_every_acknowledged_row() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::barriers_on_request_config(dir.path());
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--streaming-parallelism",
        "1",
    ];
    // Table t is relation 1000: its actor fails at its sixth barrier, after checkpoints that
    // truncated its change log.
    let server =
        ChildServer::start_with_env(&data, &args, &[("WEIR_FAILPOINTS", "actor.1000.barrier@6")])
            .await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int);
             CREATE MATERIALIZED VIEW v AS SELECT count(*) AS n, sum(v) AS s FROM t;",
        )
        .await
        .unwrap();
    let mut acknowledged = 0;
    loop {
        let next = acknowledged + 1;
        match client
            .batch_execute(&format!("INSERT INTO t VALUES ({next}, {next})"))
            .await
        {
            Ok(()) => acknowledged = next,
            Err(e) => {
                assert_eq!(e.code().map(|c| c.code()), Some("57P03"), "{e}");
                break;
            }
        }
        // A checkpoint is a barrier: the last one before the failure holds every row but the
        // one just inserted, and the failing one none of it.
        checkpoint(&client).await;
        assert!(acknowledged < 20, "the failpoint never fired");
    }
    // Checkpoints go on while the table is failed; they record where its state ends.
    let id = checkpoint(&client).await;
    let m = manifest(&data.join("checkpoint-store"), id);
    assert!(m.failed_actors.contains(&1000), "{:?}", m.failed_actors);
    assert_eq!(
        m.offsets.get(&1000),
        Some(&(acknowledged as u64 - 1)),
        "the records before the failing barrier's statement"
    );
    drop(client);
    server.stop(9).await;

    // The table starts again from its state and the rest of its log: nothing acknowledged is
    // lost, nothing doubled, and the view is rebuilt over it.
    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    let expected = format!("{acknowledged} {}", acknowledged * (acknowledged + 1) / 2);
    assert_eq!(
        text_rows(&client, "SELECT count(*), sum(v) FROM t").await,
        text_rows(&client, "SELECT * FROM v").await
    );
    assert_eq!(text_rows(&client, "SELECT * FROM v").await, [expected]);
    client
        .batch_execute("INSERT INTO t VALUES (100, 100); FLUSH")
        .await
        .unwrap();
    assert_eq!(
        text_rows(&client, "SELECT n FROM v").await,
        [format!("{}", acknowledged + 1)]
    );
    server.stop(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_logs_restore_what_the_checkpoint_lacks() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.storage = Some(url.clone());
        c.checkpoint.ship_logs_ms = 20;
    };
    let view = "SELECT * FROM s ORDER BY g";
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
             CREATE MATERIALIZED VIEW s AS SELECT g, count(*) AS n, sum(v) AS total FROM t GROUP BY g;
             INSERT INTO t SELECT value, value % 3, value + 1 FROM generate_series(1, 300);",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 1);
    // After the checkpoint: four more records of t's log, 1 to 4.
    client
        .batch_execute(
            "INSERT INTO t VALUES (1000, 0, 7);
             UPDATE t SET v = 0 WHERE id <= 10;
             DELETE FROM t WHERE id % 7 = 0;
             INSERT INTO t VALUES (1001, 5, 5);
             FLUSH",
        )
        .await
        .unwrap();
    let expected = text_rows(&client, view).await;
    // Shipping runs every 20 ms: wait (bounded) until record 4 is in a segment.
    let shipped = |store: &Path| {
        std::fs::read_dir(store.join("logs/1000"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.split_once('-')
                            .and_then(|(_, end)| end.parse::<u64>().ok())
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    for _ in 0..500 {
        if shipped(store.path()) >= 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(shipped(store.path()), 5, "records 0 to 4 shipped");
    drop(client);
    drop(server.stop_and_close().await);

    // A new machine: the checkpoint, then the shipped records after its offset.
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    assert_eq!(text_rows(&client, view).await, expected);
    let replayed: i64 = client
        .query_one("SELECT records_replayed FROM weir_catalog.recoveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(replayed, 4);
    // The primary key holds over shipped rows too.
    let duplicate = client
        .batch_execute("INSERT INTO t VALUES (1001, 0, 0)")
        .await
        .unwrap_err();
    assert_eq!(duplicate.code().unwrap().code(), "23505");
    // Segments every retained checkpoint covers are deleted as checkpoints complete (no
    // record was added since the restore).
    assert_eq!(checkpoint(&client).await, 2);
    assert_eq!(checkpoint(&client).await, 3);
    let left: Vec<String> = std::fs::read_dir(store.path().join("logs/1000"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "both retained checkpoints hold records 0 to 4: {left:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_table_keeps_its_watermark() {
    let configure = |c: &mut weir::config::Config| c.checkpoint.interval_ms = 0;
    let closed = "SELECT window_start, n FROM closed ORDER BY window_start";
    let server = TestServer::start_with(configure).await;
    let client = server.connect().await;
    // The row at 00:26 moves the watermark to 00:21 and closes two windows; deleting it
    // does not move the watermark back.
    client
        .batch_execute(
            "CREATE TABLE readings (at timestamp, v int,
               WATERMARK FOR at AS at - INTERVAL '5 seconds');
             CREATE MATERIALIZED VIEW closed AS
               SELECT window_start, count(*) AS n FROM TUMBLE(readings, at, INTERVAL '10 seconds')
               GROUP BY window_start EMIT ON WINDOW CLOSE;
             INSERT INTO readings VALUES ('2024-01-01 00:00:01', 1), ('2024-01-01 00:00:12', 2);
             INSERT INTO readings VALUES ('2024-01-01 00:00:26', 3);
             DELETE FROM readings WHERE v = 3;
             FLUSH;",
        )
        .await
        .unwrap();
    let before = text_rows(&client, closed).await;
    assert_eq!(before, ["2024-01-01 00:00:00 1", "2024-01-01 00:00:10 1"]);
    assert_eq!(checkpoint(&client).await, 1);
    drop(client);
    let dir = server.stop_and_close().await;
    let m = manifest(&dir.path().join("checkpoint-store"), 1);
    assert_eq!(
        m.watermarks.get(&1000),
        Some(&1_704_067_221_000_000),
        "00:00:21 in microseconds"
    );

    // After the restart a row for the closed window 00:10 is still late, as it would have
    // been without the restart (the restored rows alone would put the watermark at 00:07).
    let server = TestServer::start_in(dir, configure).await;
    let client = server.connect().await;
    client
        .batch_execute(
            "INSERT INTO readings VALUES ('2024-01-01 00:00:15', 4);
             INSERT INTO readings VALUES ('2024-01-01 00:00:45', 5);
             FLUSH;",
        )
        .await
        .unwrap();
    assert_eq!(text_rows(&client, closed).await, before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_takes_the_store_over_stops_the_one_before_from_writing_there() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let configure = |c: &mut weir::config::Config| {
        c.checkpoint.interval_ms = 0;
        c.checkpoint.storage = Some(url.clone());
    };
    let view = (
        "SELECT * FROM totals ORDER BY g",
        "SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g ORDER BY g",
    );
    let first = TestServer::start_with(configure).await;
    let a = first.connect().await;
    a.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, g int, v int);
         CREATE MATERIALIZED VIEW totals AS SELECT g, count(*) AS n, sum(v) AS s FROM t GROUP BY g;
         INSERT INTO t SELECT value, value % 3, value * 2 FROM generate_series(1, 50);",
    )
    .await
    .unwrap();
    assert_eq!(checkpoint(&a).await, 1);
    a.batch_execute("INSERT INTO t VALUES (100, 0, 100)")
        .await
        .unwrap();
    assert_eq!(checkpoint(&a).await, 2);
    a.batch_execute("FLUSH").await.unwrap();
    let at_two = views_equal_their_queries(&a, &[view]).await;

    // A second server on another machine (an empty data directory), the same store: it
    // restores checkpoint 2 from the store alone and takes the store over.
    let second = TestServer::start_with(configure).await;
    let b = second.connect().await;
    assert_eq!(views_equal_their_queries(&b, &[view]).await, at_two);
    let held = objects(store.path());
    assert_eq!(held, named(store.path(), &[1, 2]));

    // The first server goes on serving, but neither writes nor deletes in the store again.
    a.batch_execute("INSERT INTO t VALUES (101, 1, 101)")
        .await
        .unwrap();
    let refused = a.query_one("CHECKPOINT", &[]).await.unwrap_err();
    let db = refused.as_db_error().unwrap();
    assert_eq!(db.code().code(), "55000", "{db:?}");
    assert!(
        db.message().contains(&format!(
            "checkpoint storage {url} was taken over by another server (generation 2: process"
        )) && db
            .message()
            .contains("this server (generation 1) no longer writes or deletes there"),
        "{}",
        db.message()
    );
    let status = shown(&a).await[0].1.clone();
    assert!(status.starts_with("failed: checkpoint storage"), "{status}");
    assert_eq!(
        objects(store.path()),
        held,
        "the first server left the store alone"
    );

    // The second server checkpoints on; its expiry deletes what only 1 and 2 named.
    b.batch_execute("INSERT INTO t VALUES (200, 2, 200)")
        .await
        .unwrap();
    assert_eq!(checkpoint(&b).await, 3);
    assert_eq!(checkpoint(&b).await, 4);
    assert_eq!(objects(store.path()), named(store.path(), &[3, 4]));
    assert!(a.query_one("CHECKPOINT", &[]).await.is_err());
    assert_eq!(objects(store.path()), named(store.path(), &[3, 4]));
    b.batch_execute("FLUSH").await.unwrap();
    let at_four = views_equal_their_queries(&b, &[view]).await;
    drop((a, b));
    first.stop().await;
    second.stop().await;

    // A third machine restores checkpoint 4 from the store alone.
    let third = TestServer::start_with(configure).await;
    let c = third.connect().await;
    assert_eq!(views_equal_their_queries(&c, &[view]).await, at_four);
    assert_eq!(checkpoint(&c).await, 5);
    third.stop().await;
}
