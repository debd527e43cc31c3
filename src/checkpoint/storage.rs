//! Where checkpoints go: an object store named by URL (`checkpoint.storage`). A local directory
//! (`file://`) is written with fsync, so that a checkpoint survives a power loss once its
//! manifest is written; S3 and S3-compatible stores (`s3://bucket/prefix`) acknowledge a put
//! only once it is durable.
//!
//! One server writes to a store at a time. A server takes a store over by writing the next
//! generation object (`generations/<n>.json`, created only if absent); before each write or
//! delete it checks that its generation is still the newest, and once a newer one appears it
//! neither writes nor deletes there again (docs/design/0003-checkpoints.md, "Ownership").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, ErrorKind, Result};

#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// The directory behind a `file://` store, whose writes are synced.
    local_root: Option<PathBuf>,
    url: String,
    /// The generation this server holds, once it has taken the store over; `None` for a
    /// store only read (and for tests of the checkpointer alone).
    claim: Option<Arc<Claim>>,
}

/// Where generation objects live, under the store's root.
const GENERATIONS: &str = "generations";

/// How many times a takeover tries the next generation when another server takes it first.
const TAKEOVER_ATTEMPTS: usize = 16;

/// A server's generation object: who took the store over, and when.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Holder {
    pub generation: u64,
    /// Random, to tell this server's object from another's written under the same number by a
    /// store that ignores `If-None-Match`.
    pub token: String,
    pub pid: u32,
    pub host: String,
    pub data_dir: String,
    pub listen: String,
    pub started_at: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "generation {}: process {} on {}, data directory {}, listening on {}, since {}",
            self.generation, self.pid, self.host, self.data_dir, self.listen, self.started_at
        )
    }
}

impl Holder {
    /// This process, about to take a store over from `data_dir`, listening on `listen`.
    pub fn this_process(data_dir: &Path, listen: &str) -> Holder {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "an unknown host".into());
        Holder {
            generation: 0,
            token: crate::checkpoint::random_id(),
            pid: std::process::id(),
            host,
            data_dir: data_dir.display().to_string(),
            listen: listen.to_string(),
            started_at: crate::clock::wall().to_rfc3339(),
        }
    }
}

struct Claim {
    generation: u64,
    /// Set once a newer generation is seen, so that the takeover is logged once.
    superseded: AtomicBool,
}

fn generation_object(generation: u64) -> String {
    format!("{GENERATIONS}/{generation:020}.json")
}

fn store_error(what: &str, e: object_store::Error) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("checkpoint storage: {what}: {e}"),
    )
}

