//! The checkpointer against a store that fails or stalls on command: a failed checkpoint
//! leaves the previous one whole, the dataflow never waits for uploads, and what failed
//! checkpoints uploaded is collected once a later one completes.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::Semaphore;

use super::manifest::{Kind, Mode};
use super::storage::Storage;
use super::*;
use crate::clock::ManualClock;
use crate::state::{EpochWrites, StateStore, StateTable};
use crate::stream::Coordinator;

/// An in-memory object store whose puts fail when their name contains `fail_on`, and wait
/// for a permit of `gate` while `gated` is set.
#[derive(Debug)]
struct Faulty {
    inner: InMemory,
    fail_on: Mutex<Option<String>>,
    gated: Mutex<bool>,
    gate: Semaphore,
    /// Puts that reached the store, in order.
    puts: Mutex<Vec<String>>,
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty")
    }
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.puts.lock().unwrap().push(location.to_string());
        let gated = *self.gated.lock().unwrap();
        if gated {
            self.gate.acquire().await.unwrap().forget();
        }
        let fail = self.fail_on.lock().unwrap().clone();
        if fail.is_some_and(|f| location.as_ref().contains(&f)) {
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: "injected failure".into(),
            });
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<StateStore>,
    barriers: BarrierClient,
    faulty: Arc<Faulty>,
    storage: Storage,
    checkpoints: CheckpointClient,
    table: StateTable,
    rows: u64,
    /// The coordinator runs while someone can report to it.
    _events: tokio::sync::mpsc::Sender<crate::stream::ActorEvent>,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open_fresh(&dir.path().join("state")).unwrap();
    let (barriers, events) = Coordinator::start(
        store.clone(),
        Duration::from_secs(3600),
        Arc::new(ManualClock::new(0)),
    );
    barriers.flush().await.unwrap();
    let faulty = Arc::new(Faulty {
        inner: InMemory::new(),
        fail_on: Mutex::new(None),
        gated: Mutex::new(false),
        gate: Semaphore::new(0),
        puts: Mutex::new(Vec::new()),
    });
    let config = CheckpointConfig {
        interval_ms: 0,
        retained: 2,
        ..CheckpointConfig::default()
    };
    let checkpoints = Checkpointer::start(
        config,
        Storage::over(faulty.clone(), "memory://"),
        Found {
            store: &plan::StoreContents::default(),
            restored: None,
            damaged: &[],
        },
        None,
        barriers.clone(),
        dir.path().to_path_buf(),
        Arc::new(std::sync::RwLock::new(
            crate::catalog::Catalog::load(dir.path()).unwrap(),
        )),
        Arc::default(),
        Arc::default(),
    )
    .await
    .unwrap();
    let table = StateTable::new(store.clone(), 7);
    Setup {
        storage: Storage::over(faulty.clone(), "memory://"),
        _dir: dir,
        store,
        barriers,
        faulty,
        checkpoints,
        table,
        rows: 0,
        _events: events,
    }
}

impl Setup {
    /// Commits `n` more rows in the next epoch.
    async fn write(&mut self, n: u64) {
        for i in self.rows..self.rows + n {
            self.table.put(
                i.to_be_bytes().to_vec(),
                format!("row {i}").repeat(20).into_bytes(),
            );
        }
        self.rows += n;
        let mut writes = EpochWrites::default();
        self.table.take_writes(&mut writes);
        let epoch = self.store.sealed_epoch() + 1;
        self.store.commit(epoch, writes).await.unwrap();
    }

