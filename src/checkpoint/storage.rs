//! Where checkpoints go: an object store named by URL (`checkpoint.storage`). A local directory
//! (`file://`) is written with fsync, so that a checkpoint survives a power loss once its
//! manifest is written; S3 and S3-compatible stores (`s3://bucket/prefix`) acknowledge a put
//! only once it is durable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Error, ErrorKind, Result};

#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// The directory behind a `file://` store, whose writes are synced.
    local_root: Option<PathBuf>,
    url: String,
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
        })
    }

    /// A store over any `ObjectStore` (tests wrap one to inject faults).
    pub fn over(store: Arc<dyn ObjectStore>, url: &str) -> Storage {
        Storage {
            store,
            local_root: None,
            url: url.to_string(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes an object whole (atomically: it is never seen half written).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&ObjectPath::from(name), PutPayload::from(bytes))
            .await
            .map_err(|e| store_error(&format!("cannot write {name}"), e))?;
        if let Some(root) = &self.local_root {
            sync_path(&root.join(name))?;
        }
        Ok(())
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

/// Syncs a file and the directory that names it.
fn sync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
