//! Restoring a checkpoint (`docs/design/0004-recovery.md`): telling the store's whole
//! checkpoints from damaged ones, rebuilding RocksDB's directory from one in a fresh
//! directory, putting that directory in place, and the history of recoveries.

use std::collections::BTreeMap;
use std::path::Path;

use super::ledger::FileRef;
use super::manifest::Manifest;
use super::plan::StoreContents;
use super::storage::Storage;
use crate::error::{Error, ErrorKind, Result};
use crate::failpoint;

/// A checkpoint that cannot be restored, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Damaged {
    /// The manifest's object name.
    pub manifest: String,
    pub reason: String,
}

/// What rebuilding a directory took.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    pub files_reused: u64,
    pub files_downloaded: u64,
    pub bytes_downloaded: u64,
}

fn corrupt(what: String) -> Error {
    Error::new(ErrorKind::DataCorruption, what)
}

/// Reads what the store holds, once per start: every object's name and size, and every
/// manifest (`plan::StoreContents`).
pub async fn read_store(storage: &Storage) -> Result<StoreContents> {
    let objects: BTreeMap<String, u64> = storage.list("").await?.into_iter().collect();
    let mut manifests = Vec::new();
    for name in StoreContents::manifest_names(&objects) {
        let bytes = storage.get(&name).await?;
        let decoded = Manifest::decode(&bytes);
        manifests.push((name, decoded));
    }
    Ok(StoreContents { objects, manifests })
}

/// Builds `target` (which must not exist) as the RocksDB directory of `manifest`: each file is
/// hard-linked from `previous` (the directory a crash left behind) when one of its name has
/// the recorded size and checksum, and downloaded and checked otherwise. Every file and the
/// directory are synced before this returns.
pub async fn rebuild(
    storage: &Storage,
    manifest: &Manifest,
    previous: &Path,
    target: &Path,
) -> Result<Rebuilt> {
    std::fs::create_dir_all(target)?;
    let mut done = Rebuilt::default();
    for file in &manifest.files {
        place(storage, manifest, file, previous, target, &mut done).await?;
    }
    std::fs::File::open(target)?.sync_all()?;
    Ok(done)
}

/// The deltas of `manifest`, oldest first, as files in `target` (created) to ingest over its
/// base: each is hard-linked from the copy in `kept` (the data directory's deltas) when that
/// has the recorded size and checksum, and downloaded and checked otherwise.
pub async fn fetch_deltas(
    storage: &Storage,
    manifest: &Manifest,
    kept: &Path,
    target: &Path,
    done: &mut Rebuilt,
) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(target)?;
    let mut paths = Vec::new();
    for file in &manifest.deltas {
        paths.push(place(storage, manifest, file, kept, target, done).await?);
    }
    Ok(paths)
}

/// Puts `file` of `manifest` into `target` under its local name: hard-linked (or copied) from
/// `local_dir` when a file there has the recorded size and checksum, downloaded and checked
/// otherwise. Returns its path.
async fn place(
    storage: &Storage,
    manifest: &Manifest,
    file: &FileRef,
    local_dir: &Path,
    target: &Path,
    done: &mut Rebuilt,
) -> Result<std::path::PathBuf> {
    if file.local.contains('/') || file.local.starts_with('.') {
        return Err(corrupt(format!(
            "checkpoint {}: file name \"{}\" is not a plain name",
            manifest.id, file.local
        )));
    }
    let local = local_dir.join(&file.local);
    let path = target.join(&file.local);
    if local_matches(&local, file).await? {
        // The local file can go in between (a running store's compaction): then it is
        // downloaded.
        let (from, to) = (local.clone(), path.clone());
        let linked = tokio::task::spawn_blocking(move || {
            std::fs::hard_link(&from, &to).is_ok() || std::fs::copy(&from, &to).is_ok()
        })
        .await
        .map_err(|e| Error::internal(format!("linking a local file: {e}")))?;
        if linked {
            done.files_reused += 1;
            return Ok(path);
        }
    }
    done.bytes_downloaded += download(storage, manifest, file, &path).await?;
    done.files_downloaded += 1;
    failpoint::hit("recovery.during_download");
    Ok(path)
}

/// Downloads `file` of `manifest` to `path` after checking its size and checksum, and syncs
/// it; returns its size.
async fn download(
    storage: &Storage,
    manifest: &Manifest,
    file: &FileRef,
    path: &Path,
) -> Result<u64> {
    // A part at a time: an SST can be larger than memory.
    let (len, crc32) = storage.get_to_file(&file.object, path).await?;
    if len != file.size || crc32 != file.crc32 {
        let _ = std::fs::remove_file(path);
        return Err(corrupt(format!(
            "checkpoint {}: {} does not have the size and checksum its manifest records",
            manifest.id, file.object
        )));
    }
    Ok(len)
}

