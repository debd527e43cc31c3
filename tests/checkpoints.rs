//! Checkpoints against a real RocksDB and a real (local) object store: what each uploads and
//! reuses, what expiry deletes, and that the store never holds an object no retained
//! checkpoint names.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::TestServer;
use weir::checkpoint::manifest::Manifest;

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

async fn checkpoint(client: &tokio_postgres::Client) -> i64 {
    client.query_one("CHECKPOINT", &[]).await.unwrap().get("id")
}

/// Every object in the local store, relative to its root.
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
        for f in &m.files {
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

    // A small change: the second checkpoint uploads a small fraction of the first.
    client
        .batch_execute(
            "INSERT INTO t VALUES (-1, 1, 'x'), (-2, 2, 'y'); UPDATE t SET g = 0 WHERE id = 7",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint(&client).await, 2);
    let (_, status, _, reused, small_up, small_ref) = shown(&client).await[0].clone();
    assert_eq!(status, "completed");
    assert!(reused > 0);
    assert!(
        small_up * 20 < bytes_up,
        "second checkpoint uploaded {small_up} of {small_ref} bytes, the first {bytes_up}"
    );
    assert_eq!(objects(&root), named(&root, &[1, 2]));

    // Compaction rewrites every file: the next checkpoint uploads the new ones, and the
    // first checkpoint expires with the files only it named.
    let first_files = named(&root, &[1]);
    server.db.compact_state().await.unwrap();
    assert_eq!(checkpoint(&client).await, 3);
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