impl Storage {
    /// Opens the store at `url`: `file:///absolute/path` (created if missing) or
    /// `s3://bucket/prefix`, configured by the usual `AWS_*` environment variables and then by
    /// `s3` (keys as object_store names them: `endpoint`, `region`, `access_key_id`,
    /// `secret_access_key`, `allow_http`, `virtual_hosted_style_request`, ...).
    pub fn open(url: &str, s3: &BTreeMap<String, String>) -> Result<Storage> {
        if let Some(path) = url.strip_prefix("file://") {
            return Storage::open_local(url, path);
        }
        if url.starts_with("s3://") {
            return Storage::open_s3(url, s3);
        }
        Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("checkpoint storage \"{url}\": the URL must start with file:// or s3://"),
        ))
    }

    fn open_local(url: &str, path: &str) -> Result<Storage> {
        if !path.starts_with('/') {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("checkpoint storage \"{url}\": a file:// URL needs an absolute path"),
            ));
        }
        std::fs::create_dir_all(path)?;
        let store = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| store_error("cannot open the directory", e))?;
        Ok(Storage {
            store: Arc::new(store),
            local_root: Some(PathBuf::from(path)),
            url: url.to_string(),
            claim: None,
        })
    }

    fn open_s3(url: &str, options: &BTreeMap<String, String>) -> Result<Storage> {
        let invalid = |why: String| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("checkpoint storage \"{url}\": {why}"),
            )
        };
        let rest = &url["s3://".len()..];
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("the URL names no bucket".into()));
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        for (key, value) in options {
            let key: AmazonS3ConfigKey = key
                .parse()
                .map_err(|_| invalid(format!("unknown S3 option \"{key}\"")))?;
            builder = builder.with_config(key, value);
        }
        let store = builder
            .build()
            .map_err(|e| invalid(format!("cannot configure S3: {e}")))?;
        let prefix = prefix.trim_end_matches('/');
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(store)
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        };
        Ok(Storage {
            store,
            local_root: None,
            url: url.to_string(),
            claim: None,
        })
    }

    /// A store over any `ObjectStore` (tests wrap one to inject faults).
    pub fn over(store: Arc<dyn ObjectStore>, url: &str) -> Storage {
        Storage {
            store,
            local_root: None,
            url: url.to_string(),
            claim: None,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Takes the store over for `holder`: writes the generation after the newest, created
    /// only if no other server created it first (then the next one is tried), and deletes the
    /// older generations. From here on, a newer generation stops this `Storage` (and its
    /// clones) from writing and deleting. Returns the generation taken.
    pub async fn take_over(&mut self, mut holder: Holder) -> Result<u64> {
        for _ in 0..TAKEOVER_ATTEMPTS {
            let newest = self.generations().await?.last().copied().unwrap_or(0);
            holder.generation = newest + 1;
            let name = generation_object(holder.generation);
            let body = serde_json::to_vec_pretty(&holder)
                .map_err(|e| Error::internal(format!("encoding a generation: {e}")))?;
            let create = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            let put = self
                .store
                .put_opts(&ObjectPath::from(name.as_str()), body.into(), create)
                .await;
            match put {
                Ok(_) => {}
                Err(object_store::Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(store_error(&format!("cannot write {name}"), e)),
            }
            if let Some(root) = &self.local_root {
                sync_path(&root.join(&name))?;
            }
            // A store that ignores `If-None-Match` lets a racing server overwrite it.
            match self.holder(holder.generation).await? {
                Some(h) if h.token == holder.token => {}
                _ => continue,
            }
            for older in self.generations().await? {
                if older < holder.generation {
                    self.delete(&generation_object(older)).await?;
                }
            }
            self.claim = Some(Arc::new(Claim {
                generation: holder.generation,
                superseded: AtomicBool::new(false),
            }));
            tracing::info!("took checkpoint storage {} over ({holder})", self.url);
            return Ok(holder.generation);
        }
        Err(Error::unavailable(format!(
            "checkpoint storage {}: other servers took {TAKEOVER_ATTEMPTS} generations while \
             this one was taking it over",
            self.url
        )))
    }

    /// The generations in the store, in order.
    async fn generations(&self) -> Result<Vec<u64>> {
        let mut numbers: Vec<u64> = self
            .list(GENERATIONS)
            .await?
            .iter()
            .filter_map(|(name, _)| {
                let file = name.strip_prefix(GENERATIONS)?.strip_prefix('/')?;
                file.strip_suffix(".json")?.parse().ok()
            })
            .collect();
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// Generation `generation`'s holder, if its object is there and reads.
    async fn holder(&self, generation: u64) -> Result<Option<Holder>> {
        let name = generation_object(generation);
        match self.store.get(&ObjectPath::from(name.as_str())).await {
            Ok(got) => {
                let bytes = got
                    .bytes()
                    .await
                    .map_err(|e| store_error(&format!("cannot read {name}"), e))?;
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_error(&format!("cannot read {name}"), e)),
        }
    }

    /// Whether this server may still write and delete here: it has taken the store over and
    /// its generation is still the newest (or it never took it over, and only reads).
    pub async fn check_owner(&self) -> Result<()> {
        let Some(claim) = &self.claim else {
            return Ok(());
        };
        let newest = self.generations().await?.last().copied();
        if newest == Some(claim.generation) {
            return Ok(());
        }
        let what = match newest {
            Some(n) if n > claim.generation => {
                let by = match self.holder(n).await {
                    Ok(Some(h)) => h.to_string(),
                    _ => format!("generation {n}"),
                };
                format!("was taken over by another server ({by})")
            }
            _ => "lost this server's generation object".to_string(),
        };
        let e = Error::new(
            ErrorKind::ObjectNotInPrerequisiteState,
            format!(
                "checkpoint storage {} {what}: this server (generation {}) no longer writes or \
                 deletes there",
                self.url, claim.generation
            ),
        )
        .with_hint(
            "Stop this server, or give it a checkpoint storage of its own; restart it to take \
             the store back.",
        );
        if !claim.superseded.swap(true, Ordering::Relaxed) {
            tracing::error!("{}", e.message);
        }
        Err(e)
    }

    /// Writes an object whole (atomically: it is never seen half written).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        self.check_owner().await?;
        crate::failpoint::io("checkpoint.put")?;
        self.store
            .put(&ObjectPath::from(name), PutPayload::from(bytes))
            .await
            .map_err(|e| store_error(&format!("cannot write {name}"), e))?;
        if let Some(root) = &self.local_root {
            sync_path(&root.join(name))?;
        }
        Ok(())
    }

    /// Writes the file at `path` as object `name` (atomically, like `put`), read a part at a
    /// time so that a large file is never whole in memory: in one put up to `PART_BYTES`,
    /// as a multipart upload above. Returns the size and CRC32 of what was written.
    pub async fn put_file(&self, name: &str, path: &Path) -> Result<(u64, u32)> {
        let mut file = tokio::fs::File::open(path).await.map_err(|e| {
            Error::io(
                &e,
                format!("cannot read checkpoint file {}: {e}", path.display()),
            )
        })?;
        let size = file.metadata().await?.len();
        let mut crc = crc32fast::Hasher::new();
        if size <= PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).await?;
            crc.update(&bytes);
            let size = bytes.len() as u64;
            self.put(name, Bytes::from(bytes)).await?;
            return Ok((size, crc.finalize()));
        }
        self.check_owner().await?;
        crate::failpoint::io("checkpoint.put")?;
        let cannot = |e| store_error(&format!("cannot write {name}"), e);
        let upload = self
            .store
            .put_multipart(&ObjectPath::from(name))
            .await
            .map_err(cannot)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buffer = vec![0u8; 1 << 20];
        let mut written = 0u64;
        let sent: Result<()> = async {
            loop {
                let n = file.read(&mut buffer).await?;
                if n == 0 {
                    return Ok(());
                }
                crc.update(&buffer[..n]);
                written += n as u64;
                // At most two parts in flight: memory stays a few parts, whatever the size.
                writer.wait_for_capacity(2).await.map_err(cannot)?;
                writer.write(&buffer[..n]);
            }
        }
        .await;
        if let Err(e) = sent {
            let _ = writer.abort().await;
            return Err(e);
        }
        writer.finish().await.map_err(cannot)?;
        if let Some(root) = &self.local_root {
            sync_path(&root.join(name))?;
        }
        Ok((written, crc.finalize()))
    }

    /// Reads object `name` into the file at `path` (created or replaced, and synced), a part
    /// at a time. Returns the size and CRC32 of what was written.
    pub async fn get_to_file(&self, name: &str, path: &Path) -> Result<(u64, u32)> {
        let cannot = |e| store_error(&format!("cannot read {name}"), e);
        let mut parts = self
            .store
            .get(&ObjectPath::from(name))
            .await
            .map_err(cannot)?
            .into_stream();
        let mut file = tokio::fs::File::create(path).await.map_err(|e| {
            Error::io(
                &e,
                format!("cannot write restored file {}: {e}", path.display()),
            )
        })?;
        let (mut size, mut crc) = (0u64, crc32fast::Hasher::new());
        while let Some(part) = parts.try_next().await.map_err(cannot)? {
            crc.update(&part);
            size += part.len() as u64;
            file.write_all(&part).await?;
        }
        file.sync_all().await?;
        Ok((size, crc.finalize()))
    }

    pub async fn get(&self, name: &str) -> Result<Bytes> {
        let got = self
            .store
            .get(&ObjectPath::from(name))
            .await
            .map_err(|e| store_error(&format!("cannot read {name}"), e))?;
        got.bytes()
            .await
            .map_err(|e| store_error(&format!("cannot read {name}"), e))
    }

    /// Deletes an object; one that is already gone is not an error.
    pub async fn delete(&self, name: &str) -> Result<()> {
        self.check_owner().await?;
        match self.store.delete(&ObjectPath::from(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(&format!("cannot delete {name}"), e)),
        }
    }

    /// Every object under `prefix`, with its size, in name order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let mut out: Vec<(String, u64)> = self
            .store
            .list(Some(&ObjectPath::from(prefix)))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .map_err(|e| store_error(&format!("cannot list {prefix}"), e))?;
        out.sort();
        Ok(out)
    }
}