/// Whether `path` exists with the size and checksum `file` records.
async fn local_matches(path: &Path, file: &FileRef) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == file.size => {}
        _ => return Ok(false),
    }
    let path = path.to_path_buf();
    // A part at a time: an SST can be larger than memory.
    let crc = tokio::task::spawn_blocking(move || -> std::io::Result<u32> {
        let mut f = std::fs::File::open(path)?;
        let (mut crc, mut buffer) = (crc32fast::Hasher::new(), vec![0u8; 1 << 20]);
        loop {
            match std::io::Read::read(&mut f, &mut buffer)? {
                0 => return Ok(crc.finalize()),
                n => crc.update(&buffer[..n]),
            }
        }
    })
    .await
    .map_err(|e| Error::internal(format!("checking a local file: {e}")))??;
    Ok(crc == file.crc32)
}

/// Puts the rebuilt directory `restored` in the place of `state`: `state` becomes
/// `<state>.old`, `restored` becomes `state` (each rename atomic), and the old one is
/// deleted. A crash in between leaves either the old directory or the new one whole in place.
pub fn install(restored: &Path, state: &Path) -> Result<()> {
    failpoint::hit("recovery.before_swap");
    let old = state.with_extension("old");
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    if state.exists() {
        std::fs::rename(state, &old)?;
        failpoint::hit("recovery.between_renames");
    }
    std::fs::rename(restored, state)?;
    if let Some(parent) = state.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    failpoint::hit("recovery.after_swap");
    Ok(())
}

/// One start of the server: what it restored and how long that took
/// (`weir_catalog.recoveries`).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Recovery {
    pub started_at_ms: i64,
    /// The checkpoint restored; `None`: every view was rebuilt from the tables' logs.
    pub checkpoint_id: Option<u64>,
    pub epoch: Option<u64>,
    /// Checkpoints that could not be restored.
    pub damaged: Vec<Damaged>,
    /// No local data: the catalog came from the checkpoint, and the tables' logs started
    /// empty at its offsets.
    #[serde(default)]
    pub from_store_alone: bool,
    pub files_reused: u64,
    pub files_downloaded: u64,
    pub bytes_downloaded: u64,
    /// Change-log records fed to the dataflow after the checkpoint's offsets.
    pub records_replayed: u64,
    /// Finding the checkpoint and rebuilding RocksDB's directory.
    pub restore_ms: u64,
    /// Replaying the logs and starting every view, until the server listens.
    pub replay_ms: u64,
    pub total_ms: u64,
    /// When this start began, on the monotonic clock (not kept).
    #[serde(skip)]
    began: Option<tokio::time::Instant>,
}

impl Recovery {
    /// A start beginning now.
    pub fn begin() -> Recovery {
        Recovery {
            started_at_ms: crate::clock::wall_ms(),
            began: Some(crate::clock::monotonic()),
            ..Default::default()
        }
    }

    /// Milliseconds since the start began.
    pub fn elapsed_ms(&self) -> u64 {
        self.began
            .map(|b| b.elapsed().as_millis() as u64)
            .unwrap_or_default()
    }
}

/// How many recoveries `<data>/recoveries.json` keeps.
const RECOVERIES_MAX: usize = 100;

fn recoveries_path(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("recoveries.json")
}

/// The recoveries recorded in `data_dir`, oldest first; an unreadable record is dropped
/// with a warning (it is history, not state).
pub fn recoveries(data_dir: &Path) -> Vec<Recovery> {
    let path = recoveries_path(data_dir);
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        tracing::warn!("{} is not readable, starting it again: {e}", path.display());
        Vec::new()
    })
}