    async fn objects(&self) -> BTreeSet<String> {
        self.storage
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    /// Every object the manifests of `ids` name, and the manifests, after checking that each
    /// exists with its size.
    async fn named(&self, ids: &[u64]) -> BTreeSet<String> {
        let sizes: std::collections::BTreeMap<String, u64> =
            self.storage.list("").await.unwrap().into_iter().collect();
        let mut out = BTreeSet::new();
        for id in ids {
            let m =
                Manifest::decode(&self.storage.get(&manifest_object(*id)).await.unwrap()).unwrap();
            for f in m.objects() {
                assert_eq!(sizes.get(&f.object), Some(&f.size), "{}", f.object);
                out.insert(f.object.clone());
            }
            out.insert(manifest_object(*id));
        }
        out
    }

    fn mode(&self, id: u64) -> Option<Mode> {
        let records = self.checkpoints.records();
        records
            .into_iter()
            .find(|r| r.id == id)
            .and_then(|r| r.mode)
    }

    fn status(&self, id: u64) -> String {
        self.checkpoints
            .records()
            .into_iter()
            .find(|r| r.id == id)
            .map(|r| r.status.to_string())
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_checkpoints_leave_the_last_one_whole_and_uploads_never_hold_the_dataflow() {
    let mut s = setup().await;
    s.write(5000).await;
    assert_eq!(
        s.checkpoints
            .trigger(Kind::Manual, None, false)
            .await
            .unwrap()
            .0,
        1
    );
    assert_eq!(s.objects().await, s.named(&[1]).await);

    // A failing upload: the checkpoint fails, and what it uploaded is removed.
    s.write(100).await;
    *s.faulty.fail_on.lock().unwrap() = Some(".sst".into());
    let err = s
        .checkpoints
        .trigger(Kind::Manual, None, false)
        .await
        .unwrap_err();
    assert!(err.message.contains("injected failure"), "{}", err.message);
    assert!(s.status(2).starts_with("failed: "), "{}", s.status(2));
    assert_eq!(s.mode(2), Some(Mode::Delta), "2 would have extended 1");
    assert_eq!(s.objects().await, s.named(&[1]).await);

    // A failed manifest write: every file went up, but the checkpoint does not exist.
    s.write(100).await;
    *s.faulty.fail_on.lock().unwrap() = Some("manifest.json".into());
    assert!(s
        .checkpoints
        .trigger(Kind::Manual, None, false)
        .await
        .is_err());
    assert!(s.storage.get(&manifest_object(3)).await.is_err());
    assert_eq!(
        s.mode(3),
        Some(Mode::Base),
        "2's writes are in no checkpoint: 3 is a base one"
    );
    assert!(
        s.faulty
            .puts
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.ends_with(".sst")),
        "checkpoint 3 uploaded its files before its manifest failed"
    );
    assert_eq!(
        s.objects().await,
        s.named(&[1]).await,
        "and they were removed"
    );
    *s.faulty.fail_on.lock().unwrap() = None;

    // A stalled store: the checkpoint waits, the dataflow does not.
    s.write(100).await;
    *s.faulty.gated.lock().unwrap() = true;
    let puts_before = s.faulty.puts.lock().unwrap().len();
    let checkpoints = s.checkpoints.clone();
    let pending =
        tokio::spawn(async move { checkpoints.trigger(Kind::External, None, false).await });
    while s.faulty.puts.lock().unwrap().len() == puts_before {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..3 {
        s.barriers.flush().await.unwrap();
    }
    assert!(!pending.is_finished(), "the checkpoint is still uploading");
    assert_eq!(s.status(4), "in progress");
    *s.faulty.gated.lock().unwrap() = false;
    s.faulty.gate.add_permits(1000);
    assert_eq!(pending.await.unwrap().unwrap().0, 4);

    // Checkpoints 1 and 4 are retained, and nothing else is in the store.
    assert_eq!(s.objects().await, s.named(&[1, 4]).await);
    let kinds: Vec<(u64, Option<Kind>, String)> = s
        .checkpoints
        .records()
        .into_iter()
        .map(|r| (r.id, r.kind, r.status.to_string()))
        .collect();
    assert_eq!(kinds[0], (4, Some(Kind::External), "completed".to_string()));
    assert_eq!(kinds[3], (1, Some(Kind::Manual), "completed".to_string()));
}