/// The size of a part when a file is uploaded in parts (S3 takes parts of at least 5 MiB).
const PART_BYTES: usize = 8 << 20;

/// Syncs a file and the directory that names it.
fn sync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files go up and come down a part at a time, whole and with their checksum: in one put
    /// when small, as a multipart upload when larger than a part.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn files_go_up_and_come_down_a_part_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        std::fs::create_dir(&root).unwrap();
        let url = format!("file://{}", root.display());
        let storage = Storage::open(&url, &BTreeMap::new()).unwrap();
        for (name, size) in [("small", 1000), ("large", 2 * PART_BYTES + 12345)] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let local = dir.path().join(name);
            std::fs::write(&local, &bytes).unwrap();
            let object = format!("shared/{name}.sst");
            let sent = storage.put_file(&object, &local).await.unwrap();
            assert_eq!(sent, (size as u64, crc32fast::hash(&bytes)), "{name}");
            assert_eq!(std::fs::read(root.join(&object)).unwrap(), bytes, "{name}");
            let back = dir.path().join(format!("{name}.back"));
            let got = storage.get_to_file(&object, &back).await.unwrap();
            assert_eq!(got, sent, "{name}");
            assert_eq!(std::fs::read(&back).unwrap(), bytes, "{name}");
        }
    }
}