/// Appends `recovery` to the history in `data_dir`, keeping the newest ones.
pub fn record_recovery(data_dir: &Path, recovery: &Recovery) -> Result<Vec<Recovery>> {
    let mut all = recoveries(data_dir);
    all.push(recovery.clone());
    let excess = all.len().saturating_sub(RECOVERIES_MAX);
    all.drain(..excess);
    let path = recoveries_path(data_dir);
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec_pretty(&all)
        .map_err(|e| Error::internal(format!("encoding the recoveries: {e}")))?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &path)?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use object_store::memory::InMemory;

    use super::*;

    fn file(object: &str, local: &str, bytes: &[u8]) -> FileRef {
        FileRef {
            object: object.into(),
            local: local.into(),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }

    async fn put(storage: &Storage, name: &str, bytes: &[u8]) {
        storage
            .put(name, Bytes::copy_from_slice(bytes))
            .await
            .unwrap();
    }

    async fn put_manifest(storage: &Storage, m: &Manifest) {
        let name = format!("checkpoints/{:020}/manifest.json", m.id);
        put(storage, &name, &m.encode().unwrap()).await;
    }

    fn store() -> Storage {
        Storage::over(Arc::new(InMemory::new()), "memory://")
    }

    #[tokio::test]
    async fn the_store_is_read_whole_in_one_listing() {
        let s = store();
        let a = file("shared/r-000001.sst", "000001.sst", b"first");
        put(&s, &a.object, b"first").await;
        put_manifest(&s, &Manifest::for_tests(1, vec![a.clone()])).await;
        let mut bytes = Manifest::for_tests(2, vec![a.clone()]).encode().unwrap();
        bytes[5] ^= 1;
        put(&s, &format!("checkpoints/{:020}/manifest.json", 2), &bytes).await;
        let read = read_store(&s).await.unwrap();
        assert_eq!(read.objects.get(&a.object), Some(&5));
        assert_eq!(read.manifests.len(), 2);
        assert_eq!(read.manifests[0].1.as_ref().map(|m| m.id), Ok(1));
        let damaged = &read.manifests[1].1.as_ref().unwrap_err().message;
        assert!(damaged.contains("damaged checkpoint manifest"), "{damaged}");
        let plan = super::super::plan::recovery_plan(&read).unwrap();
        assert_eq!(
            plan.candidates.iter().map(|m| m.id).collect::<Vec<_>>(),
            [1]
        );
    }

    #[tokio::test]
    async fn a_rebuild_reuses_matching_local_files_and_downloads_the_rest() {
        let s = store();
        let same = file("shared/r-000007.sst", "000007.sst", b"kept locally");
        let other = file("shared/r-000008.sst", "000008.sst", b"uploaded bytes");
        let absent = file("checkpoints/1/MANIFEST-000005", "MANIFEST-000005", b"m");
        for (f, bytes) in [
            (&same, &b"kept locally"[..]),
            (&other, b"uploaded bytes"),
            (&absent, b"m"),
        ] {
            put(&s, &f.object, bytes).await;
        }
        let m = Manifest::for_tests(1, vec![same.clone(), other.clone(), absent.clone()]);
        let dir = tempfile::tempdir().unwrap();
        let previous = dir.path().join("state");
        std::fs::create_dir_all(&previous).unwrap();
        std::fs::write(previous.join("000007.sst"), b"kept locally").unwrap();
        // The same name and size with other bytes (a file number reused after a restore):
        // not reused.
        std::fs::write(previous.join("000008.sst"), b"other contents").unwrap();
        let target = dir.path().join("state.restoring");
        let done = rebuild(&s, &m, &previous, &target).await.unwrap();
        assert_eq!(
            done,
            Rebuilt {
                files_reused: 1,
                files_downloaded: 2,
                bytes_downloaded: (b"uploaded bytes".len() + 1) as u64,
            }
        );
        assert_eq!(
            std::fs::read(target.join("000008.sst")).unwrap(),
            b"uploaded bytes"
        );
        assert_eq!(
            std::fs::read(target.join("000007.sst")).unwrap(),
            b"kept locally"
        );

        install(&target, &previous).unwrap();
        assert!(!target.exists());
        assert!(!dir.path().join("state.old").exists());
        assert_eq!(
            std::fs::read(previous.join("000008.sst")).unwrap(),
            b"uploaded bytes"
        );
    }

    #[tokio::test]
    async fn a_damaged_object_stops_the_rebuild() {
        let s = store();
        let f = file("shared/r-000009.sst", "000009.sst", b"good bytes");
        put(&s, &f.object, b"bad! bytes").await;
        let dir = tempfile::tempdir().unwrap();
        let err = rebuild(
            &s,
            &Manifest::for_tests(3, vec![f]),
            &dir.path().join("state"),
            &dir.path().join("restoring"),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::DataCorruption);
        assert!(err.to_string().contains("shared/r-000009.sst"), "{err}");
        // A name that would leave the directory is refused before anything is read.
        let evil = file("shared/x", "../escape", b"x");
        let err = rebuild(
            &s,
            &Manifest::for_tests(4, vec![evil]),
            &dir.path().join("state"),
            &dir.path().join("restoring2"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("not a plain name"), "{err}");
    }
}
